"""The simulation logs' recorder: rows from the core's sinks and from the simulator itself
come out in the order they were recorded, whatever the buffering in between."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow.parquet as pq

from sim.logs import FLUSH_ROWS, Recorder

KINDS = ["message_created", "fragment_stored", "message_completed", "message_delivered"]


def _record(rec: Recorder, rows: int, seed: int) -> list[tuple[float, str, str, str, int, int]]:
    """Record ``rows`` rows from two hosts' sinks and ``Recorder.message`` mixed at
    random, plus records that are not message rows; return the rows expected."""
    rng = random.Random(seed)
    sinks = {h: rec.sink(h) for h in ("h0", "h1")}
    expected = []
    for n in range(rows):
        t, host = n * 0.25 + rng.random() / 8, rng.choice(["h0", "h1", "h2"])
        msg, size, hops = f"m{rng.randrange(300)}", rng.randrange(1 << 40), rng.randrange(9)
        if host == "h2":  # a row the simulator adds itself (JOMS dispatch)
            rec.message(t, host, msg, "delivered", size, hops)
            expected.append((t, host, msg, "delivered", size, hops))
        else:
            kind = rng.choice(KINDS)
            sinks[host](t, kind, msg, size, hops, "")
            event = {"message_created": "created", "fragment_stored": "fragment",
                     "message_completed": "complete", "message_delivered": "delivered"}[kind]  # fmt: skip
            expected.append((t, host, msg, event, size, hops))
        if rng.random() < 0.1:  # not a message row: counted, never a row
            sinks["h0"](t, "datagram_sent", "", 100, 0, "fragment")
    return expected


def _rows(table: dict[str, list]) -> list[tuple[float, str, str, str, int, int]]:  # type: ignore[type-arg]
    cols = [table[c] for c in ("time", "host", "msg_id", "event", "bytes", "hops")]
    return list(zip(*cols, strict=True))


def test_message_rows_keep_their_order_across_buffers() -> None:
    rec = Recorder()
    expected = _record(rec, 3000, seed=1)
    assert _rows(rec.table("messages").to_pydict()) == expected
    assert rec.datagrams[("h0", "fragment", "sent")][1] % 100 == 0


def test_streamed_parts_hold_every_row_once_in_order(tmp_path: Path) -> None:
    flush = 1005
    assert flush < FLUSH_ROWS
    rec = Recorder(tmp_path, flush_rows=flush)
    rec.begin()
    expected = _record(rec, 3 * flush + 11, seed=2)
    rec.close()
    parts = sorted((tmp_path / "messages.parquet").glob("part-*.parquet"))
    assert [pq.read_table(p).num_rows for p in parts] == [flush, flush, flush, 11]
    got = [row for p in parts for row in _rows(pq.read_table(p).to_pydict())]
    assert got == expected


def test_a_checkpoint_writes_every_table_and_the_totals_as_of_then(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_rows=FLUSH_ROWS)
    rec.row("hosts", host="h0", group="g")  # recorded before the run begins: kept
    rec.begin()
    first = _record(rec, 500, seed=3)
    node = {"fragment": [3, 4200]}
    rec.checkpoint([("h1", node, {})])
    tables = {n: pq.read_table(tmp_path / f"{n}.parquet") for n in ("messages", "hosts")}
    assert _rows(tables["messages"].to_pydict()) == first
    assert tables["hosts"].to_pylist() == [{"host": "h0", "group": "g"}]
    for empty in ("contacts", "targets", "cache"):  # every table readable already
        assert pq.read_table(tmp_path / f"{empty}.parquet").num_rows == 0
    dg = pq.read_table(tmp_path / "datagrams.parquet").to_pylist()
    assert {"host": "h1", "kind": "fragment", "direction": "sent", "count": 3, "bytes": 4200} in dg
    rest = _record(rec, 200, seed=4)
    node["fragment"] = [5, 7000]  # the node's totals went on; the snapshot is replaced
    rec.datagram_totals("h1", node, {})
    rec.close()
    assert _rows(pq.read_table(tmp_path / "messages.parquet").to_pydict()) == first + rest
    assert len(list((tmp_path / "datagrams.parquet").glob("part-*.parquet"))) == 1
    dg = pq.read_table(tmp_path / "datagrams.parquet").to_pylist()
    assert [r for r in dg if r["host"] == "h1"] == [
        {"host": "h1", "kind": "fragment", "direction": "sent", "count": 5, "bytes": 7000}
    ]
