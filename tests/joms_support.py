"""Test support for JOMS: run loopback hosts on an asyncio loop in a background thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from joms.runtime import HostConfig, LoopbackHost
from joms.stomp.frame import Frame, FrameParser, encode


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


class RawStomp:
    """A bare STOMP client on one socket: the test writes each frame itself (no client
    library smoothing anything over) and reads the gateway's frames as they come."""

    def __init__(
        self,
        address: tuple[str, int],
        version: str = "1.2",
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.parser = FrameParser()
        self.frames: list[Frame] = []
        self.closed = False
        self.version = "1.2"  # (CONNECT headers are never escaped)
        self.send("CONNECT", {"accept-version": version, "host": "h", **(headers or {})})
        self.connected = self.next("CONNECTED")
        self.version = self.connected.headers["version"]
        self.parser.version = self.version

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.sock.sendall(encode(Frame(command, dict(headers or {}), body), version=self.version))

    def _read(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or self.closed:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        self.frames += self.parser.feed(data)
        return True

    def next(self, command: str, timeout: float = 10.0, **headers: str) -> Frame:
        """The first frame received (and not yet taken) with that command and headers;
        AssertionError naming what came instead if none comes in time."""
        deadline = time.monotonic() + timeout
        while True:
            for i, f in enumerate(self.frames):
                if f.command == command and all(f.get(k) == v for k, v in headers.items()):
                    return self.frames.pop(i)
            if not self._read(deadline):
                raise AssertionError(
                    f"no {command} {headers or ''} within {timeout} s (closed={self.closed}); "
                    f"got {[(f.command, f.headers) for f in self.frames]}"
                )

    def receipt(self, rid: str, timeout: float = 10.0) -> Frame:
        return self.next("RECEIPT", timeout, **{"receipt-id": rid})

    def quiet(self, timeout: float = 0.5) -> list[Frame]:
        """Every frame received within ``timeout`` (taken)."""
        deadline = time.monotonic() + timeout
        while self._read(deadline):
            pass
        out, self.frames = self.frames, []
        return out

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawStomp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
