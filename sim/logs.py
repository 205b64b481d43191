"""Simulation logs: the Parquet tables of schema v1 and ``run.json`` (see docs/logs.md).

``Recorder`` gathers rows in column lists while a run goes (cheap appends), turns core
trace records into ``messages`` rows and per-host ``datagrams`` totals, and writes each
table as ``DIR/<name>.parquet`` with its schema version in the file metadata.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
_DIRECTION = {"datagram_sent": "sent", "datagram_received": "received"}


class Recorder:
    """Collects every table's rows during a run."""

    def __init__(self) -> None:
        self.columns: dict[str, dict[str, list[Any]]] = {
            name: {f.name: [] for f in schema} for name, schema in SCHEMAS.items()
        }
        self.datagrams: dict[tuple[str, str, str], list[int]] = {}
        self.dropped: dict[str, int] = {}
        m = self.columns["messages"]
        self._m = (m["time"], m["host"], m["msg_id"], m["event"], m["bytes"], m["hops"])

    def row(self, table: str, **values: Any) -> None:
        cols = self.columns[table]
        for k, v in values.items():
            cols[k].append(v)

    def contact(self, time: float, a: str, b: str, up: bool) -> None:
        if b < a:
            a, b = b, a
        self.row("contacts", time=time, a=a, b=b, up=up)

    def trace(self, host: str, records: Iterable[Any]) -> None:
        """Consume core ``TraceRecord``s of one host."""
        t_, h_, id_, e_, b_, hop_ = self._m
        for r in records:
            kind = r.kind
            event = MESSAGE_EVENTS.get(kind)
            if event is not None:
                t_.append(r.time)
                h_.append(host)
                id_.append(r.msg_id)
                e_.append(event)
                b_.append(r.size)
                hop_.append(r.hops)
                continue
            direction = _DIRECTION.get(kind)
            if direction is not None:
                key = (host, r.detail, direction)
                tot = self.datagrams.get(key)
                if tot is None:
                    self.datagrams[key] = [1, r.size]
                else:
                    tot[0] += 1
                    tot[1] += r.size
            elif kind == "datagram_dropped":
                self.dropped[r.detail] = self.dropped.get(r.detail, 0) + 1

    def table(self, name: str) -> pa.Table:
        cols = self.columns[name]
        if name == "datagrams":
            keys = sorted(self.datagrams)
            cols = {
                "host": [k[0] for k in keys],
                "kind": [k[1] for k in keys],
                "direction": [k[2] for k in keys],
                "count": [self.datagrams[k][0] for k in keys],
                "bytes": [self.datagrams[k][1] for k in keys],
            }
        schema = SCHEMAS[name].with_metadata({"schema_version": str(SCHEMA_VERSION)})
        return pa.table(cols, schema=schema)

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        for name in SCHEMAS:
            pq.write_table(self.table(name), out / f"{name}.parquet")


def write_run_json(out: Path, info: dict[str, Any]) -> None:
    """Write ``run.json`` (keys sorted, so two runs differ only where they really do)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
