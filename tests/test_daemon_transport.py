"""The UDP transport on loopback: own datagrams dropped in the kernel, batched sends."""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import socket
from collections.abc import Callable
from typing import Any

import pytest
from test_daemon_helpers import random_group

from dodwan.daemon import netkey as nk
from dodwan.daemon.transport import (
    GSO_MAX_SEGMENTS,
    Medium,
    UdpTransport,
    gso_groups,
    medium_for,
)


def _foreign_sender() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    return s


def _plain_receiver(medium: Medium) -> socket.socket:
    """A non-blocking member of the group on loopback, with no GRO: one datagram per read."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind((medium.group, medium.port))
    mreq = socket.inet_aton(medium.group) + socket.inet_aton("127.0.0.1")
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    rx.setblocking(False)
    return rx


class _Until:
    """A datagram callback that keeps what it hears and is done once it hears ``last``."""

    def __init__(self, last: bytes) -> None:
        self.last = last
        self.got: list[bytes] = []
        self.done = asyncio.Event()

    def __call__(self, data: bytes, addr: object) -> None:
        self.got.append(data)
        if data == self.last:
            self.done.set()


def test_own_datagrams_are_dropped_before_python_sees_them() -> None:
    async def main() -> tuple[UdpTransport, list[bytes]]:
        medium = medium_for(random_group(), "lo")
        t = UdpTransport(medium)
        on = _Until(b"theirs-end")
        await t.start(on)
        t.send_many([b"mine-%d" % i for i in range(50)])
        with _foreign_sender() as other:
            for d in (b"theirs-1", b"theirs-end"):
                other.sendto(d, (medium.group, medium.port))
            await asyncio.wait_for(on.done.wait(), 10)
        t.close()
        return t, on.got

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

    def sendmsg(self, buffers: list[bytes], anc: list[Any], flags: int, dest: object) -> int:
        if self.room <= 0:
            raise BlockingIOError
        self.room -= 1
        return self._sock.sendmsg(buffers, anc, flags, dest)  # type: ignore[arg-type]


class _NoOffload(_FillsUp):
    """A system without UDP segmentation offload."""

    def sendmsg(self, buffers: list[bytes], anc: list[Any], flags: int, dest: object) -> int:
        raise OSError(errno.EIO, "Input/output error")


class _NotYetUsable(_FillsUp):
    """A socket whose address cannot be used yet (an IPv6 address still tentative right after
    its link came up): every send fails with EADDRNOTAVAIL while ``failing``."""

    failing = True
    offloaded = 0

    def sendto(self, data: bytes, dest: object) -> int:
        if self.failing:
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        return super().sendto(data, dest)

    def sendmsg(self, buffers: list[bytes], anc: list[Any], flags: int, dest: object) -> int:
        if self.failing:
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        self.offloaded += 1
        return super().sendmsg(buffers, anc, flags, dest)


def test_send_many_keeps_order_when_the_socket_buffer_fills() -> None:
    count = 3000

    async def main() -> tuple[list[bytes], int, bool]:
        medium = medium_for(random_group(), "lo")
        rx = _plain_receiver(medium)
        t = UdpTransport(medium)
        await t.start(lambda d, a: None)
        assert t._tx_sock is not None and t._tx is not None
        fills = _FillsUp(t._tx_sock, room=10)  # send calls (a call may carry 64 datagrams)
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


def test_gso_groups_are_equal_sized_runs_within_the_caps() -> None:
    d = [b"a" * 100] * 3 + [b"b" * 40] + [b"c" * 100] * 2 + [b"d" * 200]
    assert gso_groups(d) == [(0, 4), (4, 6), (6, 7)]  # a shorter one ends a run
    assert gso_groups([b"x" * 10] * 150) == [(0, 64), (64, 128), (128, 150)]
    big = [b"y" * 1400] * 60
    groups = gso_groups(big)
    assert all(sum(len(x) for x in big[a:b]) <= 65000 for a, b in groups)
    assert [b - a for a, b in groups] == [46, 14]
    assert gso_groups([]) == []
    assert GSO_MAX_SEGMENTS == 64


def _receive_all(
    fake: type[_FillsUp] | None,
    datagrams: list[bytes],
    early: list[bytes] | None = None,
    then: Callable[[_FillsUp], None] | None = None,
) -> tuple[list[bytes], UdpTransport, _FillsUp | None]:
    """Send ``early`` (not waited for), call ``then`` on the fake socket, send ``datagrams``
    and read them back on loopback."""

    async def main() -> tuple[list[bytes], UdpTransport, _FillsUp | None]:
        medium = medium_for(random_group(), "lo")
        rx = _plain_receiver(medium)
        t = UdpTransport(medium)
        await t.start(lambda d, a: None)
        sock = None
        if fake is not None:
            assert t._tx_sock is not None
            sock = fake(t._tx_sock, room=10**9)
            t._tx_sock = sock  # type: ignore[assignment]
        if early:
            t.send_many(early)
        if then is not None and sock is not None:
            then(sock)
        t.send_many(datagrams)
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        while len(got) < len(datagrams):
            try:
                got.append(await asyncio.wait_for(loop.sock_recv(rx, 65535), 10))
            except TimeoutError:
                break
        t.close()
        rx.close()
        return got, t, sock

    return asyncio.run(main())


def test_offloaded_runs_arrive_as_the_same_datagrams() -> None:
    rnd = random.Random(4)
    sizes = [1400] * 100 + [600] + [1400] * 10 + [77]
    datagrams = [rnd.randbytes(n) for n in sizes]
    got, t, _ = _receive_all(None, datagrams)
    assert t.offload and t.offload_error is None
    assert got == datagrams


def test_a_system_without_offload_falls_back_to_one_datagram_per_call() -> None:
    datagrams = [bytes([i]) * 1000 for i in range(30)]
    got, t, _ = _receive_all(_NoOffload, datagrams)
    assert not t.offload and t.offload_error == "Input/output error"
    assert got == datagrams and t.send_errors == 0


def test_a_passing_send_error_does_not_turn_offload_off() -> None:
    def usable(sock: _FillsUp) -> None:
        assert isinstance(sock, _NotYetUsable)
        sock.failing = False

    later = [bytes([i]) * 1000 for i in range(20)]
    # the early ones are lost, and counted: the address is not usable yet
    got, t, sock = _receive_all(_NotYetUsable, later, early=[b"early" * 200] * 5, then=usable)
    assert t.send_errors == 5
    assert t.offload and t.offload_error is None
    assert isinstance(sock, _NotYetUsable) and sock.offloaded == 1  # later: one offloaded call
    assert got == later


def test_failed_sends_are_logged_once_a_period_not_only_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A medium whose every send failed (an IPv6 group on an interface that cannot carry
    it) showed it only in ``udp_send_errors``: the daemon looked up and met nobody. The
    first failure is a warning naming the group, the interface and the error; later ones
    within the period only count."""
    caplog.set_level(logging.WARNING, logger="dodwan.daemon.transport")

    def usable(sock: _FillsUp) -> None:
        assert isinstance(sock, _NotYetUsable)
        sock.failing = False

    later = [bytes([i]) * 100 for i in range(3)]
    got, t, _ = _receive_all(_NotYetUsable, later, early=[b"early" * 200] * 5, then=usable)
    assert got == later and t.send_errors == 5
    warned = [r.getMessage() for r in caplog.records if r.name == "dodwan.daemon.transport"]
    assert len(warned) == 1, warned
    assert "cannot send on 239.255." in warned[0] and "via lo" in warned[0], warned
    assert "Cannot assign requested address" in warned[0], warned


@pytest.mark.parametrize("keyed", [False, True])
def test_a_daemon_transport_reads_coalesced_runs_as_separate_datagrams(keyed: bool) -> None:
    rnd = random.Random(6)
    datagrams = [rnd.randbytes(1200) for _ in range(200)] + [b"last"]

    async def main() -> tuple[list[bytes], UdpTransport]:
        medium = medium_for(random_group(), "lo")
        key = nk.generate_key()
        sender = UdpTransport(medium, netkey=nk.NetKey(key) if keyed else None)
        receiver = UdpTransport(medium, netkey=nk.NetKey(key) if keyed else None)
        on = _Until(b"last")
        await receiver.start(on)
        await sender.start(lambda d, a: None)
        sender.send_many(datagrams)
        await asyncio.wait_for(on.done.wait(), 10)
        sender.close()
        receiver.close()
        return on.got, receiver

    got, receiver = asyncio.run(main())
    assert receiver.gro and receiver.coalesced > 0  # Linux: runs arrive in one read
    assert got == datagrams
