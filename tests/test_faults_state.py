"""Faults from outside the daemon's own process against real ``dodwan daemon`` processes
and their real SQLite files: another program reading dodwan.db, a full disk under a purge
or a ``--dir`` sink, the state directory or database removed while the daemon runs, a hung
daemon under ``subscribe --follow``, and the ``sink_done`` table's upkeep.

The disk-full tests mount a small tmpfs (root only; skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.daemon.client import ClientError


def _counters(d: DaemonProc) -> dict[str, int]:
    return d.status()["counters"]  # type: ignore[no-any-return]


def _wal_size(state: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        return (state / "dodwan.db-wal").stat().st_size
    return 0


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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs under tmp_path (unmounted at teardown)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MB tmpfs needs root")
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` with a file; returns it (unlink it to make room)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return filler


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
    filler = _fill(small_disk)
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
        filler = _fill(small_disk)
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
