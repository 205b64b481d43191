"""Test support for JOMS: run loopback hosts on an asyncio loop in a background thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from joms.runtime import HostConfig, LoopbackHost


class LoopThread:
    """An asyncio loop in a daemon thread; ``call(coro)`` runs a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        async def wrap() -> Any:
            return fn()

        return self.call(wrap(), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def start_hosts(
    lt: LoopThread, count: int, state_root: Path | None = None, prefix: str = "h", **kw: Any
) -> list[LoopbackHost]:
    hosts = []
    for i in range(count):
        hid = f"{prefix}{i + 1}"
        sd = state_root / hid if state_root is not None else None
        hosts.append(lt.call(LoopbackHost(HostConfig(hid, state_dir=sd, **kw)).start()))
    mesh(lt, hosts)
    return hosts


def mesh(lt: LoopThread, hosts: list[LoopbackHost]) -> None:
    def wire() -> None:
        for h in hosts:
            h.peers = [o.udp_address for o in hosts if o is not h]

    lt.run(wire)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``cond`` until true or the deadline (for state with no event to await)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()
