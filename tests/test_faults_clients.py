"""Slow, idle and greedy clients against a real daemon: every connection and every queue of
undelivered output is bounded in bytes and time, and running out of file descriptors
degrades gracefully.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from test_daemon_helpers import DaemonProc, admin_auth, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.daemon.admin import MAX_HEADER_LINE
from dodwan.daemon.client import AdminClient


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _admin_port(d: DaemonProc) -> int:
    return int(json.loads((d.state_dir / "admin.json").read_text())["port"])


def _stomp_port(d: DaemonProc) -> int:
    return int(str(json.loads((d.state_dir / "admin.json").read_text())["stomp"]).rsplit(":")[1])


def _slow_socket(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def _follow(s: socket.socket, topic: str, d: DaemonProc) -> socket.socket:
    """Open a follow stream of ``topic`` on ``s`` (read up to its first line)."""
    body = json.dumps({"patterns": {"topic": topic}}).encode()
    s.sendall(
        b"POST /follow HTTP/1.1\r\nContent-Type: application/json\r\n"
        + admin_auth(d.state_dir)
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert b"subscribed" in _read_until(s, b"subscribed")
    return s


def _read_until(s: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _closed_by_peer(s: socket.socket, timeout: float) -> bytes:
    """Read everything until the daemon closes the connection; fail after ``timeout``."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        return data + b"<reset>"
    except TimeoutError:
        pytest.fail(f"the daemon kept the connection open for {timeout} s")
    return data


# ---------------------------------------------------------------------- 4. backpressure


@pytest.mark.timeout(180)
def test_stomp_subscriber_that_never_reads_is_disconnected_at_its_byte_window(daemons) -> None:
    d = daemons("s", "--group", random_group(), "--stomp", "127.0.0.1:0",
                "--stomp-write-window", str(1 << 20), "--fragment-cache", "0")  # fmt: skip
    port = _stomp_port(d)
    slow = _slow_socket(port)
    slow.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
    assert _read_until(slow, b"\x00").startswith(b"CONNECTED")
    slow.sendall(b"SUBSCRIBE\nid:0\ndestination:/topic/flood\nack:auto\nreceipt:r\n\n\x00")
    assert b"RECEIPT" in _read_until(slow, b"receipt-id:r")
    assert d.proc is not None
    rss0 = _rss(d.proc.pid)
    body = os.urandom(48 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as prod:
        prod.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert _read_until(prod, b"\x00").startswith(b"CONNECTED")
        frame = (
            b"SEND\ndestination:/topic/flood\ncontent-type:application/octet-stream\n"
            + f"content-length:{len(body)}\n\n".encode()
            + body
            + b"\x00"
        )
        for _ in range(600):  # 28 MiB for a client that reads nothing
            prod.sendall(frame)
        prod.sendall(b"SEND\ndestination:/topic/other\nreceipt:done\n\nx\x00")
        assert b"receipt-id:done" in _read_until(prod, b"receipt-id:done")
    grew = _rss(d.proc.pid) - rss0
    print(f"STOMP: 600 x 48 KiB to a non-reader, RSS grew by {grew / 2**20:.1f} MiB")
    assert grew < 16 * 1024 * 1024, f"RSS grew by {grew} bytes"
    _closed_by_peer(slow, 10)
    slow.close()
    assert d.status()["counters"]["daemon_stomp_slow_disconnects"] == 1
    assert "window" in d.log.read_text()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
        again.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert _read_until(again, b"\x00").startswith(b"CONNECTED")


@pytest.mark.timeout(180)
def test_follow_stream_that_never_reads_is_bounded_in_bytes(daemons) -> None:
    d = daemons("f", "--group", random_group(), "--fragment-cache", "0",
                "--follow-window", str(4 << 20))  # fmt: skip
    port = _admin_port(d)
    slow = _follow(_slow_socket(port), "f", d)
    assert d.proc is not None
    rss0 = _rss(d.proc.pid)
    for _ in range(40):
        d.client().publish_bytes(os.urandom(1 << 20), attributes={"topic": "f"})
    grew = _rss(d.proc.pid) - rss0
    counters = d.status()["counters"]
    print(f"follow: 40 x 1 MiB to a non-reader, RSS grew by {grew / 2**20:.1f} MiB, "
          f"{counters.get('sink_deliveries_follow_dropped')} dropped")  # fmt: skip
    assert counters.get("sink_deliveries_follow_dropped", 0) >= 30, counters
    assert grew < 32 * 1024 * 1024, f"RSS grew by {grew} bytes"
    slow.close()


def test_a_follow_client_that_resets_while_the_daemon_writes_is_no_error(daemons) -> None:
    # A client that never reads fills the socket buffers, so the daemon waits in drain();
    # the client then resets the connection (close with unread data, here forced with
    # SO_LINGER 0). The reset came out of drain() as ConnectionResetError and was logged as
    # "admin request POST /follow failed" with a traceback (seen in CI, in the test above,
    # whenever the daemon saw the reset before teardown). A client going away is normal.
    import struct

    d = daemons("z", "--group", random_group(), "--fragment-cache", "0")
    slow = _follow(_slow_socket(_admin_port(d)), "z", d)
    subscribed = d.status()["subscriptions"]
    for _ in range(6):  # 6 MiB: far more than both sockets' buffers hold
        d.client().publish_bytes(os.urandom(1 << 20), attributes={"topic": "z"})
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    slow.close()  # RST
    # the stream ends and its subscription goes: the daemon has handled the reset
    assert wait_for(lambda: d.status()["subscriptions"] < subscribed, timeout=10)
    log = d.log.read_text()
    assert "POST /follow failed" not in log and "Traceback" not in log, log


# ---------------------------------------------------------------------- 5. idle connections


def test_stomp_connection_without_connect_times_out(daemons) -> None:
    d = daemons("s", "--group", random_group(), "--stomp", "127.0.0.1:0",
                "--stomp-connect-timeout", "1")  # fmt: skip
    with socket.create_connection(("127.0.0.1", _stomp_port(d)), timeout=5) as s:
        t0 = time.monotonic()
        data = _closed_by_peer(s, 5)
        assert time.monotonic() - t0 < 4
    assert data.startswith(b"ERROR") and b"CONNECT" in data


def test_admin_request_whose_body_never_comes_times_out(daemons) -> None:
    d = daemons("a", "--group", random_group(), "--admin-request-timeout", "1")
    port = _admin_port(d)
    auth = admin_auth(d.state_dir)
    for partial in (
        b"POST /publish HTTP/1.1\r\n" + auth + b"Content-Length: 100\r\n\r\n",  # no body
        b"GET /status HTTP/1.1\r\nX-Slow: 1\r\n",  # headers never finished
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(partial)
            t0 = time.monotonic()
            data = _closed_by_peer(s, 5)
            assert time.monotonic() - t0 < 4
        assert data.startswith(b"HTTP/1.1 408"), data


def test_admin_header_count_and_size_are_bounded(daemons) -> None:
    d = daemons("a", "--group", random_group())
    port = _admin_port(d)
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(1000))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /status HTTP/1.1\r\n" + many + b"\r\n")
        data = _closed_by_peer(s, 5)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /status HTTP/1.1\r\nX-Big: " + b"v" * 70000 + b"\r\n\r\n")
        data = _closed_by_peer(s, 5)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]
    assert d.client().get("/status")["host_id"]


def test_admin_header_line_of_8_kib_is_accepted_its_line_end_not_counted(daemons) -> None:
    """docs/admin-api.md: only a line longer than 8 KiB is refused. The CRLF was counted:
    a line of 8191 bytes was refused as "longer than 8192 bytes"."""
    d = daemons("a", "--group", random_group())
    port = _admin_port(d)

    def first_line(line: bytes, end: bytes) -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            auth = admin_auth(d.state_dir).strip()
            s.sendall(b"GET /status HTTP/1.1" + end + auth + end + line + end + end)
            head, _, body = _closed_by_peer(s, 5).partition(b"\r\n\r\n")
        return head.split(b"\r\n")[0], body

    for end in (b"\r\n", b"\n"):
        for size in (MAX_HEADER_LINE - 1, MAX_HEADER_LINE):
            status, body = first_line(b"X: " + b"a" * (size - 3), end)
            assert status == b"HTTP/1.1 200 OK", (size, end, body)
        status, body = first_line(b"X: " + b"a" * (MAX_HEADER_LINE - 2), end)
        assert status.startswith(b"HTTP/1.1 431"), (end, body)
        assert json.loads(body)["error"] == (
            f"request line or header line longer than {MAX_HEADER_LINE} bytes"
        )


@pytest.mark.timeout(120)
def test_fd_exhaustion_pauses_accept_and_retries_dir_writes(daemons, tmp_path: Path) -> None:
    group = random_group()
    fast = ("--announce-period", "0.3", "--admin-request-timeout", "60")
    a = daemons("a", "--group", group, *fast, "--host-id", "A",
                prefix=["prlimit", "--nofile=128:128"])  # fmt: skip
    b = daemons("b", "--group", group, *fast, "--host-id", "B")
    out = tmp_path / "out"
    a.client().post("/subscribe", {"patterns": {"topic": "fd"},
                                    "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
    wait_for(lambda: "A" in b.client().get("/peers"), what="B hears A")
    port = _admin_port(a)
    held: list[socket.socket] = []
    try:
        for _ in range(200):  # more than the daemon's 128 descriptors
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                break
            held.append(s)
        time.sleep(1.0)  # let the daemon accept what it can and hit its limit
        msg_id = b.client().publish_bytes(b"during exhaustion", attributes={"topic": "fd"})["id"]
        wait_for(lambda: a.log.read_text().count("cannot write") >= 1, timeout=30,
                 what="the dir sink failing for lack of descriptors")  # fmt: skip
        time.sleep(3.0)  # an episode lasting seconds
    finally:
        for s in held:
            s.close()
    wait_for(lambda: (out / msg_id).exists(), timeout=30, what="the dir write retried")
    assert (out / msg_id).read_bytes() == b"during exhaustion"
    assert AdminClient.for_state_dir(a.state_dir).get("/status")["host_id"] == "A"
    text = a.log.read_text()
    assert text.count("accept") <= 3, text[-3000:]
    assert len(text) < 20000


# ---------------------------------------------------------------------- 7. STOMP errors


def _stomp_error_for(port: int, frame: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert _read_until(s, b"\x00").startswith(b"CONNECTED")
        s.sendall(frame)
        return _closed_by_peer(s, 5)


def test_stomp_errors_are_readable_and_lengths_ascii(daemons) -> None:
    d = daemons("s", "--group", random_group(), "--stomp", "127.0.0.1:0")
    port = _stomp_port(d)
    err = _stomp_error_for(
        port, "SEND\ndestination:/topic/t\ncontent-length:٥\n\nhello\x00".encode()
    )
    assert err.startswith(b"ERROR") and b"content-length" in err, err
    err = _stomp_error_for(port, b"SEND\ndestination:/topic/t\njoms-types:n:int\nn:abc\n\nx\x00")
    assert err.startswith(b"ERROR"), err
    assert b"invalid literal" not in err and b"'abc' is not a valid int" in err, err
