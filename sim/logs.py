"""Simulation logs: the Parquet tables of schema v1 and ``run.json`` (see docs/logs.md).

``Recorder`` gathers rows while a run goes: core trace records arrive through a per-host
sink straight into typed columns (``messages``) and per-host ``datagrams`` totals; the
small tables are column lists. Each table is written as ``DIR/<name>.parquet`` — a folder
of part files when the run streams its logs — with its schema version in the metadata.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1

SCHEMAS: dict[str, pa.Schema] = {
    "contacts": pa.schema(
        [("time", pa.float64()), ("a", pa.string()), ("b", pa.string()), ("up", pa.bool_())]
    ),
    "messages": pa.schema(
        [
            ("time", pa.float64()),
            ("host", pa.string()),
            ("msg_id", pa.string()),
            ("event", pa.string()),
            ("bytes", pa.int64()),
            ("hops", pa.int32()),
        ]
    ),
    "targets": pa.schema(
        [
            ("msg_id", pa.string()),
            ("host", pa.string()),
            ("origin", pa.string()),
            ("created", pa.float64()),
            ("deadline", pa.float64()),
            ("topic", pa.string()),
            ("group", pa.string()),
        ]
    ),
    "datagrams": pa.schema(
        [
            ("host", pa.string()),
            ("kind", pa.string()),
            ("direction", pa.string()),
            ("count", pa.int64()),
            ("bytes", pa.int64()),
        ]
    ),
    "cache": pa.schema(
        [
            ("time", pa.float64()),
            ("host", pa.string()),
            ("bytes", pa.int64()),
            ("messages", pa.int64()),
        ]
    ),
    "hosts": pa.schema([("host", pa.string()), ("group", pa.string())]),
}

# Core trace kinds -> messages.event values.
MESSAGE_EVENTS = {
    "message_created": "created",
    "fragment_stored": "fragment",
    "message_completed": "complete",
    "message_delivered": "delivered",
    "message_evicted": "evicted",
}
_EVENT_NAMES = list(MESSAGE_EVENTS.values())
_EVENT_CODE = {kind: i for i, kind in enumerate(MESSAGE_EVENTS)}
_DIRECTION = {"datagram_sent": "sent", "datagram_received": "received"}

FLUSH_ROWS = 1 << 20
"""Rows a table buffers before they are written out as one more part file."""


class _MessageColumns:
    """The ``messages`` table being recorded: typed arrays, hosts and ids as indices.

    Nothing here is a Python object per row (the garbage collector never walks these
    buffers, and 11 million rows cost 11 million × 29 bytes, not gigabytes of lists).
    """

    __slots__ = ("bytes", "event", "hops", "host", "ids", "msg", "names", "time")

    def __init__(self) -> None:
        self.time = array("d")
        self.host = array("i")
        self.msg = array("i")
        self.event = array("b")
        self.bytes = array("q")
        self.hops = array("i")
        self.names: list[str] = []
        """Host names by index."""
        self.ids: dict[str, int] = {}
        """Message id -> index (ids are few: one per published message)."""

    def __len__(self) -> int:
        return len(self.time)

    def id_index(self, msg_id: str) -> int:
        i = self.ids.get(msg_id)
        if i is None:
            i = self.ids[msg_id] = len(self.ids)
        return i

    def table(self) -> dict[str, pa.Array]:
        ids = pa.array(list(self.ids), pa.string())
        names = pa.array(self.names, pa.string())
        events = pa.array(_EVENT_NAMES, pa.string())
        return {
            "time": pa.array(np.frombuffer(self.time, np.float64)),
            "host": names.take(pa.array(np.frombuffer(self.host, np.int32))),
            "msg_id": ids.take(pa.array(np.frombuffer(self.msg, np.int32))),
            "event": events.take(pa.array(np.frombuffer(self.event, np.int8))),
            "bytes": pa.array(np.frombuffer(self.bytes, np.int64)),
            "hops": pa.array(np.frombuffer(self.hops, np.int32)),
        }

    def clear(self) -> None:
        for col in (self.time, self.host, self.msg, self.event, self.bytes, self.hops):
            del col[:]


class Recorder:
    """Collects every table's rows during a run and writes them as Parquet.

    With ``out`` given, a table is written as a folder ``out/<name>.parquet/`` of part files,
    one more each time ``flush_rows`` rows have accumulated, at each :meth:`checkpoint`
    and at :meth:`close`: memory stays flat however long the run, and a run that is killed
    keeps every part written so far (Spark and pyarrow read such a folder as one table).
    ``datagrams`` holds totals, so it is one part, written again at each checkpoint. The
    folder is left alone until :meth:`begin` (so a run that fails to start does not remove
    the logs of an earlier one). Without ``out`` everything is kept until :meth:`write`.
    """

    def __init__(self, out: Path | None = None, *, flush_rows: int = FLUSH_ROWS) -> None:
        self.out = out
        self.flush_rows = flush_rows
        self.columns: dict[str, dict[str, list[Any]]] = {
            name: {f.name: [] for f in schema}
            for name, schema in SCHEMAS.items()
            if name not in ("messages", "datagrams")
        }
        self.messages = _MessageColumns()
        self.host_index: dict[str, int] = {}
        self.datagrams: dict[tuple[str, str, str], list[int]] = {}
        self.dropped: dict[str, int] = {}
        self.parts: dict[str, int] = dict.fromkeys(SCHEMAS, 0)
        self.begun = False
        """Streaming: :meth:`begin` was called (no part is written before)."""

    def begin(self) -> None:
        """Streaming: make ``out`` and remove the logs an earlier run left there (its tables
        and its ``run.json``); rows recorded before are kept and written later."""
        assert self.out is not None
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "run.json").unlink(missing_ok=True)
        for name in SCHEMAS:
            folder = self.out / f"{name}.parquet"
            if folder.is_file():
                folder.unlink()  # a single-file table of an earlier run
            elif folder.is_dir():
                for old in folder.glob("part-*.parquet"):
                    old.unlink()
        self.begun = True

    def row(self, table: str, **values: Any) -> None:
        cols = self.columns[table]
        for k, v in values.items():
            cols[k].append(v)
        if self.begun and len(cols[next(iter(cols))]) >= self.flush_rows:
            self._flush(table)

    def contact(self, time: float, a: str, b: str, up: bool) -> None:
        if b < a:
            a, b = b, a
        self.row("contacts", time=time, a=a, b=b, up=up)

    def _host(self, host: str) -> int:
        i = self.host_index.get(host)
        if i is None:
            i = self.host_index[host] = len(self.messages.names)
            self.messages.names.append(host)
        return i

    def message(
        self, time: float, host: str, msg_id: str, event: str, size: int, hops: int
    ) -> None:
        """One ``messages`` row that is not a core trace record (JOMS dispatches)."""
        cols = self.messages
        cols.time.append(time)
        cols.host.append(self._host(host))
        cols.msg.append(cols.id_index(msg_id))
        cols.event.append(_EVENT_NAMES.index(event))
        cols.bytes.append(size)
        cols.hops.append(hops)
        if self.begun and len(cols) >= self.flush_rows:
            self._flush("messages")

    def sink(self, host: str) -> Callable[[float, str, str, int, int, str], None]:
        """A core ``trace_sink`` for ``host``: records go straight into the columns."""
        cols = self.messages
        h = self._host(host)
        t_, h_, m_, e_, b_, hop_ = (
            cols.time.append, cols.host.append, cols.msg.append, cols.event.append,
            cols.bytes.append, cols.hops.append,
        )  # fmt: skip
        ids, id_index, code = cols.ids, cols.id_index, _EVENT_CODE.get
        datagrams, dropped, direction_of = self.datagrams, self.dropped, _DIRECTION.get
        flush_rows = self.flush_rows

        def record(time: float, kind: str, msg_id: str, size: int, hops: int, detail: str) -> None:
            event = code(kind)
            if event is not None:
                t_(time)
                h_(h)
                i = ids.get(msg_id)
                m_(id_index(msg_id) if i is None else i)
                e_(event)
                b_(size)
                hop_(hops)
                if self.begun and len(cols.time) >= flush_rows:
                    self._flush("messages")
                return
            direction = direction_of(kind)
            if direction is not None:
                key = (host, detail, direction)
                tot = datagrams.get(key)
                if tot is None:
                    datagrams[key] = [1, size]
                else:
                    tot[0] += 1
                    tot[1] += size
            elif kind == "datagram_dropped":
                dropped[detail] = dropped.get(detail, 0) + 1

        return record

    def datagram_totals(
        self, host: str, sent: Mapping[str, list[int]], received: Mapping[str, list[int]]
    ) -> None:
        """Add ``host``'s totals per datagram kind ([count, bytes]) to the datagrams table,
        as its node keeps them when it traces no record per datagram."""
        _add_totals(self.datagrams, host, sent, received)

    def trace(self, host: str, records: Iterable[Any]) -> None:
        """Consume core ``TraceRecord``s of one host (hosts without a sink)."""
        record = self.sink(host)
        for r in records:
            record(r.time, r.kind, r.msg_id, r.size, r.hops, r.detail)

    def table(self, name: str) -> pa.Table:
        """What is buffered of table ``name`` (all of it unless streaming)."""
        cols: Mapping[str, Any]
        if name == "messages":
            cols = self.messages.table()
        elif name == "datagrams":
            cols = _datagram_columns(self.datagrams)
        else:
            cols = self.columns[name]
        schema = SCHEMAS[name].with_metadata({"schema_version": str(SCHEMA_VERSION)})
        return pa.table(dict(cols), schema=schema)

    def _clear(self, name: str) -> None:
        if name == "messages":
            self.messages.clear()
        elif name == "datagrams":
            self.datagrams.clear()
        else:
            for col in self.columns[name].values():
                col.clear()

    def _flush(self, name: str, table: pa.Table | None = None) -> None:
        """Write what ``name`` buffered (or ``table``) as its next part file, atomically,
        and forget it; ``datagrams`` (totals) is always its one part, written again."""
        assert self.out is not None and self.begun
        folder = self.out / f"{name}.parquet"
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f"part-{self.parts[name]:05d}.parquet"
        tmp = folder / f".{part.name}.tmp"
        pq.write_table(self.table(name) if table is None else table, tmp)
        tmp.replace(part)
        if name != "datagrams":
            self.parts[name] += 1
            self._clear(name)

    def checkpoint(
        self, totals: Iterable[tuple[str, Mapping[str, list[int]], Mapping[str, list[int]]]]
    ) -> None:
        """Streaming: write every row buffered so far, each table at least one part, and
        the datagrams table as of now: ``totals`` (host, sent, received) are the nodes'
        own, added to what was recorded without being kept (:meth:`datagram_totals` adds
        them once, at the end)."""
        for name in SCHEMAS:
            if name == "datagrams":
                now = {k: list(v) for k, v in self.datagrams.items()}
                for host, sent, received in totals:
                    _add_totals(now, host, sent, received)
                schema = SCHEMAS[name].with_metadata({"schema_version": str(SCHEMA_VERSION)})
                self._flush(name, pa.table(_datagram_columns(now), schema=schema))
            elif self._buffered(name) or not self.parts[name]:
                self._flush(name)

    def _buffered(self, name: str) -> int:
        if name == "messages":
            return len(self.messages)
        if name == "datagrams":
            return len(self.datagrams)
        cols = self.columns[name]
        return len(cols[next(iter(cols))])

    def close(self) -> None:
        """Streaming: write every table's remaining rows (each table gets at least one part)."""
        assert self.out is not None
        for name in SCHEMAS:
            if self._buffered(name) or not self.parts[name] or name == "datagrams":
                self._flush(name)

    def write(self, out: Path) -> None:
        """Not streaming: write every table as ``out/<name>.parquet``."""
        out.mkdir(parents=True, exist_ok=True)
        for name in SCHEMAS:
            pq.write_table(self.table(name), out / f"{name}.parquet")


def _add_totals(
    into: dict[tuple[str, str, str], list[int]],
    host: str,
    sent: Mapping[str, list[int]],
    received: Mapping[str, list[int]],
) -> None:
    for direction, totals in (("sent", sent), ("received", received)):
        for kind, (count, size) in totals.items():
            tot = into.setdefault((host, kind, direction), [0, 0])
            tot[0] += count
            tot[1] += size


def _datagram_columns(totals: Mapping[tuple[str, str, str], list[int]]) -> dict[str, list[Any]]:
    keys = sorted(totals)
    return {
        "host": [k[0] for k in keys],
        "kind": [k[1] for k in keys],
        "direction": [k[2] for k in keys],
        "count": [totals[k][0] for k in keys],
        "bytes": [totals[k][1] for k in keys],
    }


def write_run_json(out: Path, info: dict[str, Any]) -> None:
    """Write ``run.json`` (keys sorted, so two runs differ only where they really do)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".run.json.tmp"  # written again at each checkpoint: never seen half done
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    tmp.replace(out / "run.json")
