"""A delivery the core recorded but whose sink never finished (the daemon was killed in
between) is redone at restart: the dir files are written, the command runs with
DODWAN_REDELIVERED=1. A finished one is never redone."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path
from typing import Any

from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

from dodwan.daemon.client import AdminClient


def _forget_finished(db: Path, msg_id: str) -> int:
    """What a kill between the core's commit and the sink's work leaves behind."""
    with sqlite3.connect(db) as conn:
        return conn.execute("DELETE FROM sink_done WHERE msg_id = ?", (msg_id,)).rowcount


def test_unfinished_deliveries_are_redone_once_after_a_kill(daemons, tmp_path: Path) -> None:
    a = daemons("a", "--group", random_group(), "--announce-period", "0.5")
    out, log = tmp_path / "out", tmp_path / "exec.log"
    c = a.client()
    c.post("/subscribe", {"patterns": [{"t": "x"}], "key": "d",
                          "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
    c.post("/subscribe", {"patterns": [{"t": "x"}], "key": "e", "sink": {
        "kind": "exec", "target": f'echo "$DODWAN_ID ${{DODWAN_REDELIVERED:-0}}" >> {log}'}})  # fmt: skip
    first = c.post("/publish", {"attributes": {"t": "x"}, "text": "one", "ttl": 600})["id"]
    second = c.post("/publish", {"attributes": {"t": "x"}, "text": "two", "ttl": 600})["id"]
    wait_for(lambda: log.exists() and len(log.read_text().splitlines()) == 2, what="2 exec runs")
    wait_for(lambda: (out / f"{second}.json").exists(), what="dir deliveries")
    a.kill(signal.SIGTERM)  # clean stop: every finished delivery is on disk

    assert _forget_finished(a.state_dir / "dodwan.db", second) == 2
    (out / second).unlink()
    (out / f"{second}.json").unlink()
    a.start()
    wait_for(lambda: (out / f"{second}.json").exists(), what="dir delivery redone")
    assert (out / second).read_text() == "two"
    wait_for(lambda: len(log.read_text().splitlines()) == 3, what="exec delivery redone")
    assert sorted(log.read_text().splitlines()) == sorted(
        [f"{first} 0", f"{second} 0", f"{second} 1"]
    )
    assert a.status()["counters"]["daemon_redeliveries"] == 2

    # Nothing left to redo: another restart delivers nothing again.
    a.kill(signal.SIGKILL)
    a.start()
    assert a.status()["counters"].get("daemon_redeliveries", 0) == 0
    assert len(log.read_text().splitlines()) == 3


def test_store_tracks_unfinished_deliveries_of_dir_and_exec_sinks(tmp_path: Path) -> None:
    from dodwan.daemon.sqlite_store import SqliteStore

    s = SqliteStore(tmp_path / "db")
    s.put_sink("d", "dir", "/x")
    s.put_sink("f", "follow", "")
    for msg_id, key, deadline in (("m1", "d", 10.0), ("m2", "d", 50.0), ("m3", "f", 10.0)):
        s.add_history(msg_id, key, deadline)
    s.add_history("m1", "", 10.0)  # the host's own reception record: no sink
    s.commit()
    assert s.unfinished_deliveries() == [("m1", "d", 10.0), ("m2", "d", 50.0)]
    s.sink_done("m1", "d", 10.0)
    s.commit()
    assert s.unfinished_deliveries() == [("m2", "d", 50.0)]
    s.purge_sink_done(20.0)
    s.purge_history(20.0)
    assert s.unfinished_deliveries() == [("m2", "d", 50.0)]
    s.delete_sink("d")
    assert s.unfinished_deliveries() == []
    s.close()


NOBODYS_KEY = "11" * 32
"""A trusted key no daemon here signs with: such a subscription accepts nothing they send."""


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def _subscribe(
    c: AdminClient, key: str, topic: str, kind: str, target: str, trusted: list[str] | None = None
) -> None:
    body: dict[str, Any] = {
        "patterns": [{"topic": topic}],
        "key": key,
        "sink": {"kind": kind, "target": target},
    }
    if trusted is not None:
        body["trusted_keys"] = trusted
    c.post("/subscribe", body)


def test_a_reused_key_gets_none_of_the_old_subscriptions_deliveries_at_restart(
    daemons, tmp_path: Path
) -> None:
    """Unsubscribing and subscribing again under the same key, with other patterns and a
    trusted key, then restarting: the finished deliveries of the old subscription are not
    redone into the new sink (they used to be, unchecked against its patterns and keys)."""
    a = daemons("a", "--group", random_group(), "--announce-period", "0.5")
    sports, weather = tmp_path / "sports", tmp_path / "weather"
    log1, log2 = tmp_path / "exec1.log", tmp_path / "exec2.log"
    c = a.client()
    _subscribe(c, "feed", "sports", "dir", str(sports))
    _subscribe(
        c, "run", "sports", "exec", f'echo "$DODWAN_ID ${{DODWAN_REDELIVERED:-0}}" >> {log1}'
    )
    old = [
        c.post("/publish", {"attributes": {"topic": "sports"}, "text": f"s{i}", "ttl": 600})["id"]
        for i in range(3)
    ]
    wait_for(lambda: len(_files(sports)) == 6, what="3 dir deliveries")
    wait_for(lambda: log1.exists() and len(log1.read_text().splitlines()) == 3, what="3 runs")
    for key in ("feed", "run"):
        c.delete(f"/subscriptions/{key}")
    _subscribe(c, "feed", "weather", "dir", str(weather), [NOBODYS_KEY])
    _subscribe(c, "run", "weather", "exec", f'echo "$DODWAN_ID" >> {log2}', [NOBODYS_KEY])
    assert _files(weather) == [] and not log2.exists()

    for sig in (signal.SIGTERM, signal.SIGKILL):
        a.kill(sig)
        a.start()
        assert a.status()["counters"].get("daemon_redeliveries", 0) == 0, sig
        assert _files(weather) == [], sig
    # Commands run in the background: one started after any redone ones has finished.
    probe = tmp_path / "probe.log"
    _subscribe(a.client(), "probe", "sports", "exec", f'echo "$DODWAN_ID" >> {probe}')
    wait_for(lambda: probe.exists() and len(probe.read_text().splitlines()) == 3, what="probe")
    assert not log2.exists()
    assert sorted(log1.read_text().splitlines()) == sorted(f"{i} 0" for i in old)
    assert len(_files(sports)) == 6


def test_a_delivery_unfinished_across_a_resubscription_is_redone_once(
    daemons, tmp_path: Path
) -> None:
    """Unsubscribing and subscribing again with the same patterns and sink: a delivery the
    sink had not finished when the daemon died is redone at the next start, and only it —
    the finished ones of the same key are not."""
    a = daemons("a", "--group", random_group(), "--announce-period", "0.5")
    out, log = tmp_path / "out", tmp_path / "exec.log"
    command = f'echo "$DODWAN_ID ${{DODWAN_REDELIVERED:-0}}" >> {log}'
    c = a.client()
    _subscribe(c, "d", "x", "dir", str(out))
    _subscribe(c, "e", "x", "exec", command)
    first = c.post("/publish", {"attributes": {"topic": "x"}, "text": "one", "ttl": 600})["id"]
    second = c.post("/publish", {"attributes": {"topic": "x"}, "text": "two", "ttl": 600})["id"]
    wait_for(lambda: log.exists() and len(log.read_text().splitlines()) == 2, what="2 exec runs")
    wait_for(lambda: (out / f"{second}.json").exists(), what="dir deliveries")
    for key in ("d", "e"):
        c.delete(f"/subscriptions/{key}")
    _subscribe(c, "d", "x", "dir", str(out))
    _subscribe(c, "e", "x", "exec", command)
    a.kill(signal.SIGTERM)

    assert _forget_finished(a.state_dir / "dodwan.db", second) == 2  # as a kill would leave
    (out / second).unlink()
    (out / f"{second}.json").unlink()
    a.start()
    wait_for(lambda: (out / f"{second}.json").exists(), what="dir delivery redone")
    wait_for(lambda: len(log.read_text().splitlines()) == 3, what="exec delivery redone")
    assert sorted(log.read_text().splitlines()) == sorted(
        [f"{first} 0", f"{second} 0", f"{second} 1"]
    )
    assert a.status()["counters"]["daemon_redeliveries"] == 2


def test_an_unfinished_delivery_is_redone_only_where_the_subscription_accepts_it(
    daemons, tmp_path: Path
) -> None:
    """A delivery left unfinished by a kill, whose key now names another subscription: it is
    redone only if that subscription accepts the message (its patterns, its trusted keys);
    otherwise it is over (counted), and no later start considers it again."""
    a = daemons("a", "--group", random_group(), "--announce-period", "0.5")
    old, new = tmp_path / "old", tmp_path / "new"
    c = a.client()
    for key in ("patterns", "signed", "same"):
        _subscribe(c, key, "x", "dir", str(old / key))
    msg = c.post("/publish", {"attributes": {"topic": "x"}, "text": "one", "ttl": 600})["id"]
    wait_for(lambda: all(_files(old / k) for k in ("patterns", "signed", "same")), what="3")
    for key in ("patterns", "signed", "same"):
        c.delete(f"/subscriptions/{key}")
    _subscribe(c, "patterns", "y", "dir", str(new / "patterns"))
    _subscribe(c, "signed", "x", "dir", str(new / "signed"), [NOBODYS_KEY])
    _subscribe(c, "same", "x", "dir", str(new / "same"))
    a.kill(signal.SIGTERM)

    assert _forget_finished(a.state_dir / "dodwan.db", msg) == 3  # as a kill would leave
    a.start()
    assert _files(new / "patterns") == [] and _files(new / "signed") == []
    assert _files(new / "same") == sorted([msg, f"{msg}.json"])
    counters = a.status()["counters"]
    assert counters["daemon_redeliveries"] == 1
    assert counters["daemon_redeliveries_declined"] == 2
    a.kill(signal.SIGKILL)
    a.start()
    assert a.status()["counters"].get("daemon_redeliveries_declined", 0) == 0


def test_removing_a_sink_keeps_its_finished_deliveries(tmp_path: Path) -> None:
    """The core keeps a key's reception history after an unsubscription; the finished marks
    stay as well, so a new sink of that key finds nothing of the old one's to redo."""
    from dodwan.daemon.sqlite_store import SqliteStore

    s = SqliteStore(tmp_path / "db")
    s.put_sink("k", "exec", "true")
    s.add_history("m1", "k", 50.0)
    s.add_history("m2", "k", 60.0)
    s.sink_done("m1", "k", 50.0)
    s.commit()
    s.delete_sink("k")
    s.put_sink("k", "dir", "/y")
    s.commit()
    assert s.unfinished_deliveries() == [("m2", "k", 60.0)]  # the caller checks it still fits
    s.purge_sink_done(55.0)
    s.purge_history(55.0)
    assert s.unfinished_deliveries() == [("m2", "k", 60.0)]
    s.close()
