"""Durable state of the JOMS service behind a tiny key-value interface.

The service keeps its durable state (durable subscriptions and their pending messages,
queue-manager receivers and pending messages, message ids already seen, subscription keys
to clean up after a restart) as ``(table, key) -> bytes`` records. :class:`MemoryServiceStore`
keeps them in dictionaries (tests, simulator); :class:`SqliteServiceStore` keeps them in one
SQLite file in WAL mode (the daemon, e.g. ``STATE_DIR/joms.sqlite``). A store decides nothing.
"""

from __future__ import annotations

import contextlib
import heapq
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from dodwan.daemon.private import private_sqlite


class StoreWriteError(Exception):
    """The store could not commit (disk full, I/O error). Nothing of the transaction is in
    the file; its writes are kept and made by the next commit that succeeds, so the file
    catches up with the service's state once there is room."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot store the JOMS service's state in {path.name} ({reason})")
        self.path = path
        self.reason = reason


class ServiceStore(Protocol):
    """Tables of ``key -> bytes`` records, listed in key order."""

    def put(self, table: str, key: str, value: bytes) -> None: ...
    def get(self, table: str, key: str) -> bytes | None: ...
    def delete(self, table: str, key: str) -> None: ...
    def take(self, table: str, key: str) -> bool:
        """Delete a record and say whether there was one."""

    def items(
        self, table: str, prefix: str = "", limit: int | None = None
    ) -> list[tuple[str, bytes]]:
        """Records of ``table`` whose key starts with ``prefix``, sorted by key (the first
        ``limit`` of them when given)."""

    def commit(self) -> None:
        """Make the writes so far durable (the service calls it at the end of each input)."""

    def close(self) -> None: ...


class MemoryServiceStore:
    """A :class:`ServiceStore` in dictionaries; ``reopen()`` simulates a restart."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[str, bytes]] = {}

    def put(self, table: str, key: str, value: bytes) -> None:
        self._tables.setdefault(table, {})[key] = bytes(value)

    def get(self, table: str, key: str) -> bytes | None:
        return self._tables.get(table, {}).get(key)

    def delete(self, table: str, key: str) -> None:
        self._tables.get(table, {}).pop(key, None)

    def take(self, table: str, key: str) -> bool:
        return self._tables.get(table, {}).pop(key, None) is not None

    def items(
        self, table: str, prefix: str = "", limit: int | None = None
    ) -> list[tuple[str, bytes]]:
        rows = self._tables.get(table, {})
        found = ((k, v) for k, v in rows.items() if k.startswith(prefix))
        return sorted(found) if limit is None else heapq.nsmallest(limit, found)

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass


try:  # the daemon's background checkpointer (absent in a JOMS-only install)
    from dodwan.daemon.sqlite_store import Checkpointer
except ImportError:  # pragma: no cover
    Checkpointer = None  # type: ignore[assignment,misc]

CHECKPOINT_BYTES = 4 * 1024 * 1024
"""Record bytes committed between two checkpoints (in a background thread). The log grows
by more — about 15 MB for a stream of durable messages — which measured cheaper than
checkpointing every 4 MB of log."""
WAL_LIMIT = 64 * 1024 * 1024
"""A write-ahead log grown past this is emptied (TRUNCATE checkpoint)."""


_RECORDS_TABLE = (
    "CREATE TABLE {name} (tbl TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
    " UNIQUE (tbl, key))"
)
"""A rowid table (with an index on ``(tbl, key)``): a record of up to about 4 KB stays in
its leaf page. Earlier stores used a WITHOUT ROWID table, where a record over about 1 KB
(any stored message) spills into an overflow page of its own: a page written per message,
and freed again when the message is consumed."""

_MIGRATE_TO_ROWID = (
    "BEGIN IMMEDIATE;"
    + _RECORDS_TABLE.format(name="records_rowid")
    + ";INSERT INTO records_rowid (tbl, key, value) SELECT tbl, key, value FROM records;"
    "DROP TABLE records;"
    "ALTER TABLE records_rowid RENAME TO records;"
    "COMMIT;"
)


class SqliteServiceStore:
    """A :class:`ServiceStore` in one SQLite file (WAL, synchronous=NORMAL).

    The write-ahead log is copied back into the file by a background thread every few
    megabytes committed (``Checkpointer``, as the daemon's cache does): SQLite's automatic
    checkpoint runs inside a commit and fsyncs both files there, which held the event loop
    for about 50 us per message of a persistent durable-subscription stream.

    Writes wait in memory until the transaction ends (:meth:`commit`, or the outermost
    :meth:`hold`): a record written twice in one transaction — a durable message stored,
    then marked "may have been delivered" when dispatched at once — is written once, and
    the rows go in with one ``executemany`` per kind of statement. Reads see the waiting
    writes. What a commit makes durable is unchanged."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:  # owner-only before SQLite makes it or its log (docs/security.md)
            private_sqlite(self.path)
        except OSError as exc:  # as SQLite would have failed to open it
            raise sqlite3.OperationalError(f"cannot use {self.path}: {exc.strerror}") from None
        self._db = sqlite3.connect(str(self.path), isolation_level="DEFERRED")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._checkpointer: Any = None
        self._committed = 0  # bytes committed since the last checkpoint (an estimate)
        if Checkpointer is not None:
            self._db.execute("PRAGMA wal_autocheckpoint=0")
        row = self._db.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'records'"
        ).fetchone()
        if row is None:
            self._db.execute(_RECORDS_TABLE.format(name="records"))
        elif "WITHOUT ROWID" in str(row[0]).upper():
            self._db.commit()
            self._db.executescript(_MIGRATE_TO_ROWID)
        self._db.commit()
        self._held = 0
        self._waiting: dict[tuple[str, str], bytes | None] = {}
        """Writes of the open transaction not yet given to SQLite (None: a deletion)."""
        self._written: dict[tuple[str, str], bytes | None] = {}
        """Writes of the open transaction given to SQLite (kept again if it rolls back)."""
        self.write_failures = 0
        """Commits that failed (disk full, I/O error) and were rolled back, writes kept."""

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Group commit: the ``commit()`` calls made inside are one commit when the
        outermost ``hold`` ends (a run of inputs handled at once, before any reply)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held:
                self._commit()

    def put(self, table: str, key: str, value: bytes) -> None:
        self._waiting[table, key] = bytes(value)

    def get(self, table: str, key: str) -> bytes | None:
        k = (table, key)
        if k in self._waiting:
            return self._waiting[k]
        row = self._db.execute("SELECT value FROM records WHERE tbl = ? AND key = ?", k).fetchone()
        return None if row is None else bytes(row[0])

    def delete(self, table: str, key: str) -> None:
        self._waiting[table, key] = None

    def take(self, table: str, key: str) -> bool:
        k = (table, key)
        if k in self._waiting:
            if self._waiting[k] is None:
                return False
            self._waiting[k] = None  # (it may also be in the file, from an earlier put)
            return True
        found = self._db.execute("SELECT 1 FROM records WHERE tbl = ? AND key = ?", k)
        if found.fetchone() is None:
            return False
        self._waiting[k] = None  # a write like the others: kept if its commit fails
        return True

    def items(
        self, table: str, prefix: str = "", limit: int | None = None
    ) -> list[tuple[str, bytes]]:
        self._write()
        n = -1 if limit is None else limit  # SQLite: a negative LIMIT is no limit
        if prefix:
            rows = self._db.execute(
                "SELECT key, value FROM records WHERE tbl = ? AND key >= ? AND key < ?"
                " ORDER BY key LIMIT ?",
                (table, prefix, prefix + "\U0010ffff", n),
            )
        else:
            rows = self._db.execute(
                "SELECT key, value FROM records WHERE tbl = ? ORDER BY key LIMIT ?", (table, n)
            )
        return [(k, bytes(v)) for k, v in rows]

    def _write(self) -> None:
        """Hand the waiting writes to SQLite (in the open transaction)."""
        if not self._waiting:
            return
        waiting, self._waiting = self._waiting, {}
        self._written.update(waiting)
        # a page per deletion, the bytes of each record: roughly what the log gets
        self._committed += sum(4096 if v is None else len(v) + 64 for v in waiting.values())
        puts = [(t, k, v) for (t, k), v in waiting.items() if v is not None]
        dels = [k for k, v in waiting.items() if v is None]
        try:
            if dels:
                self._db.executemany("DELETE FROM records WHERE tbl = ? AND key = ?", dels)
            if puts:
                self._db.executemany(
                    "INSERT OR REPLACE INTO records (tbl, key, value) VALUES (?, ?, ?)", puts
                )
        except sqlite3.Error as exc:
            self._rollback(exc)

    def _rollback(self, exc: sqlite3.Error) -> None:
        """Undo the open transaction after a failed write or commit, and raise.

        A refusal of the file system (disk full, I/O error: ``OperationalError``) keeps the
        transaction's writes for the next commit and raises :class:`StoreWriteError`: the
        service goes on with its state in memory and the file catches up once there is
        room. Any other error (a record SQLite cannot take) drops them and is raised as is.
        """
        with contextlib.suppress(sqlite3.Error):
            self._db.rollback()
        written, self._written = self._written, {}
        if not isinstance(exc, sqlite3.OperationalError):
            raise exc
        self._waiting = {**written, **self._waiting}  # a later write of a record wins
        self.write_failures += 1
        raise StoreWriteError(self.path, str(exc)) from None

    def _commit(self) -> None:
        self._write()
        try:
            self._db.commit()
        except sqlite3.Error as exc:  # e.g. disk full: none of the transaction is in the file
            self._rollback(exc)
        self._written = {}
        if self._committed >= CHECKPOINT_BYTES and Checkpointer is not None:
            self._committed = 0
            if self._checkpointer is None:
                self._checkpointer = Checkpointer(self.path, WAL_LIMIT)
                self._checkpointer.start()
            self._checkpointer.poke()

    def commit(self) -> None:
        if not self._held:
            self._commit()

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self._commit()
        self._db.close()
