"""The core's :class:`~dodwan.core.store.Store` on SQLite, plus the daemon's own tables.

One database file per host (``STATE_DIR/dodwan.db``) in WAL mode with ``synchronous=NORMAL``:
writes accumulate in one open transaction that :meth:`SqliteStore.commit` closes, and the
core calls ``commit()`` at the end of every input. A committed transaction survives the
process being killed (``kill -9``); only an operating-system crash or power loss may lose the
last few transactions (that would need ``synchronous=FULL``, see ``sqlite_synchronous``).

Batching: a transaction holding nothing but fragments of still-incomplete messages is kept
open for up to ``commit_delay`` seconds (or ``commit_batch`` writes) by ``commit()``; any
write that matters for the durability promise — a local publication, a completed or
delivered message (reception history), a subscription, a deletion, a sink, the host id —
makes the next ``commit()`` real. So a published or completely received message is durable
when the core call returns, and a crash loses at most a fraction of a second of partial
fragments, which are simply fetched again. ``commit_delay=0`` commits every input.
Fragment rows are written with one ``executemany`` when the transaction is flushed (or
before a read that needs them), not a statement per fragment.

The schema is versioned: :data:`MIGRATIONS` is applied in order and each applied version is
recorded in the ``migrations`` table, so a newer daemon upgrades an older state directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from ..core.store import MessageMeta
from .private import private_sqlite

log = logging.getLogger("dodwan.daemon.store")

_PUT_MESSAGE = (
    "INSERT OR REPLACE INTO messages(msg_id, zdesc, hops, local, received) VALUES (?, ?, ?, ?, ?)"
)
_ADD_HISTORY = "INSERT OR REPLACE INTO history(msg_id, key, deadline) VALUES (?, ?, ?)"


def _v1(db: sqlite_utils.Database) -> None:
    db.table("meta").create({"key": str, "value": str}, pk="key")
    db.table("messages").create(
        {"msg_id": str, "zdesc": bytes, "hops": int, "local": int, "received": float},
        pk="msg_id",
    )
    db.table("fragments").create({"msg_id": str, "idx": int, "data": bytes}, pk=("msg_id", "idx"))
    db.table("history").create({"msg_id": str, "key": str, "deadline": float}, pk=("msg_id", "key"))
    db.table("history").create_index(["deadline"])
    db.table("subscriptions").create({"key": str, "specs": str}, pk="key")


def _v2(db: sqlite_utils.Database) -> None:
    db.table("sinks").create({"key": str, "kind": str, "target": str, "created": float}, pk="key")


def _v3(db: sqlite_utils.Database) -> None:
    db.table("sink_done").create(
        {"msg_id": str, "key": str, "deadline": float}, pk=("msg_id", "key")
    )
    db.table("sink_done").create_index(["deadline"])
    # Deliveries made before this table existed are taken as done.
    db.execute("INSERT OR IGNORE INTO sink_done SELECT msg_id, key, deadline FROM history")


MIGRATIONS: list[tuple[int, str, Callable[[sqlite_utils.Database], None]]] = [
    (1, "core store: meta, messages, fragments, history, subscriptions", _v1),
    (2, "daemon subscription sinks", _v2),
    (3, "deliveries a sink has finished (the others are redone after a crash)", _v3),
]
"""(version, description, function) applied in order to bring a database up to date."""

SCHEMA_VERSION = MIGRATIONS[-1][0]


class StoreError(Exception):
    """The database cannot be opened or is newer than this program."""


SQLITE_MAGIC = b"SQLite format 3\x00"
RECOVERY = "run `dodwan check` for details and `dodwan repair` to salvage its messages"


def sqlite_files(path: Path) -> list[Path]:
    """``path`` and the files SQLite keeps beside it (write-ahead log, shared memory, journal)."""
    return [path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal"))]


def disk_room(path: Path) -> str:
    """'; its disk is full …' when the file system holding ``path`` has (almost) no room
    left for this process, else ''."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= 1 << 20:
        return ""
    return f"; its disk is full ({free} bytes free for it): make room and start again"


def check_plain_files(paths: Iterable[Path]) -> None:
    """Refuse, before anything opens it, a path that exists and is not a regular file (a
    directory, or a FIFO that would block the open): SQLite would only say "unable to open
    database file" or "disk I/O error" for a directory beside a database."""
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreError(f"cannot use {path}: {exc.strerror}") from None
        if stat.S_ISDIR(mode):
            raise StoreError(f"cannot use {path}: Is a directory (a file is expected there)")
        if not stat.S_ISREG(mode):
            raise StoreError(f"cannot use {path}: not a regular file")


def check_file(path: Path) -> None:
    """Refuse, before SQLite touches it, a file that cannot be a DoDWAN database.

    SQLite would take an empty file as a new database (silently starting with an empty
    store) and only say "file is not a database" for a foreign one at the first read.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    if not head:
        raise StoreError(
            f"{path} is empty (0 bytes), not a DoDWAN database; move it away to start afresh, "
            "or run `dodwan repair` to replace it with a fresh one"
        )
    if head != SQLITE_MAGIC:
        raise StoreError(
            f"{path} is not a DoDWAN database (not an SQLite file); move it away, or run "
            "`dodwan repair` to replace it with a fresh one"
        )


@dataclass(frozen=True, slots=True)
class SinkRow:
    """Where deliveries for one subscription key go (see :mod:`dodwan.daemon.sinks`)."""

    key: str
    kind: str
    target: str


class Checkpointer(threading.Thread):
    """Copies the write-ahead log back into the database on its own connection (used by
    :class:`SqliteStore` and by the JOMS service's store).

    SQLite's automatic checkpoint runs inside a ``commit()`` and fsyncs both files, which
    stalled the daemon's event loop for milliseconds every few megabytes written. This
    thread does a PASSIVE checkpoint when the store pokes it; SQLite releases the GIL while
    it works, so the loop keeps serving datagrams. Under continuous writes a PASSIVE
    checkpoint never finds the log idle, so SQLite never starts it over and the file keeps
    growing: past ``wal_limit`` bytes the thread runs a TRUNCATE checkpoint, which empties
    the file.

    A TRUNCATE checkpoint holds back every new writer while it waits for the readers, so
    it waits for them at most :data:`TRUNCATE_WAIT`: when another connection (an
    operator's ``sqlite3`` session, a backup tool) holds a read transaction on the file,
    the PASSIVE checkpoint cannot copy the frames that reader may still need, and the
    TRUNCATE is not tried at all (``held``); one that still meets a reader gives up within
    that wait and is tried again. The log then grows past the limit — logged once per
    episode and counted (``wal_held``) — and is emptied at a checkpoint after the reader
    has ended. The store's writers are never refused or stalled because of a foreign
    reader.

    A checkpoint that fails (disk full, I/O error) is logged (at most once a minute) and
    counted (``errors``); it is tried again at the next poke.
    """

    TRUNCATE_WAIT = 0.01
    """Seconds one TRUNCATE checkpoint may wait for the write lock or for the readers (its
    busy timeout): the longest it holds back the store's next transaction."""
    TRUNCATE_TRIES = 2.0
    """Seconds over which a busy TRUNCATE checkpoint is tried again (the store's open
    transaction holds the write lock) before waiting for the next poke."""
    LOG_EVERY = 60.0
    """Seconds between two log lines about checkpoint errors."""

    def __init__(self, path: Path, wal_limit: int) -> None:
        super().__init__(name="dodwan-checkpoint", daemon=True)
        self._path = path
        self._wal_limit = wal_limit
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._asked = 0  # pokes so far
        self._done = 0  # pokes answered by a finished checkpoint
        self._stopping = False
        self.runs = 0
        self.truncations = 0
        self.errors = 0  # checkpoints that failed (sqlite3.Error)
        self.wal_held = 0  # checkpoints that left the log over wal_limit because of a reader
        self.wal_bytes = 0  # size of the log at the last checkpoint (bytes)
        self.held = False  # the log is over wal_limit and a reader keeps it from emptying
        self.error: str | None = None  # the last checkpoint error
        self._error_logged = 0.0

    def run(self) -> None:
        conn = sqlite3.connect(str(self._path), timeout=30.0)
        try:
            frame = int(conn.execute("PRAGMA page_size").fetchone()[0]) + 24
            while True:
                self._wake.wait()
                with self._cond:
                    self._wake.clear()
                    asked = self._asked
                if self._stopping:
                    return
                try:
                    self._checkpoint(conn, frame)
                except sqlite3.Error as exc:  # retried at the next poke
                    self._failed(exc)
                with self._cond:
                    self._done = asked
                    self._cond.notify_all()
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection, frame: int) -> None:
        deadline = time.monotonic() + self.TRUNCATE_TRIES
        while True:
            row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.runs += 1
            if row is None:
                return
            frames, copied = int(row[1]), int(row[2])
            self.wal_bytes = max(frames, 0) * frame
            if self.wal_bytes <= self._wal_limit:
                self._release()
                return
            if 0 <= copied < frames:  # a reader's snapshot still needs the frames left
                self._hold(frames - copied, frame)
                return
            # Busy: the store's transaction holds the write lock (waited for by trying
            # again), or a reader came in since (tried again at the next poke).
            conn.execute(f"PRAGMA busy_timeout={int(self.TRUNCATE_WAIT * 1000)}")
            try:
                row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                conn.execute("PRAGMA busy_timeout=30000")
            if row is None or not int(row[0]):
                self.truncations += 1
                self.wal_bytes = 0
                self._release()
                return
            if self._stopping or time.monotonic() >= deadline:
                return
            time.sleep(self.TRUNCATE_WAIT)

    def _hold(self, frames_left: int, frame: int) -> None:
        self.wal_held += 1
        if not self.held:
            self.held = True
            log.warning(
                "the write-ahead log %s-wal is %.1f MB, over its %.1f MB limit, and cannot be "
                "emptied: another connection holds a read transaction on %s (an sqlite3 "
                "session, a backup?)%s; writes go on and the log grows until that reader "
                "ends (counted in daemon_store_wal_held)",
                self._path,
                self.wal_bytes / 1e6,
                self._wal_limit / 1e6,
                self._path,
                f", keeping {frames_left * frame / 1e6:.1f} MB of it from the database"
                if frames_left
                else "",
            )

    def _release(self) -> None:
        if self.held:
            self.held = False
            log.info("the write-ahead log %s-wal is back under its limit", self._path)

    def _failed(self, exc: sqlite3.Error) -> None:
        self.errors += 1
        self.error = str(exc)
        now = time.monotonic()
        if now - self._error_logged >= self.LOG_EVERY or not self._error_logged:
            self._error_logged = now
            log.warning(
                "checkpoint of %s failed: %s (retried; %d failure(s) so far, counted in "
                "daemon_store_checkpoint_errors; one line a minute)",
                self._path,
                exc,
                self.errors,
            )

    def poke(self) -> None:
        with self._cond:
            self._asked += 1
            self._wake.set()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every checkpoint asked for so far has run (for tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= self._asked, timeout)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self.join(30)


class _Volatile:
    """:meth:`SqliteStore.volatile` (a class, not a generator: it is entered per message)."""

    __slots__ = ("_store",)

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        self._store._volatile_next = True

    def __exit__(self, *exc: object) -> None:
        self._store._volatile_next = False


class SqliteStore:
    """Durable :class:`~dodwan.core.store.Store` with a meta table and subscription sinks."""

    def __init__(
        self,
        path: str | Path,
        synchronous: str = "NORMAL",
        commit_delay: float = 0.0,
        commit_batch: int = 4096,
        fragment_cache: int = 32 * 1024 * 1024,
        checkpoint_bytes: int = 4 * 1024 * 1024,
        wal_limit: int = 64 * 1024 * 1024,
        quick_check: bool = True,
        volatile_limit: int = 16 * 1024 * 1024,
    ) -> None:
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"bad sqlite synchronous mode {synchronous!r}")
        if commit_delay < 0 or commit_batch < 1:
            raise ValueError("commit_delay must be >= 0 and commit_batch >= 1")
        self.path = Path(path)
        self.commit_delay = commit_delay
        self.commit_batch = commit_batch
        self._pending = 0  # writes in the open transaction
        self._must = False  # one of them must be durable at the next commit()
        self._held = 0  # depth of hold(): commit() waits for the outermost to end
        self._since = 0.0  # monotonic time of the first pending write
        self.commits = 0
        # Fragments written since the last commit, inserted with one ``executemany`` when the
        # transaction is flushed (a statement per fragment cost more than the protocol work).
        self._unwritten: list[tuple[str, int, bytes]] = []
        # Message and history rows (one of each per publication or delivery), inserted with
        # one ``executemany`` per statement, in order, before any other statement or read,
        # and at the flush: a statement per row cost about 7 us, as much as the core's work
        # on a delivery to a local subscription. (Each statement writes its own table, so
        # the rows of one may go in before those of another written earlier.)
        self._later: dict[str, list[Sequence[object]]] = {}
        # Recently written or read fragments, per message in least-recently-used order, so
        # serving a fresh message or reassembling a completed one does not read back what
        # was just written (bounded in bytes; whole messages are evicted).
        self._frags: OrderedDict[str, dict[int, bytes]] = OrderedDict()
        self._frags_bytes = 0
        self._frags_limit = max(0, fragment_cache)
        # Publications made inside volatile(): kept here only (no rows), up to
        # ``volatile_limit`` bytes of descriptors and fragments.
        self.volatile_limit = max(0, volatile_limit)
        self._volatile: dict[str, tuple[MessageMeta, dict[int, bytes]]] = {}
        self._volatile_bytes = 0
        self._volatile_next = False  # inside volatile(): the next new message is volatile
        self._volatile_cm = _Volatile(self)
        # Background checkpoints after about ``checkpoint_bytes`` committed (0: SQLite's own
        # automatic checkpoints inside commit()).
        self.checkpoint_bytes = checkpoint_bytes
        self.wal_limit = wal_limit
        self._wal_bytes = 0  # estimate of what was committed since the last checkpoint
        self._rows = 0  # writes other than fragments in the open transaction
        self._checkpointer: Checkpointer | None = None
        # Write failures (disk full, I/O error): the open transaction is rolled back and the
        # ids of the messages it wrote are handed to the daemon (take_failed), which drops
        # them from the core, so nothing is announced or delivered that is not stored.
        self._touched: set[str] = set()  # messages written in the open transaction
        self._failed: set[str] = set()  # messages whose writes were rolled back
        self._deleting: set[str] = set()  # messages deleted in the open transaction
        self._redo_deletes: set[str] = set()  # deletions rolled back: redone at the next flush
        # Subscriptions the core dropped (in memory) in the open transaction, and those whose
        # deletion was rolled back: redone at the next flush, or the row would come back at
        # the next start with nothing behind it (a JOMS consumer's, say). A caller that
        # keeps the subscription after a failed deletion says so (keep_subscription).
        self._sub_deleting: set[str] = set()
        self._redo_sub_deletes: set[str] = set()
        self._broken = False  # a write of the open transaction failed
        self.write_failures = 0
        self.read_errors = 0
        self.last_error = ""
        check_plain_files(sqlite_files(self.path))
        try:  # owner-only, made so before SQLite creates it or its log (docs/security.md)
            private_sqlite(self.path)
        except OSError as exc:
            raise StoreError(f"cannot use {self.path}: {exc.strerror}") from None
        check_file(self.path)
        try:
            conn = sqlite3.connect(str(self.path), check_same_thread=False)
            self.db = sqlite_utils.Database(conn)
            if quick_check:
                self._quick_check(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys=OFF")
            if checkpoint_bytes > 0:
                conn.execute("PRAGMA wal_autocheckpoint=0")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from None
        self.conn = conn

    # ------------------------------------------------------------------ schema

    def _quick_check(self, conn: sqlite3.Connection) -> None:
        """SQLite's ``quick_check`` (page structure, no index cross-check) and our tables."""
        try:
            rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)")]
        except sqlite3.OperationalError as exc:
            # The file system refused (disk full, I/O error, locked): not damage. A cleanly
            # closed WAL database needs room for its -shm and -wal files to be read at all.
            raise StoreError(f"cannot open {self.path} ({exc}){disk_room(self.path)}") from None
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                raise StoreError(
                    f"{self.path} is not a DoDWAN database ({exc}); move it away, or run "
                    "`dodwan repair` to replace it with a fresh one"
                ) from None
            raise StoreError(f"{self.path} is damaged ({exc}); {RECOVERY}") from None
        if rows != ["ok"]:
            raise StoreError(f"{self.path} is damaged ({rows[0]}); {RECOVERY}")
        tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master")}
        if tables and "migrations" not in tables:
            raise StoreError(
                f"{self.path} is not a DoDWAN database (an SQLite database with tables "
                f"{', '.join(sorted(tables)[:5])}); move it away"
            )

    def _migrate(self) -> None:
        db = self.db
        if "migrations" not in db.table_names():
            db.table("migrations").create(
                {"version": int, "name": str, "applied": float}, pk="version"
            )
        done = {row["version"] for row in db.table("migrations").rows}
        newest = max(done, default=0)
        if newest > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {newest}, newer than this program's {SCHEMA_VERSION}"
            )
        for version, name, apply in MIGRATIONS:
            if version in done:
                continue
            with db.conn:
                apply(db)
                db.table("migrations").insert(
                    {"version": version, "name": name, "applied": time.time()}
                )

    def schema_version(self) -> int:
        return max((row["version"] for row in self.db.table("migrations").rows), default=0)

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._wrote(True)
        self._exec(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # ------------------------------------------------------------------ core Store

    def volatile(self) -> contextlib.AbstractContextManager[None]:
        """Around a publication that need not survive a restart (a JMS NON_PERSISTENT
        message: at most once across a crash): the message it stores is kept in memory
        only — no row for it, its fragments or its deliveries (reception history) — as
        long as the messages so held stay within ``volatile_limit`` bytes; beyond that it
        is stored like any other. Gone after a restart, it is served to neighbours and
        read back meanwhile like the others; the core's eviction and deadlines free it."""
        return self._volatile_cm

    def is_volatile(self, msg_id: str) -> bool:
        """Whether ``msg_id`` is held in memory only (see :meth:`volatile`)."""
        return msg_id in self._volatile

    @property
    def volatile_bytes(self) -> int:
        """Bytes of descriptors and fragments held in memory only."""
        return self._volatile_bytes

    def _hold_volatile(self, meta: MessageMeta) -> bool:
        held = self._volatile.get(meta.msg_id)
        if held is None:
            if not self._volatile_next:
                return False
            if self._volatile_bytes + len(meta.zdesc) > self.volatile_limit:
                return False
            self._volatile[meta.msg_id] = (meta, {})
            self._volatile_bytes += len(meta.zdesc)
        else:
            self._volatile[meta.msg_id] = (meta, held[1])
            self._volatile_bytes += len(meta.zdesc) - len(held[0].zdesc)
        # a transaction that fails drops it from the core like the stored ones
        self._touched.add(meta.msg_id)
        return True

    def _volatile_fragments(self, msg_id: str, rows: Sequence[tuple[int, bytes]]) -> bool:
        """Keep fragments of a volatile message in memory; past the limit, the message is
        stored after all (its row and fragments written) and this returns False."""
        held = self._volatile.get(msg_id)
        if held is None:
            return False
        frags = held[1]
        grow = sum(len(d) - len(frags.get(i, b"")) for i, d in rows)
        if self._volatile_bytes + grow <= self.volatile_limit:
            frags.update(rows)
            self._volatile_bytes += grow
            return True
        del self._volatile[msg_id]
        self._volatile_bytes -= len(held[0].zdesc) + sum(map(len, frags.values()))
        self._store_message(held[0])
        for i, d in frags.items():
            self.put_fragment(msg_id, i, d)
        return False

    def put_message(self, meta: MessageMeta) -> None:
        if self._hold_volatile(meta):
            return
        self._store_message(meta)

    def _store_message(self, meta: MessageMeta) -> None:
        self._wrote(meta.local)
        self._touched.add(meta.msg_id)
        self._deleting.discard(meta.msg_id)
        self._redo_deletes.discard(meta.msg_id)
        self._exec_later(
            _PUT_MESSAGE,
            (meta.msg_id, meta.zdesc, meta.hops, int(meta.local), meta.received),
        )

    def delete_message(self, msg_id: str) -> None:
        held = self._volatile.pop(msg_id, None)
        if held is not None:  # never written: nothing to delete in the file
            self._volatile_bytes -= len(held[0].zdesc) + sum(map(len, held[1].values()))
            return
        self._wrote(True)
        self._deleting.add(msg_id)
        self._forget(msg_id)
        if self._unwritten:
            self._unwritten = [f for f in self._unwritten if f[0] != msg_id]
        self._exec("DELETE FROM fragments WHERE msg_id = ?", (msg_id,))
        self._exec("DELETE FROM messages WHERE msg_id = ?", (msg_id,))

    def keep_message(self, msg_id: str) -> None:
        """Forget a deletion of ``msg_id`` not yet committed or rolled back: the caller keeps
        the message (its purge was refused because it could not be stored)."""
        self._deleting.discard(msg_id)
        self._redo_deletes.discard(msg_id)

    def put_fragment(self, msg_id: str, index: int, data: bytes) -> None:
        data = bytes(data)
        if msg_id in self._volatile and self._volatile_fragments(msg_id, [(index, data)]):
            return
        self._pend(1)
        self._touched.add(msg_id)
        self._unwritten.append((msg_id, index, data))
        self._remember(msg_id, index, data)

    def put_fragments(self, msg_id: str, chunks: Sequence[bytes]) -> None:
        if msg_id in self._volatile and self._volatile_fragments(
            msg_id, [(i, bytes(c)) for i, c in enumerate(chunks)]
        ):
            return
        self._pend(len(chunks))
        self._touched.add(msg_id)
        rows = [(msg_id, i, bytes(c)) for i, c in enumerate(chunks)]
        self._unwritten.extend(rows)
        total = sum(len(r[2]) for r in rows)
        if total <= self._frags_limit:
            self._forget(msg_id)
            self._frags[msg_id] = {i: data for _, i, data in rows}
            self._frags_bytes += total
            self._trim()

    def get_fragment(self, msg_id: str, index: int) -> bytes | None:
        volatile = self._volatile.get(msg_id)
        if volatile is not None:
            return volatile[1].get(index)
        held = self._frags.get(msg_id)
        if held is not None:
            data = held.get(index)
            if data is not None:
                return data
        try:
            self._write_fragments()  # a fragment evicted from memory may not be in a row yet
        except sqlite3.Error as exc:
            self._fail(exc)
        try:
            row = self.conn.execute(
                "SELECT data FROM fragments WHERE msg_id = ? AND idx = ?", (msg_id, index)
            ).fetchone()
        except sqlite3.DatabaseError as exc:  # a damaged page: the fragment is unreadable
            self.read_errors += 1
            self.last_error = str(exc)
            return None
        if row is None:
            return None
        data = bytes(row[0])
        self._remember(msg_id, index, data)
        return data

    def _write_fragments(self) -> None:
        if self._unwritten:
            rows, self._unwritten = self._unwritten, []
            self._wal_bytes += sum(len(r[2]) for r in rows)
            self.conn.executemany(
                "INSERT OR REPLACE INTO fragments(msg_id, idx, data) VALUES (?, ?, ?)", rows
            )

    def _remember(self, msg_id: str, index: int, data: bytes) -> None:
        if len(data) > self._frags_limit:
            return
        frags = self._frags
        held = frags.get(msg_id)
        if held is None:
            held = frags[msg_id] = {}
        else:
            frags.move_to_end(msg_id)
        old = held.get(index)
        held[index] = data
        self._frags_bytes += len(data) - (len(old) if old is not None else 0)
        self._trim()

    def _trim(self) -> None:
        """Evict least recently used messages until the cached fragments fit the limit."""
        while self._frags_bytes > self._frags_limit:
            _, dropped = self._frags.popitem(last=False)
            self._frags_bytes -= sum(map(len, dropped.values()))

    def _forget(self, msg_id: str) -> None:
        held = self._frags.pop(msg_id, None)
        if held is not None:
            self._frags_bytes -= sum(map(len, held.values()))

    def iter_messages(self) -> Iterable[tuple[MessageMeta, list[int]]]:
        self._write_later()
        self._write_fragments()
        indexes: dict[str, list[int]] = {}
        for msg_id, idx in self.conn.execute(
            "SELECT msg_id, idx FROM fragments ORDER BY msg_id, idx"
        ):
            indexes.setdefault(msg_id, []).append(idx)
        rows = self.conn.execute(
            "SELECT msg_id, zdesc, hops, local, received FROM messages ORDER BY msg_id"
        ).fetchall()
        for msg_id, zdesc, hops, local, received in rows:
            meta = MessageMeta(msg_id, bytes(zdesc), int(hops), bool(local), float(received))
            yield meta, indexes.get(msg_id, [])

    def add_history(self, msg_id: str, key: str, deadline: float) -> None:
        if msg_id in self._volatile:  # the message does not survive a restart either
            return
        self._wrote(True)
        self._exec_later(_ADD_HISTORY, (msg_id, key, deadline))

    def iter_history(self) -> Iterable[tuple[str, str, float]]:
        self._write_later()
        return [
            (str(a), str(b), float(c))
            for a, b, c in self.conn.execute("SELECT msg_id, key, deadline FROM history")
        ]

    def purge_history(self, before: float) -> None:
        """Forget the reception history of expired messages, and with it which deliveries
        of them the sinks finished (``sink_done``): both go when the message expires."""
        self._wrote(True)
        self._exec("DELETE FROM history WHERE deadline < ?", (before,))
        self._exec("DELETE FROM sink_done WHERE deadline < ?", (before,))

    def put_subscription(self, key: str, specs: list[dict[str, str]]) -> None:
        self.keep_subscription(key)  # the latest write wins
        self._wrote(True)
        self._exec(
            "INSERT OR REPLACE INTO subscriptions(key, specs) VALUES (?, ?)",
            (key, json.dumps(specs, sort_keys=True)),
        )

    def delete_subscription(self, key: str) -> None:
        """Delete a subscription's row; if the transaction is rolled back (disk full), the
        deletion is redone by the next flush that succeeds (see keep_subscription)."""
        self._sub_deleting.add(key)
        self._wrote(True)
        self._exec("DELETE FROM subscriptions WHERE key = ?", (key,))

    def keep_subscription(self, key: str) -> None:
        """Forget a deletion of ``key`` not yet committed or rolled back: the caller keeps
        the subscription (its removal was refused because it could not be stored)."""
        self._sub_deleting.discard(key)
        self._redo_sub_deletes.discard(key)

    def iter_subscriptions(self) -> Iterable[tuple[str, list[dict[str, str]]]]:
        out: list[tuple[str, list[dict[str, str]]]] = []
        for key, specs in self.conn.execute("SELECT key, specs FROM subscriptions ORDER BY key"):
            try:
                parsed = json.loads(specs)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                out.append((str(key), parsed))
        return out

    def _pend(self, writes: int) -> None:
        """Count writes into the open transaction (its age starts at the first)."""
        if not self._pending:
            self._since = time.monotonic()
        self._pending += writes

    def _wrote(self, must: bool) -> None:
        self._pend(1)
        self._rows += 1
        self._must = self._must or must

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Group commit: the ``commit()`` calls made inside are one commit when the
        outermost ``hold`` ends (e.g. a gateway's batch of SENDs, whose receipts are written
        after it). A crash inside loses the whole batch, none of which was confirmed."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held:
                self.commit()

    def commit(self) -> None:
        """End of a core input: commit now, unless only partial fragments are pending (or
        a :meth:`hold` is open: then when it ends)."""
        if not self._pending or self._held:
            return
        if (
            self._must
            or self._broken
            or self.commit_delay <= 0
            or self._pending >= self.commit_batch
            or time.monotonic() - self._since >= self.commit_delay
        ):
            self.flush()

    def _exec(self, sql: str, params: Sequence[object]) -> None:
        """A write; a failure (disk full, I/O error) dooms the open transaction."""
        self._write_later()
        try:
            self.conn.execute(sql, params)
        except sqlite3.Error as exc:
            self._fail(exc)

    def _exec_later(self, sql: str, params: Sequence[object]) -> None:
        """A write made before the next statement, read or flush; ``sql`` writes one table
        no other deferred statement writes."""
        rows = self._later.get(sql)
        if rows is None:
            self._later[sql] = [params]
        else:
            rows.append(params)

    def _write_later(self) -> None:
        """Give SQLite the rows of :meth:`_exec_later`, one ``executemany`` per statement.
        A failure dooms the open transaction, as in :meth:`_exec`."""
        if not self._later:
            return
        later, self._later = self._later, {}
        try:
            for sql, rows in later.items():
                self.conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self._broken = True
        self.last_error = str(exc)

    def _rollback(self) -> None:
        """Undo the open transaction after a failed write; its messages go to take_failed."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.rollback()
        self.write_failures += 1
        self._failed |= self._touched
        self._redo_deletes |= self._deleting
        self._deleting = set()
        self._redo_sub_deletes |= self._sub_deleting
        self._sub_deleting = set()
        for msg_id in self._touched:
            self._forget(msg_id)
        self._touched = set()
        self._unwritten = []
        self._later = {}
        self._broken = False
        self._rows = 0
        self._pending = 0
        self._must = False

    def has_failed(self, msg_id: str) -> bool:
        """Whether the writes of ``msg_id`` were rolled back (and not yet taken)."""
        return msg_id in self._failed

    def take_failed(self) -> set[str]:
        """Ids of messages whose writes were rolled back since the last call."""
        failed, self._failed = self._failed, set()
        return failed

    def flush(self) -> None:
        """Commit whatever is pending (or roll it back if a write failed)."""
        self._write_later()
        if not self._broken:
            try:
                for msg_id in self._redo_deletes:  # dropped from the core, still in the file
                    self.conn.execute("DELETE FROM fragments WHERE msg_id = ?", (msg_id,))
                    self.conn.execute("DELETE FROM messages WHERE msg_id = ?", (msg_id,))
                for key in self._redo_sub_deletes:  # dropped from the core, still in the file
                    self.conn.execute("DELETE FROM subscriptions WHERE key = ?", (key,))
                self._write_fragments()
                self.conn.commit()
            except sqlite3.Error as exc:
                self._fail(exc)
        if self._broken:
            self._rollback()
            return
        self._touched = set()
        self._deleting = set()
        self._redo_deletes = set()
        self._sub_deleting = set()
        self._redo_sub_deletes = set()
        self._wal_bytes += 4096 * self._rows  # a page per other row, roughly
        self._rows = 0
        self._pending = 0
        self._must = False
        self.commits += 1
        if self.checkpoint_bytes > 0 and self._wal_bytes >= self.checkpoint_bytes:
            self._wal_bytes = 0
            self.poke_checkpoint()

    @property
    def checkpoints(self) -> int:
        """Background checkpoints run so far."""
        return self._checkpointer.runs if self._checkpointer is not None else 0

    @property
    def checkpoint_errors(self) -> int:
        """Background checkpoints that failed (disk full, I/O error)."""
        return self._checkpointer.errors if self._checkpointer is not None else 0

    @property
    def wal_held(self) -> int:
        """Checkpoints that found the log over ``wal_limit`` and a reader keeping it."""
        return self._checkpointer.wal_held if self._checkpointer is not None else 0

    @property
    def wal_held_now(self) -> bool:
        """The log is over ``wal_limit`` and a foreign reader keeps it from emptying."""
        return self._checkpointer is not None and self._checkpointer.held

    def poke_checkpoint(self) -> None:
        """Ask for a background checkpoint now (one is started if none ran yet)."""
        if self.checkpoint_bytes <= 0:
            return
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.path, self.wal_limit)
            self._checkpointer.start()
        self._checkpointer.poke()

    # ------------------------------------------------------------------ sinks

    def put_sink(self, key: str, kind: str, target: str) -> None:
        self._wrote(True)
        self._exec(
            "INSERT OR REPLACE INTO sinks(key, kind, target, created) VALUES (?, ?, ?, ?)",
            (key, kind, target, time.time()),
        )

    def delete_sink(self, key: str) -> None:
        """Forget a sink. Its ``sink_done`` rows stay (purged with their message's deadline,
        as the reception history is): the core keeps the key's history after an
        unsubscription, so without them a later subscription of the same key would find
        every finished delivery of the old one "unfinished" and have it redone."""
        self._wrote(True)
        self._exec("DELETE FROM sinks WHERE key = ?", (key,))

    def sink_done(self, msg_id: str, key: str, deadline: float) -> None:
        """A sink finished a delivery (written, or its command ended): not redone at restart.

        Durable at the next ``commit()``; only a kill between the sink's work and that commit
        has it redone (the same files rewritten, or the command run with the redelivered flag).
        """
        self._wrote(True)
        self._exec(
            "INSERT OR REPLACE INTO sink_done(msg_id, key, deadline) VALUES (?, ?, ?)",
            (msg_id, key, deadline),
        )

    def unfinished_deliveries(self) -> list[tuple[str, str, float]]:
        """(msg_id, key, deadline) delivered by the core but not finished by a sink, for the
        keys that have a dir or exec sink now. The delivery may have been made to an earlier
        subscription of the key: the caller checks that the current one accepts it."""
        self._write_later()
        rows = self.conn.execute(
            "SELECT h.msg_id, h.key, h.deadline FROM history h JOIN sinks s ON s.key = h.key "
            "WHERE s.kind IN ('dir', 'exec') AND NOT EXISTS (SELECT 1 FROM sink_done d "
            "WHERE d.msg_id = h.msg_id AND d.key = h.key) ORDER BY h.rowid"
        ).fetchall()
        return [(str(a), str(b), float(c)) for a, b, c in rows]

    def purge_sink_done(self, before: float) -> None:
        self._wrote(False)
        self._exec("DELETE FROM sink_done WHERE deadline < ?", (before,))

    def iter_sinks(self) -> Iterator[SinkRow]:
        rows = self.conn.execute("SELECT key, kind, target FROM sinks ORDER BY key").fetchall()
        for key, kind, target in rows:
            yield SinkRow(str(key), str(kind), str(target))

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        try:
            self.flush()
            self.conn.close()
        except sqlite3.Error:
            pass
