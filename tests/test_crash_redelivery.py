"""A delivery the core recorded but whose sink never finished (the daemon was killed in
between) is redone at restart: the dir files are written, the command runs with
DODWAN_REDELIVERED=1. A finished one is never redone."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for


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
