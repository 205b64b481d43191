"""Where a run's undelivered pairs went (issue 14): what its logs say about copies and contacts.

For a run folder of ``dodwan-sim run`` (Parquet logs read with pyarrow), prints:

* the target pairs split three ways: delivered by the deadline; the destination met a host
  holding a complete copy (while it held it, before the deadline) and still did not get
  the message; the destination never met such a host;
* for the pairs that met one: how many such meetings and how many seconds of contact they
  had, and how many fragments of the message the destination held at the end;
* complete-copy holding: per message, the hours complete copies were held by its origin
  and carriers (not its targets) between its creation and its deadline, as quartiles, and
  the mean bytes of complete copies each host held over the run (to compare with the
  cache capacity);
* transfers that never completed: (message, host) pairs with fragments stored and no
  complete copy ever, and the bytes they stored.

A holding interval runs from a host's ``created`` or ``complete`` row for a message to its
next ``evicted`` row (or the end of the run). Contacts come from the ``contacts`` table as
``bench_delivery`` reads them.

    .venv/bin/python bench/delivery_diagnosis.py out/one_default
    .venv/bin/python bench/delivery_diagnosis.py out/one_default --json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from bench_delivery import _read, contact_intervals, lower_median

Interval = tuple[str, float, float]
"""(host, start, end) of one complete copy."""


def holdings(rows: list[tuple[float, str, str, str]], until: float) -> dict[str, list[Interval]]:
    """Message id -> the intervals during which a host held a complete copy, from the
    ``(time, host, msg_id, event)`` rows of the ``messages`` table (any order; only
    ``created``, ``complete`` and ``evicted`` count)."""
    since: dict[tuple[str, str], float] = {}
    out: dict[str, list[Interval]] = defaultdict(list)
    for t, h, m, e in sorted(r for r in rows if r[3] in ("created", "complete", "evicted")):
        key = (m, h)
        if e == "evicted":
            start = since.pop(key, None)
            if start is not None:
                out[m].append((h, start, t))
        else:
            since.setdefault(key, t)
    for (m, h), start in since.items():
        out[m].append((h, start, max(start, until)))
    return out


def fragments_stored(run_dir: Path) -> defaultdict[tuple[str, str], list[int]]:
    """``(msg_id, host) -> [fragments, bytes]`` of the fragment rows, totalled by Arrow: a
    0.5-1 MB run logs tens of millions of them, too many to turn into Python objects."""
    t = pq.read_table(
        run_dir / "messages.parquet", columns=["msg_id", "host", "bytes"],
        filters=[("event", "=", "fragment")],
    )  # fmt: skip
    agg = t.group_by(["msg_id", "host"]).aggregate([("bytes", "count"), ("bytes", "sum")])
    out: defaultdict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for m, h, n, b in zip(
        agg.column("msg_id").to_pylist(), agg.column("host").to_pylist(),
        agg.column("bytes_count").to_pylist(), agg.column("bytes_sum").to_pylist(),
        strict=True,
    ):  # fmt: skip
        out[(m, h)] = [n, b]
    return out


def _quartiles(values: list[float]) -> list[float] | None:
    if not values:
        return None
    s = sorted(values)
    return [s[min(len(s) - 1, int(q * len(s)))] for q in (0.25, 0.5, 0.75)]


def diagnose(run_dir: Path, until: float | None = None) -> dict[str, Any]:
    """Every figure this tool prints, from the run's logs."""
    info = json.loads((run_dir / "run.json").read_text())
    until = float(info["until"]) if until is None else until
    tg = _read(run_dir, "targets", ["msg_id", "host", "origin", "created", "deadline"])
    pairs: dict[tuple[str, str], tuple[str, float, float]] = {}
    for m, h, o, c, d in zip(*tg.values(), strict=True):
        pairs.setdefault((m, h), (o, c, d))
    targets: dict[str, set[str]] = defaultdict(set)
    for m, h in pairs:
        targets[m].add(h)
    ev = _read(
        run_dir, "messages", ["time", "host", "msg_id", "event", "bytes"],
        filters=[("event", "in", ["created", "complete", "evicted", "delivered"])],
    )  # fmt: skip
    delivered: dict[tuple[str, str], float] = {}
    size: dict[str, int] = {}
    frags = fragments_stored(run_dir)
    completed: set[tuple[str, str]] = set()
    lifecycle: list[tuple[float, str, str, str]] = []
    for t, h, m, e, b in zip(*ev.values(), strict=True):
        lifecycle.append((t, h, m, e))
        if e == "delivered":
            if t < delivered.get((m, h), float("inf")):
                delivered[(m, h)] = t
        elif e == "created":
            size[m] = b
        elif e == "complete":
            completed.add((m, h))
    held = holdings(lifecycle, until)
    contacts: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for a, b, s, e in contact_intervals(run_dir, until):
        contacts[(a, b)].append((s, e))
        contacts[(b, a)].append((s, e))

    counts = {"delivered": 0, "met_not_delivered": 0, "never_met": 0}
    meetings, seconds, fragments_held = [], [], []
    for (m, h), (_o, created, deadline) in pairs.items():
        got = delivered.get((m, h))
        if got is not None and got <= deadline:
            counts["delivered"] += 1
            continue
        end = min(deadline, until)
        n, total = 0, 0.0
        for holder, s, e in held.get(m, ()):
            if holder == h:
                continue
            for cs, ce in contacts.get((holder, h), ()):
                a, b = max(cs, s, created), min(ce, e, end)
                if b > a:
                    n += 1
                    total += b - a
        if n:
            counts["met_not_delivered"] += 1
            meetings.append(n)
            seconds.append(total)
            fragments_held.append(frags[(m, h)][0] if (m, h) in frags else 0)
        else:
            counts["never_met"] += 1

    copy_hours = []
    byte_seconds = 0.0
    for m, intervals in held.items():
        byte_seconds += sum((e - s) * size.get(m, 0) for _, s, e in intervals)
        if m not in targets:
            continue
        _o, created, deadline = next(pairs[(m, h)] for h in targets[m])
        lo, hi = created, min(deadline, until)
        copy_hours.append(
            sum(max(0.0, min(e, hi) - max(s, lo)) for h, s, e in intervals if h not in targets[m])
            / 3600.0
        )
    hosts = len(_read(run_dir, "hosts", ["host"])["host"]) or 1
    never = [(k, v) for k, v in frags.items() if k not in completed]
    n = len(pairs)
    return {
        "until": until,
        "target_pairs": n,
        **counts,
        "share": {k: (v / n if n else None) for k, v in counts.items()},
        "met_meetings_median": lower_median(meetings),
        "met_contact_seconds_median": lower_median(seconds),
        "met_fragments_held_median": lower_median(fragments_held),
        "copy_hours_quartiles": _quartiles(copy_hours),
        "copy_hours_mean": sum(copy_hours) / len(copy_hours) if copy_hours else None,
        "complete_bytes_held_per_host": byte_seconds / (hosts * until) if until else None,
        "transfers_never_completed": len(never),
        "bytes_of_transfers_never_completed": sum(v[1] for _, v in never),
        "transfers_completed": len(completed),
    }


def report(d: dict[str, Any]) -> str:
    def num(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"

    share = d["share"]
    q = d["copy_hours_quartiles"]
    lines = [
        f"target pairs: {d['target_pairs']:,} (logs up to {d['until']:,.0f} s)",
        f"  delivered by the deadline            {d['delivered']:>7,}  {num(share['delivered'], 3)}",
        f"  met a complete holder, not delivered {d['met_not_delivered']:>7,}  "
        f"{num(share['met_not_delivered'], 3)}",
        f"  never met a complete holder          {d['never_met']:>7,}  {num(share['never_met'], 3)}",
        f"those that met one: median {num(d['met_meetings_median'])} meeting(s), "
        f"{num(d['met_contact_seconds_median'], 1)} s of contact, "
        f"{num(d['met_fragments_held_median'])} fragments held",
        "complete-copy hours per message (origin and carriers, creation to deadline): "
        + ("-" if q is None else " / ".join(num(x, 2) for x in q))
        + f" (quartiles), mean {num(d['copy_hours_mean'], 2)}",
        f"complete copies held per host, mean over the run: "
        f"{num(d['complete_bytes_held_per_host'] / 1e6 if d['complete_bytes_held_per_host'] is not None else None, 2)} MB",
        f"transfers completed: {d['transfers_completed']:,}; never completed: "
        f"{d['transfers_never_completed']:,} ({d['bytes_of_transfers_never_completed'] / 1e9:,.2f} GB stored)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder of dodwan-sim run")
    ap.add_argument("--until", type=float, help="end of the logs (default: the run's)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if not (args.run / "run.json").is_file():
        ap.error(f"{args.run} is not a run folder (no run.json)")
    d = diagnose(args.run, args.until)
    print(json.dumps(d) if args.json else report(d))


if __name__ == "__main__":
    main()
