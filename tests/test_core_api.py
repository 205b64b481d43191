"""The local caller's contract: exact public shape, clear errors on misuse, trace records."""

from __future__ import annotations

import random
from typing import Any

import pytest

import dodwan
from dodwan import BROADCAST, MessageDelivered, Node, NodeConfig


def test_public_contract_shape() -> None:
    t = 1000.0
    node = Node(NodeConfig(host_id="a1"), rng=random.Random(1))
    key = node.subscribe({"topic": "news.*", "lang": "en|fr"}, now=t)
    assert isinstance(key, str)
    mid = node.publish({"topic": "news", "lang": "en"}, b"payload", deadline=t + 3600, now=t)
    assert isinstance(mid, str)
    ev = node.next_event()
    assert isinstance(ev, MessageDelivered)
    assert (ev.subscription, ev.descriptor["id"], ev.payload) == (key, mid, b"payload")
    node.unsubscribe(key, now=t)
    assert node.subscriptions() == {}
    timer = node.get_timer()
    assert isinstance(timer, float)
    node.handle_timer(now=timer)
    out = node.datagrams_to_send(now=timer)
    assert out and all(isinstance(d, bytes) and dest == BROADCAST for d, dest in out)
    node.receive_datagram(out[0][0], ("127.0.0.1", 9), now=timer)  # its own: ignored
    assert node.counters["own_datagrams_ignored"] == 1
    assert dodwan.NodeConfig(host_id="x").horizon == 2
    assert dodwan.NodeConfig(host_id="x").altruistic is False


@pytest.mark.parametrize(
    "call",
    [
        lambda n: n.publish({"topic": 3}, b"x", deadline=10, now=0),
        lambda n: n.publish({"topic": "x"}, "not bytes", deadline=10, now=0),
        lambda n: n.publish({"topic": "x"}, b"x", deadline="10", now=0),
        lambda n: n.publish(["topic"], b"x", deadline=10, now=0),
        lambda n: n.subscribe("topic", now=0),
        lambda n: n.subscribe([{"topic": 1}], now=0),
        lambda n: n.publish({"topic": "x"}, b"x", deadline=10, now=0, persistent="yes"),
    ],
)
def test_type_errors(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        call(Node(NodeConfig(host_id="a"), rng=random.Random(0)))


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda n: n.publish({"topic": "x"}, b"x", deadline=0, now=0), "deadline"),
        (lambda n: n.publish({"origin": "me"}, b"x", deadline=10, now=0), "origin"),
        (lambda n: n.publish({"topic": "x"}, b"x", deadline=10, now=0, priority=12), "priority"),
        (lambda n: n.publish({"id": "has space"}, b"x", deadline=10, now=0), "message id"),
        (lambda n: n.subscribe({"topic": "(unclosed"}, now=0), "invalid regular expression"),
        (lambda n: n.subscribe({"topic": "x" * 300}, now=0), "longer than"),
        (lambda n: n.subscribe({}, now=0), "at least one attribute"),
        (lambda n: n.subscribe([], now=0), "at least one pattern"),
        (lambda n: n.subscribe([{"a": str(i)} for i in range(1025)], now=0), "at most"),
        (
            lambda n: n.publish(
                {"k": random.Random(1).randbytes(1500).hex()}, b"x", deadline=10, now=0
            ),
            "bytes per fragment",
        ),
    ],
)
def test_value_errors_say_what_is_wrong(call, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=words):
        call(Node(NodeConfig(host_id="a"), rng=random.Random(0)))


def test_duplicate_id_and_unknown_unsubscribe() -> None:
    n = Node(NodeConfig(host_id="a"), rng=random.Random(0))
    n.publish({"id": "firstMSG"}, b"x", deadline=10, now=0)
    with pytest.raises(ValueError, match="already known"):
        n.publish({"id": "firstMSG"}, b"x", deadline=10, now=0)
    with pytest.raises(KeyError):
        n.unsubscribe("nope", now=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"host_id": ""},
        {"host_id": "has space"},
        {"host_id": "a", "horizon": 0},
        {"host_id": "a", "announce_period": 0},
        {"host_id": "a", "max_datagram": 100},
        {"host_id": "a", "cache_capacity": 0},
    ],
)
def test_bad_config(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        NodeConfig(**kwargs)  # type: ignore[arg-type]


def test_config_fields_are_documented() -> None:
    from dodwan.core.config import field_docs

    docs = field_docs()
    for name in (
        "host_id",
        "horizon",
        "altruistic",
        "announce_period",
        "max_datagram",
        "cache_capacity",
    ):
        assert len(docs[name]) > 20, name


def test_trace_records_carry_the_injected_now() -> None:
    n = Node(NodeConfig(host_id="a", trace=True), rng=random.Random(0))
    n.subscribe({"t": "x"}, now=5.0)
    n.publish({"t": "x"}, b"abc", deadline=100, now=7.5)
    n.handle_timer(now=9.25)
    n.datagrams_to_send(now=9.5)
    recs = n.pop_trace()
    kinds = [(r.kind, r.time) for r in recs]
    assert ("message_created", 7.5) in kinds
    assert ("message_delivered", 7.5) in kinds
    assert ("datagram_sent", 9.5) in kinds
    assert n.pop_trace() == []
    quiet = Node(NodeConfig(host_id="b"), rng=random.Random(0))
    quiet.publish({"t": "x"}, b"abc", deadline=100, now=1)
    assert quiet.pop_trace() == []


def test_get_timer_without_presence_says_when_anything_but_announcing_is_due() -> None:
    node = Node(NodeConfig(host_id="a", beacon_period=1.0, announce_period=5.0), random.Random(3))
    node.handle_timer(now=0.0)
    # alone: the next beacon or announcement comes first; housekeeping after the
    # neighbour timeout (3 x announce_period) is the only other deadline
    assert node.get_timer() is not None and node.get_timer() <= 5.0  # type: ignore[operator]
    assert node.get_timer(presence=False) == 15.0
    node.publish({"topic": "t"}, b"x", deadline=9.0, now=0.5)
    assert node.get_timer(presence=False) == 9.0  # its expiry
    t = node.get_timer()
    assert t is not None and t < 9.0
    while (t := node.get_timer()) is not None and t < 9.0:  # presence only, until then
        node.handle_timer(now=t)
        node.datagrams_to_send(now=t)
        assert node.cache_usage()["messages"] == 1
    node.handle_timer(now=9.0)
    assert node.cache_usage()["messages"] == 0
    after = node.get_timer(presence=False)
    assert after is not None and after > 9.0  # the expiry is no longer due: housekeeping is


def _exchange(trace_datagrams: bool) -> tuple[dict[str, Node], dict[str, list[tuple[Any, ...]]]]:
    """Two nodes in contact for 30 s, b subscribed to what a publishes, every trace record
    kept per host."""
    records: dict[str, list[tuple[Any, ...]]] = {"a": [], "b": []}
    nodes = {
        h: Node(
            NodeConfig(host_id=h),
            rng=random.Random(7),
            trace_sink=lambda *r, h=h: records[h].append(r),
            trace_datagrams=trace_datagrams,
        )
        for h in "ab"
    }
    nodes["b"].subscribe({"topic": "news"}, now=0.0)
    nodes["a"].publish(
        {"topic": "news"}, random.Random(1).randbytes(20_000), deadline=3600, now=0.0
    )
    for step in range(300):
        t = step / 10
        for h, node in nodes.items():
            due = node.get_timer()
            if due is not None and due <= t:
                node.handle_timer(now=t)
            for data, _dest in node.datagrams_to_send(now=t):
                nodes["b" if h == "a" else "a"].receive_datagram(data, h, now=t)
    return nodes, records


def test_datagram_totals_stand_in_for_per_datagram_records_when_asked() -> None:
    traced, with_rows = _exchange(trace_datagrams=True)
    quiet, without = _exchange(trace_datagrams=False)
    assert any(isinstance(e, MessageDelivered) for e in iter(quiet["b"].next_event, None))
    per_datagram = ("datagram_sent", "datagram_received")
    for h in "ab":
        assert not [r for r in without[h] if r[1] in per_datagram]
        # everything else is traced as before, in the same order
        assert without[h] == [r for r in with_rows[h] if r[1] not in per_datagram]
        for kind, direction in (("datagram_sent", "sent"), ("datagram_received", "received")):
            want: dict[str, list[int]] = {}
            for r in with_rows[h]:
                if r[1] == kind:
                    tot = want.setdefault(r[5], [0, 0])
                    tot[0] += 1
                    tot[1] += r[3]
            assert want, (h, kind)  # both hosts sent and received
            for node in (traced[h], quiet[h]):
                assert getattr(node, f"datagrams_{direction}_by_kind") == want
        assert (
            sum(n for n, _ in quiet[h].datagrams_sent_by_kind.values())
            == (quiet[h].counters["datagrams_sent"])
        )


def test_has_output_says_whether_pulling_would_return_anything() -> None:
    node = Node(NodeConfig(host_id="a1", trace=True), rng=random.Random(1))
    assert not node.has_output
    node.handle_timer(now=0.0)  # schedules the first announcement, a little later
    assert not node.has_output and node.datagrams_to_send(now=0.0) == []
    t = node.get_timer()
    assert t is not None
    node.handle_timer(now=t)
    assert node.has_output
    assert node.datagrams_to_send(now=t)
    assert node.has_output  # its trace records are still waiting
    assert node.pop_trace()
    assert not node.has_output
    assert node.datagrams_to_send(now=t) == [] and node.next_event() is None
    node.subscribe({"topic": "news"}, now=t)
    node.datagrams_to_send(now=t)
    node.pop_trace()
    assert not node.has_output
    node.publish({"topic": "news"}, b"x", deadline=t + 100, now=t)  # delivered here
    node.datagrams_to_send(now=t)
    node.pop_trace()
    assert node.has_output  # the delivery event is waiting
    assert isinstance(node.next_event(), MessageDelivered)
    assert not node.has_output


def test_a_descriptor_peers_would_refuse_is_refused_at_publication() -> None:
    # 9,000 'a' compress to a few bytes, but peers check the encoded size against
    # max_descriptor_bytes (8192): the message would be published and never travel
    a = Node(NodeConfig(host_id="a"), rng=random.Random(0))
    with pytest.raises(ValueError, match=r"limits\.max_descriptor_bytes \(8192\)"):
        a.publish({"topic": "a" * 9000}, b"x", deadline=10, now=0)
    assert a.cache_listing() == []
    a.publish({"topic": "a" * 7000}, b"x", deadline=10, now=0)  # under the limit: published
    assert len(a.cache_listing()) == 1
