"""Full check and repair of a state directory's database (``dodwan check`` / ``dodwan repair``).

The daemon runs SQLite's ``quick_check`` at every start and refuses a damaged, empty or
foreign ``dodwan.db`` with a one-line error. :func:`check` goes further: SQLite's
``integrity_check`` plus every cached message read back and verified against its digest.
:func:`repair` salvages whatever can still be read — every message whose descriptor and
fragments are readable (verified when complete), subscriptions, sinks and the reception
history — into a fresh database, keeps the damaged file aside and reports what it saved.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..core import message as m
from ..core.errors import WireError
from ..core.limits import Limits
from .sqlite_store import SqliteStore, StoreError, check_file, check_plain_files, sqlite_files

_PROBE_GAP = 4096
"""Rowids probed past the last readable one when a table scan fails part way."""


@dataclass
class Report:
    """What a check or a repair found."""

    problems: list[str] = field(default_factory=list)
    messages: int = 0
    """Message rows found (readable or not)."""
    complete: int = 0
    """Messages whose every fragment was read and verified."""
    partial: int = 0
    """Incomplete received messages whose fragments were readable (fetched again later)."""
    lost: int = 0
    tables: dict[str, int] = field(default_factory=dict)

    @property
    def saved(self) -> int:
        return self.complete + self.partial


def _rows(conn: sqlite3.Connection, table: str, columns: str, report: Report) -> Iterator[Any]:
    """Every readable row of ``table``: a scan, then rowid probes past a damaged page."""
    seen: set[int] = set()
    try:
        for row in conn.execute(f"SELECT rowid, {columns} FROM {table} ORDER BY rowid"):
            seen.add(int(row[0]))
            yield row[1:]
        return
    except sqlite3.DatabaseError as exc:
        report.problems.append(f"table {table}: {exc}")
    try:
        top = int(conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0)
    except sqlite3.DatabaseError:
        top = 0
    rowid, last_hit = 0, max(seen, default=0)
    while rowid < max(top, last_hit + _PROBE_GAP):
        rowid += 1
        if rowid in seen:
            continue
        try:
            row = conn.execute(
                f"SELECT {columns} FROM {table} WHERE rowid = ?",
                (rowid,),
            ).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None:
            last_hit = rowid
            yield row


def _fragment(conn: sqlite3.Connection, msg_id: str, idx: int) -> bytes | None:
    try:
        row = conn.execute(
            "SELECT data FROM fragments WHERE msg_id = ? AND idx = ?", (msg_id, idx)
        ).fetchone()
    except sqlite3.DatabaseError:
        return None
    return None if row is None else bytes(row[0])


def _message(
    conn: sqlite3.Connection, row: Any, limits: Limits
) -> tuple[str, list[tuple[int, bytes]]] | None:
    """("complete" | "partial", readable fragments) or None when the message is lost."""
    msg_id, zdesc, _hops, local, _received = row
    try:
        header = m.Header.parse(m.decompress_descriptor(bytes(zdesc), limits), limits)
    except (WireError, TypeError, ValueError):
        return None
    frags = [(i, f) for i in range(header.frags) if (f := _fragment(conn, msg_id, i)) is not None]
    if len(frags) == header.frags:
        try:
            m.verify_payload(b"".join(f for _, f in frags), header)
        except WireError:
            return None
        return "complete", frags
    if local or not frags:
        return None  # a publication of this host cannot be fetched again
    return "partial", frags


_MESSAGE_COLUMNS = "msg_id, zdesc, hops, local, received"
_TABLES = {
    "meta": "key, value",
    "subscriptions": "key, specs",
    "sinks": "key, kind, target, created",
    "history": "msg_id, key, deadline",
    "sink_done": "msg_id, key, deadline",
}


def _open(path: Path, immutable: bool = False) -> sqlite3.Connection:
    mode = "immutable=1" if immutable else "mode=ro"
    conn = sqlite3.connect(f"file:{quote(str(path))}?{mode}", uri=True)
    conn.execute("PRAGMA query_only=1")
    return conn


_DAMAGE = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
"""SQLite error names (and their extended codes) meaning the file's content is bad; any
other failure to read it (permissions, a read-only directory, an I/O error, a lock) is not
damage that ``dodwan repair`` could mend."""


def _cannot_read(path: Path, immutable: bool) -> sqlite3.Error | None:
    """Why ``path`` cannot be read at all (not damage), or None."""
    conn: sqlite3.Connection | None = None
    try:
        conn = _open(path, immutable)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        if str(getattr(exc, "sqlite_errorname", "")).startswith(_DAMAGE):
            return None
        return exc
    finally:
        if conn is not None:
            conn.close()
    return None


def _open_to_check(path: Path) -> sqlite3.Connection:
    """A read-only connection to ``path``, or StoreError when it cannot be read at all.

    SQLite opens a WAL database read-only only where it can create the ``-shm`` file (or
    finds it); in a read-only directory without a write-ahead log to read, the file is
    opened as immutable instead (nothing else can be writing it there)."""
    immutable = False
    problem = _cannot_read(path, immutable)
    read_only_dir = not os.access(path.parent, os.W_OK)
    wal = Path(f"{path}-wal")
    has_log = wal.exists() and wal.stat().st_size > 0
    if problem is not None and read_only_dir and not has_log:
        immutable = True
        problem = _cannot_read(path, immutable)
    if problem is not None:
        why = f"cannot open {path} to check it: {problem}"
        if read_only_dir and has_log:
            why += f" (its directory is read-only and its write-ahead log {wal} needs {path}-shm)"
        raise StoreError(why)
    return _open(path, immutable)


def check(path: Path, limits: Limits | None = None) -> Report:
    """SQLite's integrity check and every message read back and verified.

    Raises StoreError, not a report of damage, when the database cannot be read at all."""
    limits = limits or Limits()
    report = Report()
    check_plain_files(sqlite_files(path))
    check_file(path)
    if not path.exists():
        raise StoreError(f"{path} does not exist")
    conn = _open_to_check(path)
    try:
        try:
            rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(20)")]
        except sqlite3.DatabaseError as exc:
            rows = [str(exc)]
        if rows != ["ok"]:
            report.problems += rows
        for row in _rows(conn, "messages", _MESSAGE_COLUMNS, report):
            report.messages += 1
            got = _message(conn, row, limits)
            if got is None:
                report.lost += 1
            elif got[0] == "complete":
                report.complete += 1
            else:
                report.partial += 1
        if report.lost:
            report.problems.append(f"{report.lost} message(s) cannot be read back whole")
    finally:
        conn.close()
    return report


def repair(path: Path, limits: Limits | None = None) -> tuple[Report, Path | None]:
    """Salvage ``path`` into a fresh database in its place; returns the report and where the
    damaged file was kept (None when there was no file)."""
    limits = limits or Limits()
    report = Report()
    fresh = path.with_name(path.name + ".repair")
    for p in (fresh, Path(f"{fresh}-wal"), Path(f"{fresh}-shm")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    usable = True
    try:
        check_file(path)
    except StoreError as exc:
        report.problems.append(str(exc))
        usable = False
    store = SqliteStore(fresh, quick_check=False, checkpoint_bytes=0)
    try:
        if usable and path.exists():
            conn = _open(path)
            try:
                _salvage(conn, store, report, limits)
            finally:
                conn.close()
        store.flush()
    finally:
        store.close()
    kept: Path | None = None
    if path.exists():
        kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(path, kept)
        for suffix in ("-wal", "-shm"):
            side = Path(f"{path}{suffix}")
            if side.exists():
                os.replace(side, Path(f"{kept}{suffix}"))
    os.replace(fresh, path)
    with contextlib.suppress(FileNotFoundError):
        Path(f"{fresh}-shm").unlink()
    return report, kept


def _salvage(conn: sqlite3.Connection, store: SqliteStore, report: Report, limits: Limits) -> None:
    try:
        conn.execute("SELECT 1 FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError as exc:
        report.problems.append(f"schema unreadable: {exc}")
        return
    db = store.conn
    for table, columns in _TABLES.items():
        n = 0
        marks = ", ".join("?" * len(columns.split(",")))
        try:
            for row in _rows(conn, table, columns, report):
                db.execute(f"INSERT OR REPLACE INTO {table}({columns}) VALUES ({marks})", row)
                n += 1
        except sqlite3.DatabaseError as exc:  # e.g. a table the damage removed from the schema
            report.problems.append(f"table {table}: {exc}")
        report.tables[table] = n
    for row in _rows(conn, "messages", _MESSAGE_COLUMNS, report):
        report.messages += 1
        got = _message(conn, row, limits)
        if got is None:
            report.lost += 1
            continue
        kind, frags = got
        db.execute(
            f"INSERT OR REPLACE INTO messages({_MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
            row,
        )
        db.executemany(
            "INSERT OR REPLACE INTO fragments(msg_id, idx, data) VALUES (?, ?, ?)",
            [(row[0], i, f) for i, f in frags],
        )
        if kind == "complete":
            report.complete += 1
        else:
            report.partial += 1
    db.commit()
