"""Run loopback JOMS hosts in a background thread, for the examples' ``--demo`` mode."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from joms.runtime import LoopbackHost, start_hosts


@contextmanager
def loopback_hosts(count: int, prefix: str = "demo") -> Iterator[list[LoopbackHost]]:
    """``count`` in-process hosts that hear each other over UDP on 127.0.0.1."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result(15)

    hosts = call(start_hosts(count, prefix=prefix))
    try:
        yield hosts
    finally:
        for h in hosts:
            call(h.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
