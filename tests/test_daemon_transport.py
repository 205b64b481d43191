"""The UDP transport on loopback: own datagrams dropped in the kernel, batched sends."""

from __future__ import annotations

import asyncio
import random
import socket

from dodwan.daemon.transport import UdpTransport, medium_for


def _group() -> str:
    rnd = random.SystemRandom()
    return f"239.255.{rnd.randrange(1, 255)}.{rnd.randrange(1, 255)}:{rnd.randrange(20000, 60000)}"


def _foreign_sender() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    return s


def test_own_datagrams_are_dropped_before_python_sees_them() -> None:
    async def main() -> tuple[UdpTransport, list[bytes]]:
        medium = medium_for(_group(), "lo")
        t = UdpTransport(medium)
        heard: list[bytes] = []
        done = asyncio.Event()

        def on(data: bytes, addr: object) -> None:
            heard.append(data)
            if data == b"theirs-end":
                done.set()

        await t.start(on)
        t.send_many([b"mine-%d" % i for i in range(50)])
        with _foreign_sender() as other:
            for d in (b"theirs-1", b"theirs-end"):
                other.sendto(d, (medium.group, medium.port))
            await asyncio.wait_for(done.wait(), 10)
        t.close()
        return t, heard

    t, heard = asyncio.run(main())
    assert t.own_filtered_in_kernel  # Linux accepts the filter
    assert heard == [b"theirs-1", b"theirs-end"]  # the 50 own datagrams (sent first) never came
    assert t.own_filtered == 0


class _FillsUp:
    """The sending socket as the transport sees it, refusing (EAGAIN) after ``room`` sends.

    Loopback never fills a UDP send buffer, so the full-buffer case is simulated at the
    socket; the event loop's own writer still sends on the real socket."""

    def __init__(self, sock: socket.socket, room: int) -> None:
        self._sock = sock
        self.room = room

    def sendto(self, data: bytes, dest: object) -> int:
        if self.room <= 0:
            raise BlockingIOError
        self.room -= 1
        return self._sock.sendto(data, dest)  # type: ignore[arg-type]


def test_send_many_keeps_order_when_the_socket_buffer_fills() -> None:
    count = 3000

    async def main() -> tuple[list[bytes], int, bool]:
        medium = medium_for(_group(), "lo")
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        rx.bind((medium.group, medium.port))
        mreq = socket.inet_aton(medium.group) + socket.inet_aton("127.0.0.1")
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
        rx.setblocking(False)
        t = UdpTransport(medium)
        await t.start(lambda d, a: None)
        assert t._tx_sock is not None and t._tx is not None
        fills = _FillsUp(t._tx_sock, room=1000)
        t._tx_sock = fills  # type: ignore[assignment]
        t.send_many([i.to_bytes(4, "big") * 25 for i in range(count // 2)])
        refused = fills.room == 0  # the rest went through the event loop's transport
        fills.room = 10**9
        t.send_many([i.to_bytes(4, "big") * 25 for i in range(count // 2, count)])
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        while len(got) < count:
            try:
                got.append(await asyncio.wait_for(loop.sock_recv(rx, 2000), 10))
            except TimeoutError:
                break
        errors = t.send_errors
        t.close()
        rx.close()
        return got, errors, refused

    got, errors, refused = asyncio.run(main())
    assert refused
    assert errors == 0
    assert [int.from_bytes(d[:4], "big") for d in got] == list(range(count))
