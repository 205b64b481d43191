"""The durable outbox of the bridges: ``STATE_DIR/bridges.db`` (SQLite, WAL).

Every DoDWAN message a binding must send is a row here, committed before the daemon moves
on; a row is marked sent (in the same transaction that raises the binding's high-water mark)
only once the broker has confirmed it. So a message waits here while the uplink is down, a
``kill -9`` loses nothing (unsent rows are sent after the restart), and a sent row is never
sent again. Rows stay until the message's deadline has passed, so a message delivered again
(e.g. the subscription re-created) is recognised and not sent twice.

The table also keeps the bindings added at run time (they survive restarts), the token of
each binding instance (written in the broker-side ledgers, see :mod:`.ledger`) and
per-binding totals. One connection is shared by the event loop and the binding threads under a lock.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..daemon.private import private_sqlite

DB_FILE = "bridges.db"

PENDING, SENT, ECHOED, EXPIRED = 0, 1, 2, 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bindings(
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, source TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    binding TEXT NOT NULL, msg_id TEXT NOT NULL,
    descriptor TEXT NOT NULL, payload BLOB NOT NULL,
    deadline REAL NOT NULL, not_before REAL NOT NULL,
    state INTEGER NOT NULL DEFAULT 0, done_at REAL,
    UNIQUE(binding, msg_id));
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(binding, state, seq);
CREATE TABLE IF NOT EXISTS inbound_seen(
    binding TEXT NOT NULL, digest TEXT NOT NULL, until REAL NOT NULL,
    PRIMARY KEY(binding, digest));
CREATE TABLE IF NOT EXISTS instances(
    binding TEXT PRIMARY KEY, token TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS marks(
    binding TEXT PRIMARY KEY, hwm INTEGER NOT NULL DEFAULT 0,
    sent INTEGER NOT NULL DEFAULT 0, received INTEGER NOT NULL DEFAULT 0);
"""


@dataclass(frozen=True, slots=True)
class OutRow:
    seq: int
    msg_id: str
    descriptor: dict[str, str]
    payload: bytes
    deadline: float


class Outbox:
    def __init__(self, state_dir: Path, synchronous: str = "NORMAL") -> None:
        self.path = Path(state_dir) / DB_FILE
        self._lock = threading.Lock()
        # It keeps the bindings' URIs, with their credentials: owner-only from the start
        # (its write-ahead log holds them too).
        private_sqlite(self.path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (the caller holds the lock). A failure (disk
        full) rolls back and raises: a transaction left open would take in every later
        write of the shared connection, and make the next ``BEGIN`` fail."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ bindings

    def bindings(self) -> list[tuple[str, dict[str, Any], str]]:
        with self._lock:
            rows = self._db.execute("SELECT name, spec, source FROM bindings ORDER BY name")
            return [(str(n), json.loads(s), str(src)) for n, s, src in rows.fetchall()]

    def put_binding(self, name: str, spec: dict[str, Any], source: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO bindings(name, spec, source) VALUES (?, ?, ?)",
                (name, json.dumps(spec, sort_keys=True), source),
            )

    def add_binding(self, name: str, spec: dict[str, Any], source: str) -> str:
        """Keep a binding and return the token of its instance (see :meth:`instance`), in
        one transaction: raises ``sqlite3.Error`` (e.g. disk full) with nothing stored."""
        with self._lock, self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO bindings(name, spec, source) VALUES (?, ?, ?)",
                (name, json.dumps(spec, sort_keys=True), source),
            )
            return _token(db, name)

    def drop_binding(self, name: str) -> int:
        """Forget a binding and its rows; returns how many unsent messages went with it.
        Raises ``sqlite3.Error`` (e.g. disk full) with nothing changed."""
        with self._lock, self._transaction() as db:
            (unsent,) = db.execute(
                "SELECT count(*) FROM outbox WHERE binding = ? AND state = 0", (name,)
            ).fetchone()
            db.execute("DELETE FROM outbox WHERE binding = ?", (name,))
            db.execute("DELETE FROM marks WHERE binding = ?", (name,))
            db.execute("DELETE FROM inbound_seen WHERE binding = ?", (name,))
            db.execute("DELETE FROM bindings WHERE name = ?", (name,))
            db.execute("DELETE FROM instances WHERE binding = ?", (name,))
        return int(unsent)

    def instance(self, name: str) -> str:
        """The token of the binding instance of this name: made on first use, kept until
        :meth:`drop_binding` (so a binding added again after ``bridge rm`` gets a new one)."""
        with self._lock:
            return _token(self._db, name)

    # ------------------------------------------------------------------ messages

    def enqueue(
        self,
        binding: str,
        msg_id: str,
        descriptor: dict[str, str],
        payload: bytes,
        deadline: float,
        not_before: float,
    ) -> bool:
        """Add a message (committed on return); False when the binding already had it."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO outbox(binding, msg_id, descriptor, payload, deadline, "
                "not_before) VALUES (?, ?, ?, ?, ?, ?)",
                (binding, msg_id, json.dumps(descriptor), payload, deadline, not_before),
            )
            return cur.rowcount == 1

    def known(self, binding: str) -> set[str]:
        with self._lock:
            rows = self._db.execute("SELECT msg_id FROM outbox WHERE binding = ?", (binding,))
            return {str(r[0]) for r in rows.fetchall()}

    def pending(
        self, binding: str, now: float, limit: int, exclude: Sequence[int] = ()
    ) -> list[OutRow]:
        """The oldest unsent messages that may go now, in order (but the ``exclude`` rows:
        held back after the broker refused them)."""
        skip = f"AND seq NOT IN ({','.join('?' * len(exclude))}) " if exclude else ""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, msg_id, descriptor, payload, deadline FROM outbox "
                f"WHERE binding = ? AND state = 0 AND not_before <= ? {skip}"
                "ORDER BY seq LIMIT ?",
                (binding, now, *exclude, limit),
            ).fetchall()
        return [
            OutRow(int(s), str(i), json.loads(d), bytes(p), float(dl)) for s, i, d, p, dl in rows
        ]

    def next_due(self, binding: str, exclude: Sequence[int] = ()) -> float | None:
        """When the earliest held-off message may go (None: nothing waits)."""
        skip = f" AND seq NOT IN ({','.join('?' * len(exclude))})" if exclude else ""
        with self._lock:
            (t,) = self._db.execute(
                f"SELECT min(not_before) FROM outbox WHERE binding = ? AND state = 0{skip}",
                (binding, *exclude),
            ).fetchone()
        return None if t is None else float(t)

    def mark_sent(self, binding: str, seqs: list[int]) -> int:
        """The broker confirmed these rows: flag them and raise the high-water mark, atomically.

        Returns how many were still unsent (a row marked already is not counted again)."""
        if not seqs:
            return 0
        now = time.time()
        with self._lock, self._transaction() as db:
            # state 2 too: its echo (from this very send) may come before the confirmation.
            cur = db.executemany(
                "UPDATE outbox SET state = 1, done_at = ? WHERE seq = ? AND state IN (0, 2)",
                [(now, s) for s in seqs],
            )
            n = max(0, cur.rowcount)
            db.execute("INSERT OR IGNORE INTO marks(binding) VALUES (?)", (binding,))
            db.execute(
                "UPDATE marks SET hwm = max(hwm, ?), sent = sent + ? WHERE binding = ?",
                (max(seqs), n, binding),
            )
        return n

    def pending_seqs(self, binding: str, msg_ids: set[str]) -> list[int]:
        """The unsent rows of these messages (e.g. named by the broker's ledger)."""
        if not msg_ids:
            return []
        ids = sorted(msg_ids)
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self._db.execute(
                f"SELECT seq FROM outbox WHERE binding = ? AND state = 0 AND msg_id IN ({marks})",
                (binding, *ids),
            ).fetchall()
        return [int(seq) for (seq,) in rows]

    def mark_echoed(self, binding: str, msg_id: str, deadline: float) -> bool:
        """Another gateway already put this message on the broker: never send it from here.

        When the message has not reached this host yet, a placeholder row (kept until
        ``deadline``) makes its later arrival a no-op. True when a pending row was dropped.
        """
        now = time.time()
        with self._lock:
            cur = self._db.execute(
                "UPDATE outbox SET state = 2, done_at = ? "
                "WHERE binding = ? AND msg_id = ? AND state = 0",
                (now, binding, msg_id),
            )
            if cur.rowcount == 1:
                return True
            self._db.execute(
                "INSERT OR IGNORE INTO outbox(binding, msg_id, descriptor, payload, deadline, "
                "not_before, state, done_at) VALUES (?, ?, '{}', x'', ?, ?, 2, ?)",
                (binding, msg_id, deadline, now, now),
            )
            return False

    def seen(self, binding: str, digest: str) -> bool:
        """Whether an incoming message without a remote id was published already."""
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM inbound_seen WHERE binding = ? AND digest = ?", (binding, digest)
            ).fetchone()
        return row is not None

    def remember(self, binding: str, digest: str, until: float) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO inbound_seen(binding, digest, until) VALUES (?, ?, ?)",
                (binding, digest, until),
            )

    def add_received(self, binding: str, n: int = 1) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO marks(binding) VALUES (?)", (binding,))
            self._db.execute(
                "UPDATE marks SET received = received + ? WHERE binding = ?", (n, binding)
            )

    def marks(self, binding: str) -> dict[str, int]:
        with self._lock:
            row = self._db.execute(
                "SELECT hwm, sent, received FROM marks WHERE binding = ?", (binding,)
            ).fetchone()
            (backlog,) = self._db.execute(
                "SELECT count(*) FROM outbox WHERE binding = ? AND state = 0", (binding,)
            ).fetchone()
        hwm, sent, received = row or (0, 0, 0)
        return {"hwm": hwm, "sent_total": sent, "received_total": received, "backlog": backlog}

    def purge(self, now: float) -> int:
        """Forget rows of expired messages; unsent ones are counted (they expired waiting)."""
        with self._lock:
            db = self._db
            (expired,) = db.execute(
                "SELECT count(*) FROM outbox WHERE state = 0 AND deadline < ?", (now,)
            ).fetchone()
            db.execute("DELETE FROM outbox WHERE deadline < ?", (now,))
            db.execute("DELETE FROM inbound_seen WHERE until < ?", (now,))
            return int(expired)


def _token(db: sqlite3.Connection, name: str) -> str:
    """The instance token of binding ``name``, made when it has none."""
    db.execute(
        "INSERT OR IGNORE INTO instances(binding, token) VALUES (?, ?)",
        (name, secrets.token_hex(8)),
    )
    (token,) = db.execute("SELECT token FROM instances WHERE binding = ?", (name,)).fetchone()
    return str(token)
