"""A minimal raw STOMP 1.2 client for tests that must act the moment a frame arrives."""

from __future__ import annotations

import socket
import time

import pytest
from test_daemon_helpers import DaemonProc, wait_for

from joms.stomp.frame import Frame as StompFrame
from joms.stomp.frame import FrameParser, encode

Frame = tuple[str, dict[str, str], bytes]


class RawStomp:
    """A minimal STOMP 1.2 client: frames written as given, frames read one at a time (the
    project's frame codec, as ``joms_support.RawStomp``; frames as (command, headers, body))."""

    def __init__(self, port: int, client_id: str | None = None, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.parser = FrameParser()
        self.frames: list[Frame] = []
        headers = {"accept-version": "1.2", "host": "localhost"}
        if client_id:
            headers["client-id"] = client_id
        self.send("CONNECT", headers)
        cmd, h, _ = self.recv()
        assert cmd == "CONNECTED", (cmd, h)

    def send(self, cmd: str, headers: dict[str, str], body: str | bytes = b"") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.sock.sendall(encode(StompFrame(cmd, dict(headers), data)))

    def recv(self, timeout: float = 10.0) -> Frame:
        """The next frame; ConnectionError when the server closed, TimeoutError after
        ``timeout`` seconds without one."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no frame") from None
            if not data:
                raise ConnectionError("closed by the server")
            self.frames += [(f.command, dict(f.headers), f.body) for f in self.parser.feed(data)]
        return self.frames.pop(0)

    def until(self, pred, timeout: float = 10.0) -> list[Frame]:  # type: ignore[no-untyped-def]
        """Frames up to and including the first one ``pred`` accepts (fails the test after
        ``timeout`` seconds without it)."""
        deadline = time.monotonic() + timeout
        out: list[Frame] = []
        while True:
            left = deadline - time.monotonic()
            try:
                frame = self.recv(max(0.01, left))
            except TimeoutError:
                pytest.fail(f"no awaited frame within {timeout} s; got {out!r}")
            out.append(frame)
            if pred(frame):
                return out

    def close(self) -> None:
        self.sock.close()


def stomp_up(port: int) -> bool:
    RawStomp(port, timeout=2).close()
    return True


def restart(d: DaemonProc, port: int) -> None:
    d.start()
    wait_for(lambda: stomp_up(port), what="STOMP gateway after the restart")
