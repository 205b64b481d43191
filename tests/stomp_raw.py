"""A minimal raw STOMP 1.2 client for tests that must act the moment a frame arrives."""

from __future__ import annotations

import socket
import time

import pytest
from test_daemon_helpers import DaemonProc, wait_for

Frame = tuple[str, dict[str, str], bytes]


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c").replace("\r", "\\r")


def _unesc(s: str) -> str:
    return s.replace("\\c", ":").replace("\\n", "\n").replace("\\r", "\r").replace("\\\\", "\\")


class RawStomp:
    """A minimal STOMP 1.2 client: frames written as given, frames read one at a time."""

    def __init__(self, port: int, client_id: str | None = None, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        headers = {"accept-version": "1.2", "host": "localhost"}
        if client_id:
            headers["client-id"] = client_id
        self.send("CONNECT", headers)
        cmd, h, _ = self.recv()
        assert cmd == "CONNECTED", (cmd, h)

    def send(self, cmd: str, headers: dict[str, str], body: str | bytes = b"") -> None:
        data = body.encode() if isinstance(body, str) else body
        lines = [cmd, *(f"{_esc(k)}:{_esc(v)}" for k, v in headers.items())]
        if data:
            lines.append(f"content-length:{len(data)}")
        self.sock.sendall(("\n".join(lines) + "\n\n").encode() + data + b"\0")

    def _parse(self) -> Frame | None:
        self.buf = self.buf.lstrip(b"\r\n")
        end = self.buf.find(b"\n\n")
        if end < 0:
            return None
        head = self.buf[:end].decode().split("\n")
        headers: dict[str, str] = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            headers.setdefault(_unesc(k), _unesc(v))
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(self.buf) < end + 2 + n + 1:
                return None
            body, self.buf = self.buf[end + 2 : end + 2 + n], self.buf[end + 3 + n :]
        else:
            nul = self.buf.find(b"\0", end + 2)
            if nul < 0:
                return None
            body, self.buf = self.buf[end + 2 : nul], self.buf[nul + 1 :]
        return head[0], headers, body

    def recv(self, timeout: float = 10.0) -> Frame:
        """The next frame; ConnectionError when the server closed, TimeoutError after
        ``timeout`` seconds without one."""
        deadline = time.monotonic() + timeout
        while (frame := self._parse()) is None:
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
            self.buf += data
        return frame

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
