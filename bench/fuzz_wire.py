"""Fuzz the wire decoder and a node's reception of hostile datagrams.

Usage: python bench/fuzz_wire.py [--seconds 60] [--no-atheris]

Targets (the first input byte picks one): ``wire.decode`` may raise only ``WireError``;
``Node.receive_datagram`` must raise nothing at all, count no internal error, and keep its
reassembly memory and cache within their limits. Seeds are real datagrams of a small
exchange (announce, catalog, request, fragments). See bench/fuzz_common.py.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from fuzz_common import Finding, run

from dodwan.core import Node, NodeConfig, wire
from dodwan.core.errors import WireError
from dodwan.core.limits import Limits

LIMITS = Limits(max_partial_bytes=1 << 20)
CAPACITY = 4 << 20


def seeds() -> list[bytes]:
    """Datagrams two nodes exchange for one message (all four kinds)."""
    a = Node(NodeConfig(host_id="a", max_datagram=600), rng=random.Random(1))
    b = Node(NodeConfig(host_id="b", max_datagram=600), rng=random.Random(2))
    b.subscribe([{"topic": "x.*"}, {"topic": "y", "lang": "en|fr"}], now=0.0)
    a.publish({"topic": "x1"}, random.Random(3).randbytes(3000), deadline=5e5, now=0.0)
    out: list[bytes] = []
    now = 0.0
    for _ in range(200):
        now += 0.5
        for src, dst in ((a, b), (b, a)):
            src.handle_timer(now)
            for data, _ in src.datagrams_to_send(now):
                out.append(data)
                dst.receive_datagram(data, src.config.host_id, now)
    return out


_node = Node(
    NodeConfig(host_id="victim", cache_capacity=CAPACITY, limits=LIMITS), rng=random.Random(5)
)
_node.subscribe({"topic": ".*"}, now=0.0)
_now = [1.0]


def target(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        with contextlib.suppress(WireError):
            wire.decode(data[1:], LIMITS)
        return
    _now[0] += 0.01
    _node.receive_datagram(data[1:], "peer", _now[0])  # anything escaping is a finding
    _node.handle_timer(_now[0])
    _node.datagrams_to_send(_now[0])
    while _node.next_event() is not None:
        pass
    if _node.counters.get("internal_errors", 0):
        raise Finding("internal error counted")
    usage = _node.cache_usage()
    if usage["bytes"] > usage["capacity"]:
        raise Finding(f"cache over capacity: {usage}")


if __name__ == "__main__":
    prefixed = [bytes([k]) + s for s in seeds() for k in (0, 1)]
    run("wire", target, prefixed, ["dodwan.core"])
