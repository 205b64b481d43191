"""The JOMS service alone, sans-IO: core nodes on the virtual medium, virtual time."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from dodwan import MessageDelivered
from dodwan.virtual import VirtualNetwork
from joms.errors import IllegalStateException, InvalidDestinationException, InvalidSelectorException
from joms.service import (
    Destination,
    JomsMessage,
    JomsService,
    MemoryServiceStore,
    MessageDispatched,
    ServiceConfig,
    SqliteServiceStore,
)
from joms.service import model as mdl
from joms.service.core_port import NodePort
from joms.service.queues import ManagedQueue


class World:
    """Virtual network + one JOMS service per host, delivering node events to services."""

    def __init__(self, *hosts: str, config: ServiceConfig | None = None, **node: Any) -> None:
        self.net = VirtualNetwork(seed=1, start=1000.0)
        self.cfg = config or ServiceConfig(lease=6.0, directory_period=2.0)
        self.node_kw = {"announce_period": 0.5, **node}
        self.svc: dict[str, JomsService] = {}
        self.seen: dict[str, int] = {}
        self.events: dict[str, list[MessageDispatched]] = {}
        for h in hosts:
            self.net.add(h, **self.node_kw)
            self.attach(h, MemoryServiceStore())
        self.net.connect_all(*hosts)

    def attach(self, h: str, store: Any) -> JomsService:
        port = NodePort(self.net.node(h), lambda: self.net.now)
        s = JomsService(port, self.cfg, store, random.Random(h))
        s.start(self.net.now)
        self.svc[h] = s
        self.seen[h] = len(self.net.events(h))
        self.events.setdefault(h, [])
        self.net._after_input(h)
        return s

    def feed(self, h: str) -> None:
        """Hand the service of ``h`` what its core delivered since the last call."""
        self.net._after_input(h)
        evs = self.net.events(h)
        while self.seen[h] < len(evs):
            ev = evs[self.seen[h]]
            self.seen[h] += 1
            if isinstance(ev, MessageDelivered) and ev.subscription.startswith("joms:"):
                self.svc[h].on_delivery(ev.subscription, ev.descriptor, ev.payload, self.net.now)

    def step(self) -> None:
        for h, s in self.svc.items():
            self.feed(h)
            t = s.get_timer()
            if t is not None and t <= self.net.now:
                s.handle_timer(self.net.now)
            while (e := s.next_event()) is not None:
                self.events[h].append(e)
            self.net._after_input(h)

    def run(self, seconds: float, dt: float = 0.05) -> None:
        end = self.net.now + seconds
        while self.net.now < end:
            self.net.run(dt)
            self.step()

    def bodies(self, h: str) -> list[bytes]:
        return [e.message.body for e in self.events[h]]


def text(dest: Destination, body: str, **props: Any) -> JomsMessage:
    return JomsMessage(destination=dest, body=body.encode(), properties=props)


def test_descriptor_mapping_round_trips_every_field() -> None:
    m = JomsMessage(
        destination=Destination("queue", "Q@h1"),
        body=b"\x00x",
        body_type="bytes",
        properties={"flag": True, "n": 7, "big": 1 << 40, "x": 1.5, "s": "v"},
        property_types={"n": "short", "x": "float"},
        message_id="ID:h1-1",
        delivery_mode=mdl.NON_PERSISTENT,
        priority=8,
        timestamp=123,
        expiration=456,
        correlation_id="c",
        reply_to="/queue/R@h2",
        type="t",
        connection="h1/c1",
    )
    d = mdl.to_descriptor(m)
    assert d["destination_id"] == "Q@h1" and d["destination_type"] == "queue"
    assert d["jms_types"] == "big:long,flag:boolean,n:short,x:float"
    d["priority"] = "8"  # DoDWAN's own attribute on delivery
    back = mdl.from_descriptor(d, m.body)
    assert back.properties == m.properties
    assert back.property_types["n"] == "short"
    for f in ("message_id", "delivery_mode", "priority", "timestamp", "expiration"):
        assert getattr(back, f) == getattr(m, f)
    assert (back.correlation_id, back.reply_to, back.type) == ("c", "/queue/R@h2", "t")
    assert mdl.thaw(mdl.freeze(m)).properties == m.properties


@pytest.mark.parametrize(
    "bad",
    [
        {"destination_type": "topic"},
        {"destination_type": "nope", "destination_id": "x"},
        {"destination_type": "topic", "destination_id": "x", "jms_types": "a:weird"},
        {"destination_type": "topic", "destination_id": "x", "n": "z", "jms_types": "n:int"},
        {"destination_type": "queue", "destination_id": "noat"},
    ],
)
def test_malformed_descriptors_raise_value_error(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        mdl.from_descriptor(bad, b"")


def test_topic_selector_in_profile_and_local_evaluation() -> None:
    w = World("a", "b")
    cb = w.svc["b"].open_connection(w.net.now)
    w.svc["b"].subscribe(
        cb, Destination("topic", "news"), w.net.now, selector="lang = 'en' AND n > 2"
    )
    profile = w.net.node("b").profile()["own"]
    assert {
        "jms_kind": "message",
        "destination_type": "topic",
        "destination_id": "news",
        "lang": "en",
    } in profile
    ca = w.svc["a"].open_connection(w.net.now)
    t = Destination("topic", "news")
    for n, lang in [(5, "en"), (1, "en"), (5, "fr")]:
        w.svc["a"].send(ca, text(t, f"{lang}{n}", lang=lang, n=n), w.net.now)
    w.run(5)
    assert w.bodies("b") == [b"en5"]
    # the French one never travelled: it did not match b's profile
    langs = [e["descriptor"].get("lang") for e in w.net.node("b").cache_listing()]
    assert "en" in langs and "fr" not in langs


def test_invalid_selector_and_refused_nondurable() -> None:
    w = World("a", config=ServiceConfig(nondurable="refuse"))
    s = w.svc["a"]
    c = s.open_connection(w.net.now, "cid")
    with pytest.raises(InvalidSelectorException):
        s.subscribe(c, Destination("topic", "t"), w.net.now, selector="x LIKE", durable_name="d")
    with pytest.raises(IllegalStateException, match="durable"):
        s.subscribe(c, Destination("topic", "t"), w.net.now)


def test_durable_state_survives_service_restart_on_sqlite(tmp_path: Path) -> None:
    w = World("a", "b")
    store = SqliteServiceStore(tmp_path / "joms.sqlite")
    s = w.attach("b", store)
    c = s.open_connection(w.net.now, "app")
    cons = s.subscribe(c, Destination("topic", "t"), w.net.now, durable_name="d", ack_mode="client")
    s.close_connection(c, w.net.now)
    ca = w.svc["a"].open_connection(w.net.now)
    w.svc["a"].send(ca, text(Destination("topic", "t"), "kept"), w.net.now)
    w.run(4)
    assert w.events["b"] == []
    store.close()
    del cons
    # restart: a new service on the same file
    s2 = w.attach("b", SqliteServiceStore(tmp_path / "joms.sqlite"))
    c2 = s2.open_connection(w.net.now, "app")
    s2.subscribe(c2, Destination("topic", "t"), w.net.now, durable_name="d", ack_mode="client")
    w.step()
    assert w.bodies("b") == [b"kept"]


def test_queue_lease_expiry_hands_message_to_another_receiver() -> None:
    w = World("m", "r1", "r2")
    q = w.svc["m"].create_queue("jobs", w.net.now)
    c1 = w.svc["r1"].open_connection(w.net.now)
    w.svc["r1"].subscribe(c1, q, w.net.now, ack_mode="client-individual")
    w.run(3)
    # r1 is cut off before any traffic: the manager still holds its lease
    w.net.isolate("r1")
    c2 = w.svc["r2"].open_connection(w.net.now)
    w.svc["r2"].subscribe(c2, q, w.net.now)
    w.run(2)
    cm = w.svc["m"].open_connection(w.net.now)
    for i in range(4):
        w.svc["m"].send(cm, text(q, f"j{i}"), w.net.now)
    w.run(12)  # r1's lease (6 s) expires; its share goes to r2
    assert sorted(w.bodies("r2")) == [b"j0", b"j1", b"j2", b"j3"]
    assert w.svc["m"].queue_status("jobs@m")["pending"] == 0
    assert list(w.svc["m"].queue_status("jobs@m")["receivers"]) == [
        next(iter(w.svc["m"].queue_status("jobs@m")["receivers"]))
    ]


def test_messages_handed_to_a_receiver_that_closed_before_they_came_are_not_redelivered() -> None:
    """A receiver on another host is handed three messages and closes before any reaches
    it (a one-shot receive that got its message elsewhere): its cancel names what it got,
    so the manager hands them to the next receiver as never delivered. Its lease renewal,
    due at the same instant, reaches the manager after the cancel: it must not bring the
    closed receiver back (it held the three until its lease ran out)."""
    w = World("m", "r")
    q = w.svc["m"].create_queue("jobs", w.net.now)
    c = w.svc["r"].open_connection(w.net.now)
    first = w.svc["r"].subscribe(c, q, w.net.now, ack_mode="client-individual")
    w.run(3)
    w.net.isolate("r")  # the deliveries stay with the manager's node for now
    cm = w.svc["m"].open_connection(w.net.now)
    for i in range(3):
        w.svc["m"].send(cm, text(q, f"j{i}"), w.net.now)
    w.run(1)
    assert w.svc["m"].queue_status("jobs@m")["assigned"] == 3
    w.svc["r"].close_consumer(first, w.net.now)
    w.net.connect_all("m", "r")
    w.run(4)
    assert w.svc["m"].queue_status("jobs@m")["assigned"] == 0
    assert w.events["r"] == []  # nothing reached the closed receiver
    w.svc["r"].subscribe(c, q, w.net.now, ack_mode="client-individual")
    w.run(4)
    got = [(e.message.body, e.message.redelivered) for e in w.events["r"]]
    assert sorted(got) == [(b"j0", False), (b"j1", False), (b"j2", False)]


@pytest.mark.parametrize("ack_mode", ["client", "client-individual"])
@pytest.mark.parametrize("close", ["consumer", "connection"])
@pytest.mark.parametrize("where", ["m", "r"])
def test_a_consumer_closing_without_ack_counts_one_delivery_towards_the_dead_letter_limit(
    ack_mode: str, close: str, where: str
) -> None:
    """A queue message received, then left unacknowledged by a consumer that closes
    (UNSUBSCRIBE, or the connection gone), was delivered once: the next consumer refusing
    it every time gets it max_redeliveries more times (7 deliveries in all), each marked
    redelivered with the right count, before it goes to the dead-letter queue."""
    w = World("m", "r")
    m = w.svc["m"]
    q = m.create_queue("jobs", w.net.now)
    s = w.svc[where]
    c = s.open_connection(w.net.now)
    first = s.subscribe(c, q, w.net.now, ack_mode=ack_mode)
    w.run(3)
    m.send(m.open_connection(w.net.now), text(q, "poison"), w.net.now)
    w.run(2)
    [e] = w.events[where]
    assert (e.message.redelivered, e.message.delivery_count) == (False, 0)
    if close == "consumer":
        s.close_consumer(first, w.net.now)
    else:
        s.close_connection(c, w.net.now)
    w.run(3)
    c2 = s.open_connection(w.net.now)
    second = s.subscribe(c2, q, w.net.now, ack_mode=ack_mode)
    seen: list[tuple[bool, int]] = []
    for _ in range(10):
        w.run(2)
        got = [e for e in w.events[where] if e.consumer == second]
        if len(got) == len(seen):
            break
        seen.append((got[-1].message.redelivered, got[-1].message.delivery_count))
        s.nack(second, got[-1].tag, w.net.now)
    w.run(2)
    assert seen == [(True, n) for n in range(1, 7)]  # redeliveries 1 .. max_redeliveries
    [dead] = m.browse(Destination("queue", "DLQ@m"), w.net.now)
    assert dead.dlq_reason == "redelivered 6 times and refused again (max_redeliveries = 6)"


class FirstOnly:
    def choose(self, queue: ManagedQueue, message: JomsMessage, candidates: list[str]) -> str:
        return sorted(candidates)[0]


def first_only() -> FirstOnly:
    return FirstOnly()


def test_receiver_policy_is_replaceable_by_configuration() -> None:
    cfg = ServiceConfig(receiver_policy=f"{__name__}:first_only", lease=6.0)
    w = World("m", config=cfg)
    s = w.svc["m"]
    q = s.create_queue("p", w.net.now)
    c = s.open_connection(w.net.now)
    a = s.subscribe(c, q, w.net.now)
    b = s.subscribe(c, q, w.net.now)
    for i in range(4):
        s.send(c, text(q, f"{i}"), w.net.now)
    w.run(1)
    by = {e.consumer for e in w.events["m"]}
    assert len(w.events["m"]) == 4 and len(by) == 1 and by <= {a, b}


def test_directory_learns_queues_and_topics_of_other_hosts() -> None:
    w = World("a", "b")
    w.svc["a"].create_queue("orders", w.net.now)
    ca = w.svc["a"].open_connection(w.net.now)
    w.svc["a"].send(ca, text(Destination("topic", "weather"), "x"), w.net.now)
    w.run(6)
    known = w.svc["b"].destinations()
    assert "orders@a" in known["queues"]
    assert "weather" in known["topics"]
    assert w.svc["b"].lookup_queue("orders") == ["orders@a"]


def test_a_refused_subscription_does_not_advertise_its_topic() -> None:
    """Adverts list the topics a host has used (docs/joms.md): a SUBSCRIBE the service
    refused used none, whichever check refused it."""
    w = World("a", "b", config=ServiceConfig(nondurable="refuse"))
    s = w.svc["a"]
    anon = s.open_connection(w.net.now)
    with pytest.raises(Exception, match="client id"):
        s.subscribe(anon, Destination("topic", "noClientId"), w.net.now, durable_name="d")
    named = s.open_connection(w.net.now, "cid")
    with pytest.raises(IllegalStateException, match="nondurable = refuse"):
        s.subscribe(named, Destination("topic", "refusedNondurable"), w.net.now)
    with pytest.raises(Exception, match="reserved"):
        s.subscribe(named, Destination("topic", "reservedName"), w.net.now, durable_name="~nd.x")
    s.subscribe(named, Destination("topic", "accepted"), w.net.now, durable_name="d")
    w.run(6)  # the adverts go out and reach b
    for known in (s.destinations(), w.svc["b"].destinations()):
        assert "accepted" in known["topics"]
        assert not {"noClientId", "refusedNondurable", "reservedName"} & set(known["topics"])


def test_expired_messages_are_not_dispatched() -> None:
    w = World("a")
    s = w.svc["a"]
    c = s.open_connection(w.net.now, "x")
    t = Destination("topic", "t")
    s.subscribe(c, t, w.net.now, durable_name="d")
    s.close_connection(c, w.net.now)
    s.send(s.open_connection(w.net.now), text(t, "short"), w.net.now, time_to_live=1.0)
    w.run(0.2)
    w.run(3)
    c = s.open_connection(w.net.now, "x")
    s.subscribe(c, t, w.net.now, durable_name="d")
    w.step()
    assert w.events["a"] == []


def test_carriers_drop_copies_of_consumed_queue_messages() -> None:
    w = World("m", "c", "r")
    w.net.unlink("m", "r")  # m - c - r: c carries both ways (horizon 2)
    q = w.svc["m"].create_queue("q", w.net.now)
    cr = w.svc["r"].open_connection(w.net.now)
    w.svc["r"].subscribe(cr, q, w.net.now)
    w.run(3)
    cm = w.svc["m"].open_connection(w.net.now)
    for i in range(3):
        w.svc["m"].send(cm, text(q, f"x{i}"), w.net.now)

    def carried(host: str) -> list[str]:
        return [
            e["descriptor"]["jms_kind"]
            for e in w.net.node(host).cache_listing()
            if e["descriptor"].get("destination_id") == "q@m"
            and e["descriptor"].get("jms_kind") in ("message", "delivery")
        ]

    w.run(3)
    assert sorted(w.bodies("r")) == [b"x0", b"x1", b"x2"]
    w.run(4)  # the acknowledgements travel back
    assert w.svc["m"].queue_status("q@m")["pending"] == 0
    assert carried("c") == []
    assert carried("m") == [] and carried("r") == []
    assert w.svc["c"].counters.get("copies_dropped", 0) >= 6


def test_durable_backlog_is_bounded_oldest_dropped() -> None:
    w = World("a", config=ServiceConfig(max_pending=2))
    s = w.svc["a"]
    t = Destination("topic", "t")
    c = s.open_connection(w.net.now, "slow")
    s.subscribe(c, t, w.net.now, durable_name="d", ack_mode="client")
    s.close_connection(c, w.net.now)
    p = s.open_connection(w.net.now)
    for i in range(4):
        s.send(p, text(t, f"m{i}"), w.net.now)
    w.step()
    c = s.open_connection(w.net.now, "slow")
    s.subscribe(c, t, w.net.now, durable_name="d", ack_mode="client")
    w.step()
    assert w.bodies("a") == [b"m2", b"m3"]
    assert s.counters["pending_overflow"] == 2


def test_durable_overflow_also_drops_the_copy_waiting_in_memory() -> None:
    w = World("a", config=ServiceConfig(max_pending=2))
    s = w.svc["a"]
    t = Destination("topic", "t")
    c = s.open_connection(w.net.now, "slow")
    cons = s.subscribe(c, t, w.net.now, durable_name="d", ack_mode="client-individual", prefetch=1)
    p = s.open_connection(w.net.now)
    for i in range(4):  # m0 dispatched; m1 waits in memory until m3 pushes it out
        s.send(p, text(t, f"m{i}"), w.net.now)
        w.step()
    assert w.bodies("a") == [b"m0"]
    s.ack(cons, w.events["a"][0].tag, w.net.now)
    w.step()
    assert w.bodies("a") == [b"m0", b"m2"]
    assert s.counters["pending_overflow"] == 2


def test_temporary_queue_is_owned_by_its_connection_and_dies_with_it() -> None:
    w = World("a")
    s = w.svc["a"]
    owner = s.open_connection(w.net.now)
    other = s.open_connection(w.net.now)
    tq = s.create_temporary_queue(owner, w.net.now)
    assert tq.name.startswith("tmp.") and tq.manager == "a"
    with pytest.raises(InvalidDestinationException):
        s.subscribe(other, tq, w.net.now)
    s.subscribe(owner, tq, w.net.now)
    s.send(other, text(tq, "reply"), w.net.now)
    w.run(0.5)
    assert w.bodies("a") == [b"reply"]
    s.close_connection(owner, w.net.now)
    assert tq.name not in s.destinations()["queues"]
    with pytest.raises(InvalidDestinationException):
        s.send(other, text(tq, "too late"), w.net.now)


def test_a_temporary_queue_manager_ignores_receivers_of_other_hosts() -> None:
    """Another host's subscribe refuses a temporary queue it cannot own; a receiver request
    that comes anyway (an older or hostile peer) is not served by the manager: the owner
    gets every message."""
    w = World("a", "b")
    s = w.svc["a"]
    owner = s.open_connection(w.net.now)
    tq = s.create_temporary_queue(owner, w.net.now)
    s.subscribe(owner, tq, w.net.now, ack_mode="client-individual")
    other = w.svc["b"].open_connection(w.net.now)
    with pytest.raises(InvalidDestinationException):
        w.svc["b"].subscribe(other, tq, w.net.now)
    thief = "b.sthief"
    w.svc["b"].port.subscribe(
        [{mdl.KIND: mdl.KIND_DELIVERY, mdl.REPLY_ID: thief}], key="joms:r:thief"
    )
    w.svc["b"].port.publish(
        {mdl.KIND: mdl.KIND_RECEIVER, mdl.DEST_TYPE: "queue", mdl.DEST_ID: tq.name,
         mdl.REPLY_ID: thief},
        json.dumps({"selector": "", "lease": 6.0, "cancel": False}).encode(),
        deadline=w.net.now + 6.0, priority=9, persistent=True,
    )  # fmt: skip
    w.run(2)
    assert s.counters.get("temporary_queue_receivers_refused") == 1
    assert thief not in s.queue_status(tq.name)["receivers"]
    for i in range(4):
        w.svc["b"].send(other, text(tq, f"r{i}"), w.net.now)
    w.run(2)
    assert w.bodies("a") == [b"r0", b"r1", b"r2", b"r3"]
    handed = [e for e in w.net.events("b") if isinstance(e, MessageDelivered)]
    assert not [e for e in handed if e.subscription == "joms:r:thief"]


def test_service_config_from_a_config_file_table() -> None:
    from joms.service.config import field_docs

    cfg = ServiceConfig.from_mapping(
        {"nondurable": "refuse", "lease": 10, "purge_acknowledged": False}
    )
    assert (cfg.nondurable, cfg.lease, cfg.purge_acknowledged) == ("refuse", 10.0, False)
    with pytest.raises(ValueError, match="unknown JOMS setting"):
        ServiceConfig.from_mapping({"leese": 3})
    with pytest.raises(ValueError, match="must be a float"):
        ServiceConfig.from_mapping({"lease": "long"})
    with pytest.raises(ValueError, match="nondurable"):
        ServiceConfig.from_mapping({"nondurable": "maybe"})
    docs = field_docs()
    assert set(docs) >= {"default_ttl", "nondurable", "lease"} and all(docs.values())


def not_a_policy() -> str:
    return "no choose() here"


def raising_policy() -> Any:
    raise RuntimeError("policy broke\non two lines")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuchmod_for_joms_tests:f", "cannot import module 'nosuchmod_for_joms_tests'"),
        ("os:nonexistent", "module 'os' has no attribute 'nonexistent'"),
        ("json:loads", r"calling json:loads\(\) failed: TypeError"),
        ("os:sep", "'os:sep' is not callable"),
        (":f", "'module:callable'"),
        ("os:", "'module:callable'"),
        ("round-robin-ish", "'module:callable'"),
        (f"{__name__}:not_a_policy", r"did not return an object with a choose\(\) method"),
        (f"{__name__}:raising_policy", "RuntimeError: policy broke on two lines"),
    ],
)
def test_a_bad_receiver_policy_is_one_line_naming_the_setting(spec: str, message: str) -> None:
    """Whatever goes wrong importing or calling ``module:callable``, the error is a
    ValueError naming ``receiver_policy``, on one line (the daemon prints it as is)."""
    from joms.service.queues import load_policy

    with pytest.raises(ValueError, match=message) as info:
        load_policy(spec)
    assert str(info.value).startswith("receiver_policy ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name",
    ["default_ttl", "nondurable_keep", "lease", "directory_period", "ack_delay",
     "order_gap_timeout"],
)  # fmt: skip
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_every_float_setting_must_be_finite(name: str, value: float) -> None:
    """NaN passes every ``<= 0`` check: lease = nan starved queue consumers, default_ttl =
    nan failed every send, directory_period = nan never advertised."""
    with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
        ServiceConfig.from_mapping({name: value})
    with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
        ServiceConfig(**{name: value})


def test_every_float_setting_is_covered_by_the_finite_check() -> None:
    from dataclasses import fields

    floats = {
        f.name for f in fields(ServiceConfig) if isinstance(getattr(ServiceConfig(), f.name), float)
    }
    assert floats == {
        "default_ttl", "nondurable_keep", "lease", "directory_period", "ack_delay",
        "order_gap_timeout",
    }  # fmt: skip


def test_waiting_durable_messages_come_higher_priority_first() -> None:
    w = World("a")
    s = w.svc["a"]
    t = Destination("topic", "t")
    c = s.open_connection(w.net.now, "p")
    s.subscribe(c, t, w.net.now, durable_name="d")
    s.close_connection(c, w.net.now)
    p = s.open_connection(w.net.now)
    for body, prio in [("low", 1), ("high", 9), ("mid", 5), ("low2", 1)]:
        m = text(t, body)
        m.priority = prio
        s.send(p, m, w.net.now)
    w.step()
    c = s.open_connection(w.net.now, "p")
    s.subscribe(c, t, w.net.now, durable_name="d")
    w.step()
    assert w.bodies("a") == [b"high", b"mid", b"low", b"low2"]


def test_durable_backlog_bound_holds_when_a_dropped_message_is_acked_later() -> None:
    w = World("a", config=ServiceConfig(max_pending=2))
    s = w.svc["a"]
    t = Destination("topic", "t")
    c = s.open_connection(w.net.now, "slow")
    cons = s.subscribe(c, t, w.net.now, durable_name="d", ack_mode="client-individual", prefetch=1)
    p = s.open_connection(w.net.now)
    for i in range(3):  # m0 dispatched, unacked; m2 overflows the backlog and drops m0's row
        s.send(p, text(t, f"m{i}"), w.net.now)
        w.step()
    s.ack(cons, w.events["a"][0].tag, w.net.now)  # acking m0 must not count it twice
    w.step()
    for i in range(3, 8):
        s.send(p, text(t, f"m{i}"), w.net.now)
        w.step()
    stored = [k for k, _ in s.store.items("dpending", "")]
    assert len(stored) <= 2, stored


def test_a_queue_manager_holds_a_producers_later_message_until_the_gap_timeout() -> None:
    """Per-producer order at a queue's manager: a producer's message 2 arriving without
    message 1 waits ``order_gap_timeout``, then joins the queue and a gap is counted; the
    producer's next message is not held."""
    w = World("m", config=ServiceConfig(lease=6.0, directory_period=2.0, order_gap_timeout=1.5))
    s = w.svc["m"]
    q = s.create_queue("jobs", w.net.now)
    c = s.open_connection(w.net.now)
    s.subscribe(c, q, w.net.now)
    w.run(0.5)
    s._connections[c].sent[q.name] = 1  # as if its message 1 were lost on the way
    s.send(c, text(q, "second"), w.net.now)
    w.run(1.2)
    assert w.bodies("m") == [] and s.counters.get("order_gaps", 0) == 0
    w.run(0.5)
    assert w.bodies("m") == [b"second"] and s.counters["order_gaps"] == 1
    s.send(c, text(q, "third"), w.net.now)
    w.run(0.3)
    assert w.bodies("m") == [b"second", b"third"]


def test_a_delivery_held_back_when_its_receiver_closes_goes_back_as_never_delivered() -> None:
    """A remote receiver holds a hand-out that came before an earlier one; when its
    consumer closes, that message goes back to the manager as never delivered (the next
    receiver gets it without JMSRedelivered)."""
    w = World("m", "r")
    q = w.svc["m"].create_queue("jobs", w.net.now)
    c = w.svc["r"].open_connection(w.net.now)
    first = w.svc["r"].subscribe(c, q, w.net.now, ack_mode="client-individual")
    w.run(3)
    [receiver] = w.svc["m"]._queues["jobs@m"].receivers.values()
    receiver.handed = 1  # as if hand-out 1 were lost on the way
    cm = w.svc["m"].open_connection(w.net.now)
    w.svc["m"].send(cm, text(q, "j0"), w.net.now)
    w.run(1)  # reached r, held back (order_gap_timeout is 2 s)
    assert w.svc["m"].queue_status("jobs@m")["assigned"] == 1 and w.events["r"] == []
    w.svc["r"].close_consumer(first, w.net.now)
    w.run(3)
    assert w.events["r"] == []
    assert w.svc["m"].queue_status("jobs@m")["assigned"] == 0
    w.svc["r"].subscribe(c, q, w.net.now, ack_mode="client-individual")
    w.run(4)
    assert [(e.message.body, e.message.redelivered) for e in w.events["r"]] == [(b"j0", False)]


def test_a_queue_message_is_refused_at_send_when_its_hand_out_could_not_be_published() -> None:
    """The manager hands a queue message on with up to five attributes of its own (receiver,
    hand-out number, original id, counts): a message with 39 to 41 properties was accepted
    (RECEIPT) and then never delivered, its hand-out refused by the core and only counted
    (``queue_delivery_refused``). Each is now either refused at send, saying why, or
    delivered."""
    from joms.errors import MessageFormatException

    w = World("m", "r")
    q = w.svc["m"].create_queue("jobs", w.net.now)
    cr = w.svc["r"].open_connection(w.net.now)
    w.svc["r"].subscribe(cr, q, w.net.now)
    w.run(2)
    cm = w.svc["m"].open_connection(w.net.now)
    accepted, refused = [], []
    for n in range(30, 52):
        props = {f"p{i}": f"v{i}" for i in range(n)}
        try:
            w.svc["m"].send(cm, text(q, f"n{n}", **props), w.net.now)
        except MessageFormatException as exc:
            refused.append(n)
            assert "limits.max_attributes" in str(exc), exc
        else:
            accepted.append(n)
    w.run(10)
    assert sorted(w.bodies("r")) == sorted(f"n{n}".encode() for n in accepted)
    assert w.svc["m"].counters.get("queue_delivery_refused", 0) == 0
    assert accepted and refused and max(accepted) < min(refused), (accepted, refused)
