"""The daemon's receive path does not fragment the C heap (glibc only).

Before the fix each datagram was read with ``recvfrom(65535)``: a 64 KB buffer shrunk in
place to the datagram's size. The node keeps many received fragments for a while (cache,
reassembly, the store's fragment LRU), each then pinning the rest of a 64 KB span that the
next 64 KB buffer could not reuse, so the heap grew although the memory in use did not
(the soak's RSS rose ~3 MB a minute, all of it free-but-held heap, see docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket

import pytest
from test_daemon_helpers import random_group

from dodwan.daemon.memdebug import mallinfo
from dodwan.daemon.transport import UdpTransport, medium_for

pytestmark = pytest.mark.skipif(not mallinfo(), reason="needs glibc's mallinfo2")


async def _receive_keeping_some(n: int, kept: int) -> tuple[int, int]:
    rnd = random.Random(4)
    transport = UdpTransport(medium_for(random_group(), "lo"), buffer_size=1 << 20)
    held: collections.deque[bytes] = collections.deque(maxlen=kept)
    got = 0
    wake = asyncio.Event()

    def on_datagram(data: bytes, addr: object) -> None:
        nonlocal got
        got += 1
        if rnd.random() < 0.3:  # like fragments the node keeps, the rest is dropped
            held.append(data)

    await transport.start(on_datagram, wake.set)
    host, port = transport.medium.group, transport.medium.port
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    try:
        before = mallinfo()
        sent = 0
        while sent < n:
            for _ in range(64):
                out.sendto(rnd.randbytes(rnd.randrange(60, 1400)), (host, port))
                sent += 1
            wake.clear()
            await asyncio.wait_for(wake.wait(), 5.0)
        after = mallinfo()
    finally:
        out.close()
        transport.close()
    assert got > n * 0.9 and len(held) == kept
    return before["arena"], after["arena"]


def test_received_datagrams_do_not_grow_the_heap_beyond_what_they_hold() -> None:
    kept = 3000  # ~2 MB of datagrams held at the end
    before, after = asyncio.run(_receive_keeping_some(60_000, kept))
    # recvfrom(65535) grew the heap by ~10 MB here; exact-size copies by ~2 MB.
    assert after - before < 5 << 20, (before, after)
