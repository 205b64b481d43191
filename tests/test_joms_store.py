"""The JOMS service's stores: reads see the open transaction's writes, ``take`` says what it
deleted, the SQLite store writes a record once per transaction and keeps all or nothing of
a transaction; and what the service writes for a durable message dispatched at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from test_faults_daemon import small_disk as small_disk  # a 2 MB tmpfs (root only)

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
from joms.service.base import _SEP
from joms.stomp.host import ServiceDriver


@pytest.fixture(params=["memory", "sqlite"])
def store(request: Any, tmp_path: Path) -> Any:
    s = MemoryServiceStore() if request.param == "memory" else SqliteServiceStore(tmp_path / "s")
    yield s
    s.close()


def test_reads_see_the_writes_of_the_open_transaction(store: Any) -> None:
    store.put("t", "a", b"1")
    store.put("t", "b", b"2")
    store.put("t", "a", b"3")
    store.delete("t", "b")
    assert store.get("t", "a") == b"3" and store.get("t", "b") is None
    assert store.items("t") == [("a", b"3")]
    store.commit()
    store.put("t", "c", b"4")
    store.delete("t", "a")
    assert store.items("t") == [("c", b"4")]
    assert store.items("t", "c", limit=1) == [("c", b"4")]


def test_take_deletes_and_says_whether_there_was_a_record(store: Any) -> None:
    store.put("t", "a", b"1")
    store.commit()
    store.put("t", "b", b"2")  # not committed yet
    assert store.take("t", "a") and store.take("t", "b")
    assert not store.take("t", "a") and not store.take("t", "b") and not store.take("t", "z")
    store.commit()
    assert store.items("t") == []


def test_sqlite_store_commits_once_per_hold_and_writes_a_record_once(tmp_path: Path) -> None:
    path = tmp_path / "joms.sqlite"
    s = SqliteServiceStore(path)
    statements: list[str] = []
    s._db.set_trace_callback(statements.append)
    with s.hold():
        s.put("dpending", "k", b"stored")
        s.put("dpending", "k", b"stored, may have been delivered")
        s.put("seen", "m", b"0")
        s.commit()  # inside the hold: nothing yet
        assert SqliteServiceStore(path).get("seen", "m") is None
    assert sum("INSERT" in q for q in statements) == 2  # one per record
    assert sum(q == "COMMIT" for q in statements) == 1
    again = SqliteServiceStore(path)
    assert again.get("dpending", "k") == b"stored, may have been delivered"
    assert again.get("seen", "m") == b"0"


def test_sqlite_store_keeps_nothing_of_a_transaction_it_could_not_write(tmp_path: Path) -> None:
    path = tmp_path / "joms.sqlite"
    s = SqliteServiceStore(path)
    s.put("t", "kept", b"1")
    s.commit()
    s.put("t", "lost", b"2")
    s.put("t", ("not", "a", "key"), b"3")  # type: ignore[arg-type]  # SQLite refuses it
    with pytest.raises(sqlite3.Error):
        s.commit()
    s.put("t", "next", b"4")
    s.commit()
    assert SqliteServiceStore(path).items("t") == [("kept", b"1"), ("next", b"4")]


class _Port:
    host_id = "h1"

    def __init__(self) -> None:
        self.n = 0

    def publish(self, attributes: Any, payload: bytes, **kw: Any) -> str:
        self.n += 1
        return str(attributes.get("id", f"h1-r{self.n}"))

    def subscribe(self, patterns: Any, *, key: str) -> str:
        return key

    def unsubscribe(self, key: str) -> None:
        pass

    def drop(self, msg_id: str) -> None:
        pass


class CountingStore(MemoryServiceStore):
    def __init__(self) -> None:
        super().__init__()
        self.puts: list[tuple[str, str, bytes]] = []

    def put(self, table: str, key: str, value: bytes) -> None:
        self.puts.append((table, key, bytes(value)))
        super().put(table, key, value)


def _durable_delivery(s: JomsService, n: int) -> dict[str, str]:
    d = mdl.to_descriptor(JomsMessage(Destination("topic", "news"), b"m%d" % n))
    d.update({"id": f"h2-{n}", "deadline": "5000", "priority": "4"})
    return d


def _durable_subscriber(store: Any) -> tuple[JomsService, str]:
    """A service over ``store`` with an auto-mode durable subscriber "d" on ``news``, and
    the core subscription key its deliveries come by."""
    s = JomsService(_Port(), store=store, rng=random.Random(1))
    s.start(1000.0)
    conn = s.open_connection(1000.0, "client")
    s.subscribe(conn, Destination("topic", "news"), 1000.0, durable_name="d")
    [key] = [k for k in s._routes if k.startswith("joms:d:")]
    return s, key


def test_a_durable_message_dispatched_at_once_is_stored_once_as_maybe_delivered() -> None:
    """Arriving for an attached auto-mode consumer, a durable subscription's message is
    written once — already marked "may have been delivered" (JMSRedelivered after a crash
    before its frame was written) — and deleted when the transport took it."""
    store = CountingStore()
    s, key = _durable_subscriber(store)
    store.puts.clear()
    s.on_delivery(key, _durable_delivery(s, 1), b"m1", 1001.0)
    pending = [(k, v) for t, k, v in store.puts if t == "dpending"]
    assert len(pending) == 1
    assert mdl.thaw(pending[0][1]).redelivered
    assert store.items("dpending") == pending  # still stored: not written to the client yet
    ev = s.next_event()
    assert isinstance(ev, MessageDispatched) and ev.message.body == b"m1"
    assert not ev.message.redelivered
    s.settle(1001.0)  # the transport wrote it
    assert store.items("dpending") == []


def test_a_durable_message_waiting_behind_others_is_stored_as_not_delivered() -> None:
    """Without a consumer (or behind a full prefetch window) the stored copy is a plain
    one: it has not been near a client."""
    store = CountingStore()
    s = JomsService(_Port(), store=store, rng=random.Random(1))
    s.start(1000.0)
    conn = s.open_connection(1000.0, "client")
    cons = s.subscribe(
        conn, Destination("topic", "news"), 1000.0, durable_name="d", ack_mode="client",
        prefetch=1,
    )  # fmt: skip
    [key] = [k for k in s._routes if k.startswith("joms:d:")]
    for n in (1, 2):
        s.on_delivery(key, _durable_delivery(s, n), b"m%d" % n, 1001.0)
    stored = {mdl.thaw(v).body: mdl.thaw(v).redelivered for _, v in store.items("dpending")}
    assert stored == {b"m1": True, b"m2": False}  # m1 dispatched, m2 behind the window
    s.close_consumer(cons, 1002.0)
    s.on_delivery(key, _durable_delivery(s, 3), b"m3", 1003.0)
    stored = {mdl.thaw(v).body: mdl.thaw(v).redelivered for _, v in store.items("dpending")}
    assert stored == {b"m1": True, b"m2": False, b"m3": False}


def test_sqlite_store_checkpoints_in_a_background_thread(tmp_path: Path) -> None:
    """Not inside a commit on the caller's thread (SQLite's automatic checkpoint fsyncs
    both files there): the log is copied back by a thread every few MB committed."""
    s = SqliteServiceStore(tmp_path / "joms.sqlite")
    assert s._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    blob = b"x" * 1400
    for i in range(4000):  # ~5.6 MB through the log, as a durable stream does
        s.put("dpending", f"k{i:06d}", blob)
        if i % 50 == 49:
            s.commit()
            for j in range(i - 49, i + 1):
                s.delete("dpending", f"k{j:06d}")
            s.commit()
    cp = s._checkpointer
    assert cp is not None and cp.wait_idle(30) and cp.runs >= 1 and cp.error is None
    s.close()
    assert SqliteServiceStore(tmp_path / "joms.sqlite").items("dpending") == []


class GetCountingStore(MemoryServiceStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[str, str]] = []

    def get(self, table: str, key: str) -> bytes | None:
        self.gets.append((table, key))
        return super().get(table, key)


def test_seen_is_looked_up_only_for_messages_an_earlier_run_may_have_had() -> None:
    """The "seen" record of a durable subscription catches the cached messages the core
    hands again under the key of a new start; a message published by this service since
    it started cannot be among them, so it is not looked up (a read per message)."""
    store = GetCountingStore()
    s, key = _durable_subscriber(store)
    own = _durable_delivery(s, 1)
    own["id"] = f"h1-{s._id()}"  # as _publish_named names it
    s.on_delivery(key, own, b"own", 1001.0)
    assert [g for g in store.gets if g[0] == "seen"] == []
    old = _durable_delivery(s, 2)  # e.g. h2-2: another host's, or an earlier run's
    s.on_delivery(key, old, b"old", 1001.0)
    s.on_delivery(key, old, b"old", 1001.0)  # handed again (as after a restart)
    assert len([g for g in store.gets if g[0] == "seen"]) == 2
    bodies = [ev.message.body for ev in iter(s.next_event, None)]
    assert bodies == [b"own", b"old"] and s.counters.get("durable_duplicates") == 1


def test_sqlite_store_moves_an_older_store_to_its_rowid_table(tmp_path: Path) -> None:
    """Stores written by earlier versions (a WITHOUT ROWID table) are converted when
    opened, records intact."""
    path = tmp_path / "joms.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE records (tbl TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
        " PRIMARY KEY (tbl, key)) WITHOUT ROWID"
    )
    old.executemany(
        "INSERT INTO records VALUES (?, ?, ?)",
        [("durable", "d1", b"{}"), ("dpending", "d1|1", b"x" * 3000), ("meta", "starts", b"4")],
    )
    old.commit()
    old.close()
    s = SqliteServiceStore(path)
    assert s.get("meta", "starts") == b"4"
    assert s.items("dpending", "d1|") == [("d1|1", b"x" * 3000)]
    s.put("meta", "starts", b"5")
    s.close()
    db = sqlite3.connect(path)
    (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'records'").fetchone()
    assert "WITHOUT ROWID" not in sql.upper()
    assert db.execute("SELECT count(*) FROM records").fetchone() == (3,)
    db.close()
    assert SqliteServiceStore(path).get("meta", "starts") == b"5"


def _away_durable_subscriber(
    store: Any, config: ServiceConfig | None = None
) -> tuple[JomsService, str]:
    """Like :func:`_durable_subscriber`, with the subscriber's connection closed again."""
    s = JomsService(_Port(), config, store=store, rng=random.Random(1))
    s.start(1000.0)
    conn = s.open_connection(1000.0, "client")
    s.subscribe(conn, Destination("topic", "news"), 1000.0, durable_name="d")
    s.close_connection(conn, 1000.0)
    [key] = [k for k in s._routes if k.startswith("joms:d:")]
    return s, key


def _come_back(s: JomsService, now: float) -> list[bytes]:
    """The durable subscriber "d" reconnects: the bodies handed to it, in order."""
    conn = s.open_connection(now, "client")
    s.subscribe(conn, Destination("topic", "news"), now, durable_name="d")
    return [ev.message.body for ev in iter(s.next_event, None)]


def test_durable_messages_stored_at_one_instant_come_back_in_arrival_order() -> None:
    """A batch from the network is stored at one instant: the counter in the stored keys
    must keep their arrival order when crossing a hex digit (9, a, ..., f, 10)."""
    s, key = _away_durable_subscriber(MemoryServiceStore())
    for n in range(40):
        s.on_delivery(key, _durable_delivery(s, n), b"m%d" % n, 1001.0)
    assert _come_back(s, 1002.0) == [b"m%d" % n for n in range(40)]


def test_durable_backlog_bound_drops_the_oldest_of_one_instant() -> None:
    s, key = _away_durable_subscriber(MemoryServiceStore(), ServiceConfig(max_pending=20))
    for n in range(40):
        s.on_delivery(key, _durable_delivery(s, n), b"m%d" % n, 1001.0)
    assert s.counters["pending_overflow"] == 20
    assert _come_back(s, 1002.0) == [b"m%d" % n for n in range(20, 40)]


def test_stored_keys_of_earlier_versions_keep_their_arrival_order(tmp_path: Path) -> None:
    """Earlier versions ended the keys of stored durable and queue messages with a hex
    counter of no fixed width ("...x9" sorting after "...x10"): a store they wrote is read
    in arrival order, the backlog bound then drops the real oldest, and its keys are
    rewritten once."""
    path = tmp_path / "joms.sqlite"
    store = SqliteServiceStore(path)
    s, _ = _away_durable_subscriber(store, ServiceConfig(max_pending=12))
    [dkey] = s._durables
    q = s.create_queue("jobs", 1000.0)
    store.delete("meta", "seq_keys")  # as an earlier version left it
    for n in range(9, 21):  # counters 9 .. 0x14, all made at one instant
        seq = f"{1001 * 10**6:020d}0123abcdr1x{n:x}"
        m = JomsMessage(Destination("topic", "news"), b"m%d" % n, message_id=f"ID:h2-{n}")
        store.put("dpending", dkey + _SEP + seq, mdl.freeze(m))
        qm = JomsMessage(q, b"q%d" % n, message_id=f"ID:h2-q{n}")
        meta = {"seq": seq, "deadline": 5000.0, "core_id": "", "assigned": None, "attempts": 0}
        store.put(
            "qpending", q.name + _SEP + seq, json.dumps(meta).encode() + b"\n" + mdl.freeze(qm)
        )
    store.close()
    store = SqliteServiceStore(path)
    s = JomsService(_Port(), ServiceConfig(max_pending=12), store=store, rng=random.Random(2))
    s.start(1002.0)
    assert [m.body for m in s.browse(q, 1002.0)] == [b"q%d" % n for n in range(9, 21)]
    [key] = [k for k in s._routes if k.startswith("joms:d:")]
    s.on_delivery(key, _durable_delivery(s, 99), b"m99", 1003.0)  # over the bound: m9 goes
    assert _come_back(s, 1004.0) == [b"m%d" % n for n in range(10, 21)] + [b"m99"]
    s.store.commit()
    keys = [k for t in ("dpending", "qpending") for k, _ in store.items(t)]
    assert len(keys) == 24 and all(len(k.rpartition("x")[2]) == 16 for k in keys), keys


def test_queue_messages_arriving_at_one_instant_wait_in_arrival_order() -> None:
    s = JomsService(_Port(), store=MemoryServiceStore(), rng=random.Random(1))
    s.start(1000.0)
    q = s.create_queue("jobs", 1000.0)
    for n in range(40):
        d = mdl.to_descriptor(JomsMessage(q, b"q%d" % n, message_id=f"ID:h2-{n}"))
        d.update({"id": f"h2-{n}", "deadline": "5000", "priority": "4"})
        s.on_delivery(s._queues_key, d, b"q%d" % n, 1001.0)
    assert [m.body for m in s.browse(q, 1001.0)] == [b"q%d" % n for n in range(40)]


def test_the_service_timer_stays_armed_on_a_full_disk_and_its_writes_are_kept(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit of the service's store that fails inside the driver's timer (disk full) is
    one log line: the timer is re-armed, and the writes are kept and made at a later commit
    once there is room (the failure used to escape the loop callback and leave the timer
    unarmed, the service's adverts and housekeeping stopped)."""
    path = small_disk / "joms.sqlite"
    store = SqliteServiceStore(path)
    service = JomsService(_Port(), ServiceConfig(directory_period=0.05), store, random.Random(1))
    service.start(time.time())
    big = os.urandom(200_000)
    writing = False

    def flush() -> None:  # the runner's hook: here, work that writes the service's state
        if writing:
            store.put("t", "k", big)

    fired = 0
    more = asyncio.Event()
    handle_timer = service.handle_timer

    def counted(now: float) -> None:
        nonlocal fired
        fired += 1
        more.set()
        handle_timer(now)

    service.handle_timer = counted  # type: ignore[method-assign]
    driver = ServiceDriver(service, time.time, flush=flush)
    errors: list[dict[str, Any]] = []

    async def timer_fires(times: int) -> None:
        until = fired + times
        while fired < until:
            more.clear()
            await asyncio.wait_for(more.wait(), 5.0)

    async def run() -> None:
        nonlocal writing
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        driver.poke()
        await timer_fires(1)
        filler = small_disk / "filler"
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        writing = True
        await timer_fires(3)  # each commit fails; the timer goes on
        filler.unlink()
        writing = False
        await timer_fires(2)
        driver.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert not errors, errors
    failures = [r for r in caplog.records if "joms.sqlite" in r.getMessage()]
    assert len(failures) == 1 and not any(r.exc_info for r in caplog.records), caplog.text
    assert "cannot write" in failures[0].getMessage() and "full" in failures[0].getMessage()
    store.close()
    assert SqliteServiceStore(path).get("t", "k") == big
