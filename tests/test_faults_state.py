"""Faults from outside the daemon's own process against real ``dodwan daemon`` processes
and their real SQLite files: another program reading dodwan.db, a full disk under a purge
or a ``--dir`` sink, the state directory or database removed while the daemon runs, a hung
daemon under ``subscribe --follow``, and the ``sink_done`` table's upkeep.

The disk-full tests mount a small tmpfs (root only; skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_daemon_helpers import DaemonProc, fill_disk, random_group, wait_for
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import small_disk as small_disk

from dodwan.daemon.client import AdminClient, ClientError


def _counters(d: DaemonProc) -> dict[str, int]:
    return d.status()["counters"]  # type: ignore[no-any-return]


def _wal_size(state: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        return (state / "dodwan.db-wal").stat().st_size
    return 0


def _dir_sink(c: AdminClient, target: Path) -> None:
    """Subscribe key ``s`` (topic ``t``) with a directory sink into ``target``."""
    c.post("/subscribe", {"patterns": {"topic": "t"}, "key": "s",
                          "sink": {"kind": "dir", "target": str(target)}})  # fmt: skip


# ------------------------------------------------------------- 1. a foreign reader


@pytest.mark.timeout(120)
def test_a_foreign_reader_never_refuses_or_stalls_publications(daemons) -> None:
    """An operator's ``sqlite3`` session holding a read transaction while the log passes
    its 64 MiB limit: every publication is stored quickly, the condition is logged and
    counted, and the log is emptied once the reader has ended."""
    d = daemons("r", "--group", random_group(), "--cache-capacity", str(1 << 30))
    c = d.client()
    c.publish_bytes(b"seed", attributes={"topic": "t"}, ttl=600)
    reader = sqlite3.connect(str(d.state_dir / "dodwan.db"), isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM messages").fetchone()  # holds its snapshot
        chunk = 1_000_000
        slowest = 0.0
        published = 0
        # Past 64 MiB of log (the limit) and on, until the reader's hold is seen.
        while published < 100 or (published < 160 and not d.status()["counters"].get(
            "daemon_store_wal_held"
        )):  # fmt: skip
            t = time.monotonic()
            c.publish_bytes(os.urandom(chunk), attributes={"topic": "t"}, ttl=600)
            slowest = max(slowest, time.monotonic() - t)
            published += 1
        counters = _counters(d)
        assert counters.get("daemon_store_wal_held", 0) >= 1, counters
        assert counters.get("daemon_messages_dropped_store", 0) == 0, counters
        assert counters.get("daemon_publications_refused_store", 0) == 0, counters
        assert slowest < 3.0, f"a publication took {slowest:.1f} s"
        assert _wal_size(d.state_dir) > 64 << 20  # kept for the reader, as it must be
        log = d.log.read_text()
        assert "holds a read transaction" in log, log[-2000:]
        assert len([ln for ln in log.splitlines() if "cannot be emptied" in ln]) == 1
        health = d.status()["health"]
        assert not health["ok"] and "read transaction" in health["problems"][0], health
    finally:
        reader.execute("COMMIT")
        reader.close()
    # Reader gone: the next checkpoint empties the log, with nothing more written.
    wait_for(lambda: _wal_size(d.state_dir) < 64 << 20, timeout=15, what="the log emptied")
    wait_for(lambda: "back under its limit" in d.log.read_text(), timeout=5, what="the log line")
    assert d.status()["health"] == {"ok": True, "problems": []}


def test_a_failed_checkpoint_is_logged_once_and_counted(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Copying the log into a database file that cannot grow (disk full) fails: said in
    the log (not once per attempt) and counted, then done once there is room."""
    from dodwan.core.store import MessageMeta
    from dodwan.daemon.sqlite_store import Checkpointer, SqliteStore

    store = SqliteStore(small_disk / "d.db", checkpoint_bytes=0)
    store.put_message(MessageMeta("m1", b"z", 0, True, 1.0))
    store.put_fragments("m1", [os.urandom(700_000)])
    store.commit()
    filler = fill_disk(small_disk)
    caplog.set_level("WARNING", logger="dodwan.daemon.store")
    ck = Checkpointer(small_disk / "d.db", 64 << 20)
    ck.start()
    try:
        for _ in range(3):
            ck.poke()
            assert ck.wait_idle(10)
        lines = [r.getMessage() for r in caplog.records if "checkpoint of" in r.getMessage()]
        assert len(lines) == 1 and "full" in lines[0], lines
        assert ck.errors == 3
        filler.unlink()
        ck.poke()
        assert ck.wait_idle(10)
        assert ck.errors == 3  # done this time
        assert (small_disk / "d.db").stat().st_size > 700_000
    finally:
        ck.stop()
        store.close()


# ------------------------------------------------------------- 3. purge on a full disk


@pytest.mark.timeout(90)
def test_disk_full_purge_is_refused_and_the_message_kept(small_disk: Path, tmp_path: Path) -> None:
    """``DELETE /cache/ID`` that the database cannot store: 507 and the message stays, in
    the running daemon and after a restart; once there is room the purge is made and kept."""
    d = DaemonProc(small_disk / "st", ["--group", random_group(), "--host-id", "pf"])
    d.log = tmp_path / "pf.log"
    d.start()
    try:
        c = d.client()
        ids = [
            c.publish_bytes(os.urandom(20_000), attributes={"topic": "t"}, ttl=3600)["id"]
            for _ in range(5)
        ]
        filler = fill_disk(small_disk)
        for msg_id in ids[:3]:
            with pytest.raises(ClientError, match="cannot store the purge"):
                c.delete(f"/cache/{msg_id}")
        assert _ids(d) == set(ids)  # kept in memory
        assert d.kill(signal.SIGTERM) == 0
        filler.unlink()
        d.start()
        assert _ids(d) == set(ids)  # and in the database
        assert d.client().delete(f"/cache/{ids[0]}") == {"purged": ids[0]}
        assert d.kill(signal.SIGTERM) == 0
        d.start()
        assert _ids(d) == set(ids[1:])
    finally:
        d.kill()
    assert "Traceback" not in d.log.read_text()


def _ids(d: DaemonProc) -> set[str]:
    return {e["descriptor"]["id"] for e in d.client().get("/cache")}


# ------------------------------------------------------------- 4, 5. state removed under a daemon


def test_a_clean_stop_leaves_the_admin_file_of_the_daemon_started_after_an_rm(
    daemons, tmp_path: Path
) -> None:
    """``rm -rf STATE_DIR`` under daemon A, then daemon B starts there (the lock went with
    the directory): A's clean stop leaves B's admin.json, so the CLI still reaches B."""
    group = random_group()
    a = daemons("lk", "--group", group, "--host-id", "A")
    shutil.rmtree(a.state_dir)
    b = DaemonProc(a.state_dir, ["--group", group, "--host-id", "B"])
    b.log = tmp_path / "lkB.log"
    b.start()
    try:
        assert a.kill(signal.SIGTERM) == 0
        assert (b.state_dir / "admin.json").exists()
        r = subprocess.run(
            [sys.executable, "-m", "dodwan.cli", "--state-dir", str(b.state_dir), "status"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0 and "B" in r.stdout, r.stderr
    finally:
        b.kill()


def test_a_removed_state_directory_is_noticed_and_publications_refused(daemons) -> None:
    """``rm -rf STATE_DIR`` under a daemon: it says so (ERROR line, counter, /status
    health) and refuses publications it could not keep (503)."""
    a = daemons("gone", "--group", random_group())
    ca = a.client()  # its address, read before admin.json goes with the directory
    shutil.rmtree(a.state_dir)
    st = wait_for(lambda: (s := ca.get("/status")) and not s["health"]["ok"] and s, timeout=10,
                  what="health saying the state is gone")  # fmt: skip
    assert "state lost" in st["health"]["problems"][0], st["health"]
    assert st["counters"]["daemon_state_lost"] == 1
    with pytest.raises(ClientError, match="state is gone"):
        ca.publish_bytes(b"x", attributes={"topic": "t"})
    assert "ERROR" in a.log.read_text() and "was removed" in a.log.read_text()


def test_a_deleted_database_refuses_publications_instead_of_losing_them(daemons) -> None:
    """``dodwan.db`` (and its side files) deleted while the daemon runs: publications are
    refused with 503 instead of acknowledged and lost at the next start."""
    d = daemons("dd", "--group", random_group())
    c = d.client()
    kept = c.publish_bytes(b"before", attributes={"topic": "t"}, ttl=600)["id"]
    for name in ("dodwan.db", "dodwan.db-wal", "dodwan.db-shm"):
        (d.state_dir / name).unlink(missing_ok=True)
    wait_for(lambda: not d.status()["health"]["ok"], timeout=10, what="health not ok")
    with pytest.raises(ClientError, match=r"state is gone .*dodwan\.db was removed"):
        c.publish_bytes(b"after", attributes={"topic": "t"}, ttl=600)
    with pytest.raises(ClientError, match="state is gone"):
        c.post("/subscribe", {"patterns": {"topic": "t"},
                              "sink": {"kind": "dir", "target": str(d.state_dir / "o")}})  # fmt: skip
    assert _ids(d) == {kept}  # what it holds, it still carries
    assert d.status()["counters"]["daemon_state_lost"] == 1


# ------------------------------------------------------------- 2. a dir sink on a full disk


def _resize(disk: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _delivered(out: Path) -> set[str]:
    return {p.name[: -len(".json")] for p in out.glob("*.json") if not p.name.startswith(".")}


@pytest.mark.timeout(120)
def test_dir_sink_on_a_full_disk_holds_ids_not_payloads_and_delivers_everything(
    small_disk: Path, tmp_path: Path
) -> None:
    """A ``--dir`` sink whose disk is full: the waiting deliveries hold no payloads (RSS
    does not grow with them), one log line says so, no ``.NAME.tmp`` is left behind; once
    there is room every delivery is written, those waiting at a stop after the restart."""
    conf = tmp_path / "d.toml"
    # RSS then shows what the sink holds; no payload kept by the waiting deliveries
    conf.write_text("fragment_cache = 0\ndir_wait_memory = 0\n")
    args = ["--config", str(conf), "--group", random_group(), "--host-id", "sf",
            "--cache-capacity", str(1 << 30)]  # fmt: skip
    d = DaemonProc(tmp_path / "sf", args)
    d.start()
    try:
        c = d.client()
        _dir_sink(c, small_disk)
        filler = fill_disk(small_disk)
        assert d.proc is not None
        lines0 = len(d.log.read_text().splitlines())
        payloads = {}
        for i in range(150):  # 30 MB of payloads waiting
            data = os.urandom(200_000)
            payloads[c.publish_bytes(data, attributes={"topic": "t"}, ttl=3600)["id"]] = data
            if i == 9:
                rss0 = _rss_kb(d.proc.pid)
        wait_for(lambda: _counters(d).get("sink_errors") == 150, timeout=20,
                 what="150 deliveries failed")  # fmt: skip
        grown = (_rss_kb(d.proc.pid) - rss0) / 1024
        assert grown < 12, f"RSS grew by {grown:.1f} MB for 28 MB of waiting payloads"
        assert _counters(d)["sink_dir_waiting"] == 150
        new_lines = d.log.read_text().splitlines()[lines0:]
        assert len([ln for ln in new_lines if "cannot write" in ln]) == 1, new_lines[:5]
        assert not [p.name for p in small_disk.iterdir() if p.name.endswith(".tmp")]
        # Room again (the tmpfs grown, the filler gone): every waiting delivery is written.
        _resize(small_disk, "64m")
        filler.unlink()
        wait_for(lambda: _delivered(small_disk) == set(payloads), timeout=30,
                 what="the waiting deliveries written")  # fmt: skip
        for msg_id, data in payloads.items():
            assert (small_disk / msg_id).read_bytes() == data
        wait_for(lambda: "takes writes again" in d.log.read_text(), timeout=5, what="log")
        # Full again, and the daemon stopped while deliveries wait: after a start with room,
        # they are written (redone: none was recorded finished).
        for p in small_disk.iterdir():
            p.unlink()
        _resize(small_disk, "2m")
        filler = fill_disk(small_disk)
        later = {c.publish_bytes(os.urandom(100_000), attributes={"topic": "t"})["id"]
                 for _ in range(10)}  # fmt: skip
        wait_for(lambda: _counters(d).get("sink_dir_waiting") == 10, timeout=20,
                 what="10 deliveries waiting")  # fmt: skip
        assert d.kill(signal.SIGTERM) == 0
        filler.unlink()
        _resize(small_disk, "64m")
        d.start()
        wait_for(lambda: _delivered(small_disk) == later, timeout=20,
                 what="the deliveries waiting at the stop written after the start")  # fmt: skip
        assert not [p.name for p in small_disk.iterdir() if p.name.endswith(".tmp")]
    finally:
        d.kill()
    assert "Traceback" not in d.log.read_text()


@pytest.mark.timeout(90)
def test_a_waiting_dir_delivery_keeps_its_payload_when_the_message_leaves_the_cache(
    small_disk: Path, tmp_path: Path
) -> None:
    """A ``--dir`` delivery waiting for room held only its message id: when the message
    left the cache meanwhile (purged here; evicted or expired alike), it was given up and
    lost for good (no sink_done row, so the next start could not redo it). Within
    ``dir_wait_memory`` the waiting deliveries keep their payloads and are written once
    there is room; beyond it they hold ids only and are given up, counted."""
    conf = tmp_path / "d.toml"
    conf.write_text("dir_wait_memory = 250000\n")  # two of the three payloads
    d = DaemonProc(tmp_path / "wk", ["--config", str(conf), "--group", random_group()])
    d.start()
    try:
        c = d.client()
        _dir_sink(c, small_disk)
        filler = fill_disk(small_disk)
        sent = [os.urandom(100_000) for _ in range(3)]
        ids = [c.publish_bytes(data, attributes={"topic": "t"})["id"] for data in sent]
        wait_for(lambda: _counters(d).get("sink_dir_waiting") == 3, timeout=20,
                 what="3 deliveries waiting")  # fmt: skip
        for msg_id in ids:
            assert c.delete(f"/cache/{msg_id}") == {"purged": msg_id}
        assert _ids(d) == set()
        _resize(small_disk, "64m")
        filler.unlink()
        wait_for(lambda: _counters(d).get("sink_dir_waiting") == 0, timeout=30,
                 what="the waiting deliveries done")  # fmt: skip
        assert _delivered(small_disk) == set(ids[:2])
        for msg_id, data in zip(ids[:2], sent[:2], strict=True):
            assert (small_disk / msg_id).read_bytes() == data
        assert _counters(d).get("sink_dir_given_up") == 1  # the one beyond the budget
    finally:
        d.kill()
    assert "Traceback" not in d.log.read_text()


# ------------------------------------------------------------- 7. sink_done upkeep


def _rows(db: Path, table: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def test_sink_done_rows_go_with_the_reception_history_at_expiry(daemons, tmp_path: Path) -> None:
    """A finished dir delivery's ``sink_done`` row goes when its message expires, with the
    reception history (not at some later delivery)."""
    d = daemons("sd", "--group", random_group())
    out = tmp_path / "out"
    d.client().post("/subscribe", {"patterns": {"topic": "t"},
                                   "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
    msg_id = d.client().publish_bytes(b"short-lived", attributes={"topic": "t"}, ttl=2)["id"]
    db = d.state_dir / "dodwan.db"
    wait_for(lambda: (out / f"{msg_id}.json").exists() and _rows(db, "sink_done") == 1,
             timeout=10, what="the delivery recorded finished")  # fmt: skip
    assert _rows(db, "history") == 1
    wait_for(lambda: _rows(db, "history") == 0, timeout=20, what="the history purged")
    assert _rows(db, "sink_done") == 0


# ------------------------------------------------------------- 6. follow a hung daemon


def test_follow_of_a_hung_daemon_ends_with_an_error_after_missed_heartbeats(daemons) -> None:
    """``subscribe --follow`` (the client's stream, which the CLI uses) against a daemon that
    stops answering (SIGSTOP): an idle stream is kept alive by heartbeats, a hung one ends
    with a clear error after three missed ones instead of waiting for ever."""
    d = daemons("hb", "--group", random_group())
    client = d.client()
    stream = client.stream("/follow", {"patterns": {"topic": "hb"}, "key": "w"}, heartbeat=0.5)
    assert next(stream) == {"subscribed": "w"}
    time.sleep(2.5)  # idle for five heartbeats: the stream must stay up
    d.client().publish_bytes(b"still here", attributes={"topic": "hb"})
    assert next(stream)["text"] == "still here"
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        with pytest.raises(ClientError, match="sent nothing on the stream"):
            next(stream)
        assert time.monotonic() - t < 10
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)


@pytest.mark.timeout(30)
def test_a_follow_stream_opened_on_a_stopped_daemon_is_timed(daemons) -> None:
    """A new ``/follow`` stream to a SIGSTOPped daemon: its connection and answer are
    timed like any request (before: no timeout at all for a stream, so it hung)."""
    d = daemons("hbs", "--group", random_group())
    client = d.client()
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        hung = AdminClient(client.host, client.port, timeout=2.0)
        t = time.monotonic()
        with pytest.raises(ClientError, match="did not answer within 2 s"):
            next(hung.stream("/follow", {"patterns": {"topic": "hb"}}))
        assert time.monotonic() - t < 10
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
