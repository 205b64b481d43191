"""A JOMS host crashing (kill -9) and restarting: nothing whose send returned is lost.

Virtual time, the service alone (``World`` of test_joms_service): messages handed to a
receiver that died with the process, and messages the core delivered to the service's
subscriptions just before the crash but the service never handled. Plus the STOMP detail
that made the crash suite's consumer lose its connection (auto-mode ``ack`` header).
"""

from __future__ import annotations

from pathlib import Path

from test_joms_service import World, text
from test_stomp_gateway import connect, sync
from test_stomp_gateway import host as host
from test_stomp_gateway import loop as loop

from joms.runtime import LoopbackHost
from joms.service import Destination, MessageDispatched, SqliteServiceStore
from joms.service.model import NON_PERSISTENT


def _crash_and_restart(w: World, h: str, db: Path) -> None:
    """The process dies: nothing is closed, no cancel or release is published."""
    w.svc[h].store.close()  # committed state only, as after kill -9
    w.attach(h, SqliteServiceStore(db))


def test_messages_held_by_a_dead_local_receiver_go_to_a_live_one_at_once_after_restart(
    tmp_path: Path,
) -> None:
    db = tmp_path / "joms.sqlite"
    w = World("m")
    w.attach("m", SqliteServiceStore(db))
    s = w.svc["m"]
    q = s.create_queue("jobs", w.net.now)
    c = s.open_connection(w.net.now, "worker")
    leased = w.net.now
    s.subscribe(c, q, w.net.now, ack_mode="client-individual")
    w.run(0.5)
    p = s.open_connection(w.net.now, "writer")
    sent = [s.send(p, text(q, f"j{i}"), w.net.now) for i in range(5)]
    w.run(0.5)  # the crash comes before the receiver's first renewal (lease / 3)
    first = [e for e in w.events["m"] if isinstance(e, MessageDispatched)]
    assert sorted(e.message.message_id for e in first) == sorted(sent)  # none acknowledged
    _crash_and_restart(w, "m", db)
    s2 = w.svc["m"]
    c2 = s2.open_connection(w.net.now, "worker")
    cons = s2.subscribe(c2, Destination("queue", "jobs@m"), w.net.now, ack_mode="auto")
    # the dead receiver (a consumer of this host) is known dead at the restart, and its
    # request, still cached and seen again, does not bring it back: no wait for its lease
    w.run(1)
    assert w.net.now < leased + w.cfg.lease
    again = [e for e in w.events["m"][len(first) :] if e.consumer == cons]
    assert sorted(e.message.message_id for e in again) == sorted(sent)
    assert all(e.message.redelivered for e in again)
    assert s2.queue_status("jobs@m")["pending"] == 0


def test_queue_message_delivered_by_the_core_but_not_yet_handled_survives_a_crash(
    tmp_path: Path,
) -> None:
    """The core records a delivery as done when it emits it; the runner feeds it to the
    service a moment later. A crash in between must not lose a message whose send returned."""
    db = tmp_path / "joms.sqlite"
    w = World("m")
    w.attach("m", SqliteServiceStore(db))
    s = w.svc["m"]
    q = s.create_queue("jobs", w.net.now)
    p = s.open_connection(w.net.now, "writer")
    mid = s.send(p, text(q, "in flight"), w.net.now)  # the receipt would go back now
    w.net._after_input("m")
    assert any(  # the core has handed the message to the manager's subscription...
        ev.descriptor.get("destination_id") == "jobs@m" for ev in w.net.deliveries("m")
    )
    _crash_and_restart(w, "m", db)  # ...but the process dies before the service saw it
    s2 = w.svc["m"]
    c = s2.open_connection(w.net.now, "worker")
    s2.subscribe(c, Destination("queue", "jobs@m"), w.net.now)
    w.run(2)
    assert [e.message.message_id for e in w.events["m"]] == [mid]
    assert s2.queue_status("jobs@m")["pending"] == 0


def test_durable_message_delivered_by_the_core_but_not_yet_handled_survives_a_crash(
    tmp_path: Path,
) -> None:
    db = tmp_path / "joms.sqlite"
    w = World("m")
    w.attach("m", SqliteServiceStore(db))
    s = w.svc["m"]
    c = s.open_connection(w.net.now, "worker")
    news = Destination("topic", "news")
    s.subscribe(c, news, w.net.now, durable_name="keeper")
    p = s.open_connection(w.net.now, "writer")
    s.send(p, text(news, "seen"), w.net.now)
    w.run(1)
    assert w.bodies("m") == [b"seen"]
    s.send(p, text(news, "in flight"), w.net.now)
    w.net._after_input("m")
    assert any(ev.payload == b"in flight" for ev in w.net.deliveries("m"))
    _crash_and_restart(w, "m", db)
    s2 = w.svc["m"]
    c2 = s2.open_connection(w.net.now, "worker")
    s2.subscribe(c2, news, w.net.now, durable_name="keeper")
    w.run(2)
    # the message in flight comes once; the one consumed before the crash does not come again
    assert w.bodies("m") == [b"seen", b"in flight"]
    _crash_and_restart(w, "m", db)  # and a second restart replays nothing
    s3 = w.svc["m"]
    c3 = s3.open_connection(w.net.now, "worker")
    s3.subscribe(c3, news, w.net.now, durable_name="keeper")
    w.run(2)
    assert w.bodies("m") == [b"seen", b"in flight"]


def test_auto_mode_durable_message_dispatched_but_not_written_survives_a_crash(
    tmp_path: Path,
) -> None:
    """ack=auto consumes a message when the transport takes it, not when the service
    dispatches it: a kill between the service's commit and the gateway writing the
    MESSAGE frame lost it (the crash suite's ``t-9-68``)."""
    db = tmp_path / "joms.sqlite"
    w = World("m")
    w.attach("m", SqliteServiceStore(db))
    s = w.svc["m"]
    c = s.open_connection(w.net.now, "worker")
    news = Destination("topic", "news")
    s.subscribe(c, news, w.net.now, durable_name="keeper")
    p = s.open_connection(w.net.now, "writer")
    s.send(p, text(news, "taken"), w.net.now)
    w.run(1)
    assert w.bodies("m") == [b"taken"]
    s.send(p, text(news, "not written"), w.net.now)
    w.feed("m")  # the service handles it and commits; nobody takes the events
    _crash_and_restart(w, "m", db)
    s2 = w.svc["m"]
    c2 = s2.open_connection(w.net.now, "worker")
    s2.subscribe(c2, news, w.net.now, durable_name="keeper")
    w.run(2)
    assert w.bodies("m") == [b"taken", b"not written"]
    # it may have reached the client before the crash as far as the provider knows
    assert w.events["m"][-1].message.redelivered


def test_auto_mode_queue_message_dispatched_but_not_written_survives_a_crash(
    tmp_path: Path,
) -> None:
    db = tmp_path / "joms.sqlite"
    w = World("m")
    w.attach("m", SqliteServiceStore(db))
    s = w.svc["m"]
    q = s.create_queue("jobs", w.net.now)
    c = s.open_connection(w.net.now, "worker")
    s.subscribe(c, q, w.net.now)
    w.run(0.5)
    p = s.open_connection(w.net.now, "writer")
    s.send(p, text(q, "taken"), w.net.now)
    w.run(1)
    assert w.bodies("m") == [b"taken"]
    s.send(p, text(q, "not written"), w.net.now)
    for _ in range(40):  # the queue manager hands it to the receiver; nobody takes events
        w.net.run(0.05)
        w.feed("m")  # the service handles it and commits; nobody takes the events
        t = s.get_timer()
        if t is not None and t <= w.net.now:
            s.handle_timer(w.net.now)
    _crash_and_restart(w, "m", db)
    s2 = w.svc["m"]
    c2 = s2.open_connection(w.net.now, "worker")
    s2.subscribe(c2, Destination("queue", "jobs@m"), w.net.now)
    w.run(3)
    assert w.bodies("m") == [b"taken", b"not written"]


def test_stomp_auto_mode_messages_carry_no_ack_header(host: LoopbackHost) -> None:
    """STOMP 1.2: only client-mode MESSAGEs carry ``ack``. A client acknowledging every
    MESSAGE that has one (as the crash suite's consumer does) must not get an ERROR in auto
    mode — that closed its connection and lost the auto-consumed messages behind it."""
    c, lst = connect(host, "worker")
    c.subscribe("/topic/news", id="t", headers={"durable-subscription-name": "keeper"})
    c.subscribe("/queue/jobs", id="q", ack="client-individual")
    sync(c, lst)
    c.send("/topic/news", "t0")
    c.send("/queue/jobs", "q0")
    got = {f.body: f for f in (lst.get(), lst.get())}
    assert "ack" not in got["t0"].headers
    assert "ack" in got["q0"].headers
    for f in got.values():
        if "ack" in f.headers:
            c.ack(f.headers["ack"])
    c.send("/topic/news", "t1")
    assert lst.get().body == "t1"
    sync(c, lst, "after")
    assert lst.errors.empty()
    c.disconnect()


def test_both_service_stores_list_records_in_key_order_with_a_limit(tmp_path: Path) -> None:
    from joms.service.store import MemoryServiceStore

    for store in (MemoryServiceStore(), SqliteServiceStore(tmp_path / "kv.db")):
        for key in ("b\x1e2", "a\x1e9", "b\x1e1", "b\x1e3", "c"):
            store.put("t", key, key.encode())
        store.put("other", "b\x1e0", b"x")
        assert [k for k, _ in store.items("t", "b\x1e")] == ["b\x1e1", "b\x1e2", "b\x1e3"]
        assert store.items("t", "b\x1e", limit=1) == [("b\x1e1", b"b\x1e1")]
        assert [k for k, _ in store.items("t", limit=2)] == ["a\x1e9", "b\x1e1"]
        assert len(store.items("t")) == 5 and store.items("t", "z", limit=1) == []
        store.close()


def test_a_non_persistent_message_stays_non_persistent_in_the_core_without_a_volatile_store() -> (
    None
):
    # NodePort without a volatile() store context (simulator, in-memory tests) published a
    # NON_PERSISTENT message as persistent: the core then ranked it as persistent.
    w = World("m")
    s = w.svc["m"]
    p = s.open_connection(w.net.now, "writer")
    msg = text(Destination("topic", "news"), "light")
    msg.delivery_mode = NON_PERSISTENT
    s.send(p, msg, w.net.now)
    node = w.net.node("m")
    headers = [c.header for c in node._cache.values() if c.descriptor.get("destination_id")]
    assert headers and all(not h.persistent for h in headers)
