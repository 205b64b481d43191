"""Selector conformance through the service: typed properties from descriptors, JMS header
fields, NULL logic, LIKE escapes and numeric promotion — with the selector's network
patterns installed as a real DoDWAN profile, so a wrong pre-filter would lose messages."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dodwan.core.patterns import Profile
from joms.service import Destination, JomsMessage, JomsService, MessageDispatched
from joms.service import model as mdl


class LoopPort:
    """Publishes straight back to matching local subscriptions (a one-host network)."""

    host_id = "h"

    def __init__(self) -> None:
        self.subs: dict[str, Profile] = {}
        self.specs: dict[str, list[dict[str, str]]] = {}
        self.service: JomsService | None = None
        self.n = 0

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        *,
        deadline: float,
        priority: int,
        persistent: bool,
    ) -> str:
        self.n += 1
        d = dict(attributes)
        d.update(
            id=f"m{self.n}", priority=str(priority), deadline=repr(deadline), origin="h", date="1.0"
        )
        assert self.service is not None
        for key, prof in list(self.subs.items()):
            if prof.matches(d):
                self.service.on_delivery(key, d, payload, 1.0)
        return d["id"]

    def subscribe(self, patterns: list[dict[str, str]], *, key: str) -> str:
        self.subs[key] = Profile.from_patterns(patterns)
        self.specs[key] = patterns
        return key

    def unsubscribe(self, key: str) -> None:
        self.subs.pop(key, None)

    def drop(self, msg_id: str) -> None:
        pass


def deliver(selector: str, msg: JomsMessage) -> bool:
    port = LoopPort()
    svc = JomsService(port, store=None, rng=random.Random(0))
    port.service = svc
    svc.start(1.0)
    c = svc.open_connection(1.0)
    svc.subscribe(c, Destination("topic", "t"), 1.0, selector=selector)
    svc.send(c, msg, 1.0)
    events = []
    while (e := svc.next_event()) is not None:
        events.append(e)
    return any(isinstance(e, MessageDispatched) for e in events)


def msg(
    props: dict[str, Any] | None = None, types: dict[str, str] | None = None, **kw: Any
) -> JomsMessage:
    return JomsMessage(
        Destination("topic", "t"), b"x", properties=props or {}, property_types=types or {}, **kw
    )


CASES = [
    # NULL logic
    ("missing IS NULL", {}, True),
    ("missing = 1", {}, False),
    ("NOT (missing = 1)", {}, False),
    ("missing = 1 OR a = 1", {"a": 1}, True),
    ("missing = 1 AND a = 1", {"a": 1}, False),
    ("a IS NOT NULL", {"a": 1}, True),
    ("s NOT LIKE 'a%'", {}, False),
    ("missing IN ('x')", {}, False),
    # LIKE and escapes
    ("code LIKE 'A\\_%' ESCAPE '\\'", {"code": "A_1"}, True),
    ("code LIKE 'A\\_%' ESCAPE '\\'", {"code": "AB1"}, False),
    ("name LIKE '%ab_'", {"name": "xxabc"}, True),
    ("name LIKE 'a.c'", {"name": "abc"}, False),
    ("name LIKE '100!%' ESCAPE '!'", {"name": "100%"}, True),
    # numeric promotion and types
    ("n = 5.0", {"n": 5}, True),
    ("x > 2", {"x": 2.5}, True),
    ("n BETWEEN 4 AND 6", {"n": 5}, True),
    ("big > 1.0E12", {"big": 1 << 40}, True),
    ("s = 5", {"s": "5"}, False),
    ("n = '5'", {"n": 5}, False),
    ("flag = TRUE", {"flag": True}, True),
    ("flag", {"flag": True}, True),
    ("n + 1 > 5", {"n": 5}, True),
    # strings, IN, OR across attributes (network pre-filter must keep these)
    ("lang IN ('en','fr')", {"lang": "fr"}, True),
    ("lang IN ('en','fr')", {"lang": "de"}, False),
    ("lang = 'en' OR region = 'eu'", {"region": "eu"}, True),
    ("lang = 'en' AND region = 'eu'", {"lang": "en", "region": "us"}, False),
]


@pytest.mark.parametrize(("selector", "props", "expected"), CASES)
def test_selector_conformance_through_the_service(
    selector: str, props: dict[str, Any], expected: bool
) -> None:
    assert deliver(selector, msg(props)) is expected


def test_typed_property_types_matter() -> None:
    # a short and a float property keep their numeric nature through the descriptor
    m = msg({"n": 7, "f": 0.5}, {"n": "short", "f": "float"})
    assert deliver("n > 6 AND f < 1", m)


@pytest.mark.parametrize(
    ("selector", "fields", "expected"),
    [
        ("JMSPriority > 5", {"priority": 7}, True),
        ("JMSPriority > 5", {"priority": 4}, False),
        ("JMSDeliveryMode = 'NON_PERSISTENT'", {"delivery_mode": mdl.NON_PERSISTENT}, True),
        ("JMSType = 'order'", {"type": "order"}, True),
        ("JMSCorrelationID LIKE 'c-%'", {"correlation_id": "c-9"}, True),
        ("JMSType IS NULL", {}, True),
    ],
)
def test_header_fields_in_selectors(selector: str, fields: dict[str, Any], expected: bool) -> None:
    assert deliver(selector, msg(**fields)) is expected


def test_string_selector_is_pushed_into_the_profile() -> None:
    port = LoopPort()
    svc = JomsService(port, rng=random.Random(0))
    port.service = svc
    svc.start(1.0)
    c = svc.open_connection(1.0)
    svc.subscribe(c, Destination("topic", "t"), 1.0, selector="lang IN ('en','fr') AND n > 3")
    [specs] = [v for k, v in port.specs.items() if k.startswith("joms:t:")]
    assert all(s["destination_id"] == "t" and "lang" in s for s in specs)
    assert Profile.from_patterns(specs).matches(
        {
            **{k: "x" for k in ()},
            "jms_kind": "message",
            "destination_type": "topic",
            "destination_id": "t",
            "lang": "fr",
        }
    )


def test_a_long_conjunction_is_pushed_as_far_as_dodwans_pattern_limit() -> None:
    from dodwan import Limits

    port = LoopPort()
    svc = JomsService(port, rng=random.Random(0))
    port.service = svc
    svc.start(1.0)
    c = svc.open_connection(1.0)
    selector = " AND ".join(f"p{i} = 'v{i}'" for i in range(20))
    svc.subscribe(c, Destination("topic", "t"), 1.0, selector=selector)
    [specs] = [v for k, v in port.specs.items() if k.startswith("joms:t:")]
    # the destination attributes stay; selector attributes fill the rest of the limit
    assert [len(s) for s in specs] == [Limits().max_pattern_attributes]
    assert specs[0]["destination_id"] == "t" and specs[0]["p0"] == "v0"


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["joms:dir", "queues"]),
    st.dictionaries(
        st.sampled_from(
            [
                "jms_kind",
                "destination_id",
                "destination_type",
                "reply_id",
                "jms_types",
                "deadline",
                "date",
                "origin",
                "x",
            ]
        ),
        st.text(max_size=12),
        max_size=8,
    ),
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from(
            [b"[]", b"{}", b'{"acked": 5}', b'{"queues": 3}', b'{"lease": "x"}', b"null"]
        ),
    ),
)
def test_hostile_descriptors_never_escape_on_delivery(
    key: str, desc: dict[str, str], payload: bytes
) -> None:
    port = LoopPort()
    svc = JomsService(port, rng=random.Random(0))
    port.service = svc
    svc.start(1.0)
    c = svc.open_connection(1.0)
    svc.subscribe(c, Destination("queue", "q@h"), 1.0)
    if key == "queues":  # the manager's key changes at every start
        key = svc._queues_key
    svc.on_delivery(key, desc, payload, 2.0)
    svc.handle_timer(100.0)
    assert svc.counters.get("internal_errors", 0) == 0
