"""Delivery to local subscriptions through their index (subscriptions by one plain-string
constraint): the same subscriptions, in the same order, as testing every one of them."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dodwan import Node, NodeConfig
from dodwan.core import MessageDelivered
from dodwan.core.patterns import Profile

_NAMES = ["kind", "dest", "type"]
_VALUES = ["a", "b", "a.b", "q@h1"]
_REGEXES = ["a", "b", r"a\.b", "a|b", "[ab]", ".*", r"q@h1", "[^@]+@h1"]

_pattern = st.dictionaries(st.sampled_from(_NAMES), st.sampled_from(_REGEXES), min_size=1)
_action = st.one_of(
    st.tuples(st.just("subscribe"), st.integers(0, 4), st.lists(_pattern, min_size=1, max_size=3)),
    st.tuples(st.just("unsubscribe"), st.integers(0, 4), st.just([])),
    st.tuples(
        st.just("publish"),
        st.just(0),
        st.lists(st.dictionaries(st.sampled_from(_NAMES), st.sampled_from(_VALUES))),
    ),
)


def _delivered(node: Node) -> list[tuple[str, str]]:
    out = []
    while (ev := node.next_event()) is not None:
        if isinstance(ev, MessageDelivered):
            out.append((ev.subscription, ev.descriptor["id"]))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_action, max_size=14))
def test_indexed_delivery_matches_testing_every_subscription(actions: list) -> None:
    node = Node(NodeConfig(host_id="h1"), rng=random.Random(1))
    subs: dict[str, Profile] = {}  # what the node should hold, in its order
    now = 1.0
    for kind, which, arg in actions:
        now += 1.0
        key = f"k{which}"
        if kind == "subscribe":
            node.subscribe(arg, now, key=key)
            subs[key] = Profile.from_patterns(arg)  # a replaced key keeps its place
            _delivered(node)  # (cached messages it matches: not what this test is about)
        elif kind == "unsubscribe":
            if key in subs:
                node.unsubscribe(key, now)
                del subs[key]
        else:
            for attrs in arg:
                msg_id = node.publish(attrs, b"x", now + 100, now)
                want = [(k, msg_id) for k, p in subs.items() if p.matches(attrs)]
                assert _delivered(node) == want, (attrs, {k: p.specs() for k, p in subs.items()})


def test_a_message_named_by_two_constraints_is_delivered_once_per_subscription() -> None:
    node = Node(NodeConfig(host_id="h1"), rng=random.Random(1))
    node.subscribe([{"kind": "a"}, {"dest": "b"}], 1.0, key="both")
    node.subscribe({"kind": "a|b"}, 1.0, key="regex")
    node.subscribe({"dest": "b", "kind": "a"}, 1.0, key="and")
    msg_id = node.publish({"kind": "a", "dest": "b"}, b"x", 100.0, 2.0)
    assert _delivered(node) == [("both", msg_id), ("regex", msg_id), ("and", msg_id)]
    node.unsubscribe("regex", 3.0)
    msg_id = node.publish({"kind": "b", "dest": "b"}, b"x", 100.0, 3.0)
    assert _delivered(node) == [("both", msg_id)]


def test_a_replaced_subscription_is_indexed_by_its_new_patterns() -> None:
    node = Node(NodeConfig(host_id="h1"), rng=random.Random(1))
    node.subscribe({"kind": "a"}, 1.0, key="k")
    first = node.publish({"kind": "a"}, b"x", 100.0, 2.0)
    assert _delivered(node) == [("k", first)]
    node.subscribe({"kind": "b"}, 3.0, key="k")  # same key, same number of subscriptions
    later_b = node.publish({"kind": "b"}, b"x", 100.0, 4.0)
    later_a = node.publish({"kind": "a"}, b"x", 100.0, 4.0)
    assert _delivered(node) == [("k", later_b)] and later_a
