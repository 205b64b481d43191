"""Flow control of the STOMP gateway's output, against a real ``dodwan daemon --stomp``.

A client that reads gets everything, however much waits for it at once (a queue's backlog,
a browse, one message larger than the write window); a client that stops reading is
disconnected once its output has stayed unread for ``stomp_write_timeout``, and what it was
not sent goes back to its queue. The clients read on sockets with a small receive buffer,
so the kernel holds little of a burst and most of it waits in the daemon.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator

import pytest
from stomp_raw import RawStomp
from test_daemon_helpers import DaemonProc, random_group, wait_for

from joms.stomp.frame import Frame, FrameParser, encode

WINDOW = 1 << 20
"""The daemon's stomp_write_window: the bursts below are several times larger."""
TIMEOUT = 1.0
"""The daemon's stomp_write_timeout (seconds)."""
N = 1000
SIZE = 5000
"""N messages of SIZE bytes: about five write windows."""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    tmp = tmp_path_factory.mktemp("flow")
    d = DaemonProc(tmp / "f", ["--group", random_group(), "--stomp", "127.0.0.1:0",
                               "--stomp-write-window", str(WINDOW),
                               "--stomp-write-timeout", str(TIMEOUT)])  # fmt: skip
    d.start()
    yield d
    d.kill()
    text = d.log.read_text()
    assert "Traceback" not in text, text


def stomp_port(d: DaemonProc) -> int:
    return int(str(json.loads((d.state_dir / "admin.json").read_text())["stomp"]).rsplit(":")[1])


def slow_disconnects(d: DaemonProc) -> int:
    return int(d.status()["counters"].get("daemon_stomp_slow_disconnects", 0))


class Reader:
    """A STOMP 1.2 client on a socket with a 64 KiB receive buffer; reads only when told."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self.parser = FrameParser()
        self.frames: list[Frame] = []
        self.send("CONNECT", {"accept-version": "1.2", "host": "localhost"})
        f = self.recv()
        assert f is not None and f.command == "CONNECTED", f

    def send(self, cmd: str, headers: dict[str, str]) -> None:
        self.sock.sendall(encode(Frame(cmd, headers)))

    def recv(self, timeout: float = 30.0, chunk: int = 1 << 20, why: str = "") -> Frame | None:
        """The next frame; None once the daemon closed the connection. Fails the test after
        ``timeout`` seconds without a frame (saying ``why`` it was awaited)."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no frame within {timeout} s{why}")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(chunk)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.frames += self.parser.feed(data)
        return self.frames.pop(0)

    def close(self) -> None:
        self.sock.close()


def fill(port: int, dest: str, n: int = N, size: int = SIZE) -> None:
    """Send ``n`` persistent messages of ``size`` bytes to ``dest`` (body: its number on six
    digits, then filler; property ``n``), each with a receipt; return once all came back."""
    p = RawStomp(port)
    frames = [
        encode(
            Frame(
                "SEND",
                {
                    "destination": dest,
                    "content-type": "text/plain",
                    "n": str(i),
                    "receipt": f"r{i}",
                },
                b"%06d" % i + b"y" * (size - 6),
            )
        )
        for i in range(n)
    ]
    p.sock.sendall(b"".join(frames))
    got = p.until(lambda f: f[0] != "RECEIPT" or f[1]["receipt-id"] == f"r{n - 1}", 60)
    assert [f[0] for f in got] == ["RECEIPT"] * n, got[-1]
    p.close()


def browse(port: int, queue: str, selector: str | None = None) -> list[bytes]:
    """The bodies a ``browser:true`` subscription shows of ``queue``, up to ``browser:end``."""
    r = Reader(port)
    headers = {"id": "b", "destination": queue, "browser": "true"}
    if selector:
        headers["selector"] = selector
    r.send("SUBSCRIBE", headers)
    bodies: list[bytes] = []
    while True:
        f = r.recv()
        assert f is not None, f"browser cut off after {len(bodies)} messages"
        assert f.command == "MESSAGE", (f.command, f.headers)
        if f.headers.get("browser") == "end":
            r.close()
            return bodies
        bodies.append(f.body)


def test_a_reading_consumer_gets_a_queue_backlog_many_times_its_window(daemon) -> None:
    # (the daemon cut such a consumer off as "slow" after the first window, and the ack:auto
    # messages written into its discarded output were gone from the queue)
    port = stomp_port(daemon)
    before = slow_disconnects(daemon)
    fill(port, "/queue/backlog")
    r = Reader(port)
    r.send("SUBSCRIBE", {"id": "1", "destination": "/queue/backlog", "ack": "auto"})
    got: set[bytes] = set()
    while len(got) < N:
        f = r.recv()
        assert f is not None, f"cut off after {len(got)} of {N} messages"
        assert f.command == "MESSAGE", (f.command, f.headers)
        got.add(f.body[:6])
    r.close()
    assert slow_disconnects(daemon) == before


@pytest.mark.parametrize("kind", ["topic", "queue"])
def test_a_message_larger_than_the_window_reaches_a_reading_client(daemon, kind: str) -> None:
    port = stomp_port(daemon)
    before = slow_disconnects(daemon)
    dest = f"/{kind}/big"
    body = os.urandom(12 * WINDOW)
    r = Reader(port)
    r.send("SUBSCRIBE", {"id": "1", "destination": dest, "receipt": "s"})
    f = r.recv()
    assert f is not None and f.command == "RECEIPT", f
    p = RawStomp(port)
    p.send("SEND", {"destination": dest, "content-type": "application/octet-stream",
                    "receipt": "b"}, body)  # fmt: skip
    assert p.recv(30)[0] == "RECEIPT"
    p.close()
    f = r.recv()
    assert f is not None, "cut off before the big message"
    assert f.command == "MESSAGE" and f.body == body, (f.command, f.headers, len(f.body))
    r.close()
    assert slow_disconnects(daemon) == before


def test_a_browser_gets_a_queue_many_times_its_window(daemon) -> None:
    port = stomp_port(daemon)
    fill(port, "/queue/browsed")
    wait_for(lambda: browse(port, "/queue/browsed", f"n = '{N - 1}'"), what="the last message")
    bodies = browse(port, "/queue/browsed")
    assert sorted(b[:6] for b in bodies) == [b"%06d" % i for i in range(N)]


def test_a_slow_reader_is_not_cut_off_while_it_drains(daemon) -> None:
    # reading a little at a time, it takes several stomp_write_timeouts to read it all
    port = stomp_port(daemon)
    before = slow_disconnects(daemon)
    fill(port, "/queue/slow")
    r = Reader(port)
    r.send("SUBSCRIBE", {"id": "1", "destination": "/queue/slow", "ack": "auto"})
    got: set[bytes] = set()
    t0 = time.monotonic()
    while len(got) < N:
        time.sleep(0.05)  # (pacing: a reader slower than the daemon, not a wait)
        data = r.sock.recv(64 * 1024)
        assert data, f"cut off after {len(got)} of {N} messages"
        got.update(f.body[:6] for f in r.parser.feed(data) if f.command == "MESSAGE")
    assert time.monotonic() - t0 > 2 * TIMEOUT
    r.close()
    assert slow_disconnects(daemon) == before


def test_a_client_that_stops_reading_is_cut_off_after_the_timeout_losing_nothing(
    daemon,
) -> None:
    port = stomp_port(daemon)
    before = slow_disconnects(daemon)
    fill(port, "/queue/stalled")
    r = Reader(port)
    r.send("SUBSCRIBE", {"id": "1", "destination": "/queue/stalled", "ack": "auto"})
    f = r.recv()
    assert f is not None and f.command == "MESSAGE"
    t0 = time.monotonic()
    wait_for(lambda: slow_disconnects(daemon) > before, 30, what="the stalled client cut off")
    waited = time.monotonic() - t0
    # what the kernel held for it still arrives; what the daemon held goes back to the queue
    first = {f.body[:6]}
    while (f := r.recv()) is not None:
        first.add(f.body[:6])
    r.close()
    assert len(first) < N
    r2 = Reader(port)
    r2.send("SUBSCRIBE", {"id": "1", "destination": "/queue/stalled", "ack": "auto"})
    second: set[bytes] = set()
    while len(first | second) < N:
        f = r2.recv(15, why=f": {N - len(first | second)} of {N} messages missing")
        assert f is not None, "cut off"
        second.add(f.body[:6])
        assert not first & second, f"{sorted(first & second)[:5]} delivered twice"
    r2.close()
    assert waited >= TIMEOUT * 0.9, f"cut off after {waited:.2f} s"
    assert "stomp_write_timeout" in daemon.log.read_text()
