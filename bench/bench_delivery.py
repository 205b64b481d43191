"""Delivery on the ONE-like benchmark (issue 14): ours next to a baseline revision.

Runs the benchmark scenarios of ``scenarios/`` through the simulator, each run in its own
child process, and prints for each, computed from that run's own logs (Parquet tables,
read with pyarrow; no Spark):

* delivery ratio: target (message, interested host) pairs delivered by their deadline,
  over all target pairs;
* the oracle's ratio: pairs reachable over time-respecting paths of the run's own contact
  log with unbounded bandwidth and storage (the model of ``sim/analysis/oracle.py``);
  efficiency = delivery ratio / oracle ratio;
* median delay of the delivered pairs and the oracle's median delay of the pairs it
  reaches (medians as ``dodwan-sim analyze`` takes them: the smallest value with at least
  half the values at or below it);
* bytes sent (every datagram of every kind, every hop) per delivered byte;
* The ONE's overhead ratio as its MessageStatsReport defines it: (relayed - delivered) /
  delivered, where relayed counts every completed transfer of a message to a host (here:
  each ``complete`` event at a host other than the message's origin, final recipients
  included) and delivered the delivered target pairs;
* where the pairs not delivered went (``delivery_diagnosis.py``): the share of pairs whose
  destination met a host holding a complete copy and still did not get the message, and
  of those whose destination never met one; complete-copy hours per message (origin and
  carriers, creation to deadline); transfers started that never completed;
* the issue's goals, met or not.

Variants: ``town1k`` and ``town`` (``one_town_1k.toml`` and ``one_town.toml``: The ONE's
default scenario with hosts moving along the streets and tram lines of a town map,
altruistic, 1 kB and 0.5-1 MB; the default pair), ``1k`` (``one_default_1k.toml``:
altruistic, 1 kB), ``mb`` (``one_default.toml``: the same with random-waypoint movement
over 1500 x 1100 m, 0.5-1 MB), ``trace`` (``one_default_trace.toml``: the 0.5-1 MB traffic
on the bundled ONE contact trace of ``mb``), or the path of any scenario file. With
``--baseline REV`` every variant also runs on a checkout of REV in a temporary git
worktree, in the same invocation, and the two columns are printed side by side with their ratio. Each tree runs its own copy
of the scenario file when it has one. ``--models`` adds the four routers the issue names
in the message-level model of ``reference_routers.py``, on the same contacts (the trace a
variant replays, or those its mobility makes) and messages; for variants that replay a ONE
trace, ``--pons`` adds PONS' routers.

    .venv/bin/python bench/bench_delivery.py --until 10800 --baseline 3cd20bd --jobs 2
    .venv/bin/python bench/bench_delivery.py --variant 1k --until 3600
    .venv/bin/python bench/bench_delivery.py --variant trace --models
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from trees import trees as source_trees

if TYPE_CHECKING:
    from sim.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
FULL = 43200.0
"""The benchmark's horizon (12 h): the goals are stated for whole runs."""
ONE_EPIDEMIC_OVERHEAD = 74.7
"""The ONE's Epidemic router on the same contacts (issue 14)."""


@dataclass(frozen=True)
class Variant:
    key: str
    scenario: str
    """File name under scenarios/, or a path."""
    label: str
    goal: str | None
    """"1k", "mb" or None: which of the issue's goals applies."""


VARIANTS = {
    "town1k": Variant("town1k", "one_town_1k.toml", "town map, altruistic, 1 kB", "1k"),
    "town": Variant("town", "one_town.toml", "town map, altruistic, 0.5-1 MB", "mb"),
    "1k": Variant("1k", "one_default_1k.toml", "altruistic, 1 kB", "1k"),
    "mb": Variant("mb", "one_default.toml", "altruistic, 0.5-1 MB", "mb"),
    "trace": Variant(
        "trace", "one_default_trace.toml", "altruistic, 0.5-1 MB, bundled ONE trace", "mb"
    ),
}


def variant_of(text: str) -> Variant:
    if text in VARIANTS:
        return VARIANTS[text]
    if text.endswith(".toml"):
        return Variant(Path(text).stem, str(Path(text).resolve()), text, None)
    raise argparse.ArgumentTypeError(
        f"unknown variant {text!r}: one of {', '.join(VARIANTS)} or a scenario .toml file"
    )


# ------------------------------------------------------------------------ figures from logs


def _read(
    run_dir: Path, table: str, columns: list[str], filters: Any = None
) -> dict[str, list[Any]]:
    t = pq.read_table(run_dir / f"{table}.parquet", columns=columns, filters=filters)
    return {c: t.column(c).to_pylist() for c in columns}


def lower_median(values: Sequence[float]) -> float | None:
    """The smallest value with at least half the values at or below it (``percentile_approx``
    at 0.5, exact on these sizes)."""
    if not values:
        return None
    s = sorted(values)
    return s[math.ceil(len(s) * 0.5) - 1]


def contact_intervals(run_dir: Path, until: float) -> list[tuple[str, str, float, float]]:
    """(a, b, start, end) with a < b from the up/down log; a link still up ends at ``until``.
    Repeated ups or downs change nothing; events at one time keep their log order."""
    c = _read(run_dir, "contacts", ["time", "a", "b", "up"])
    order = sorted(range(len(c["time"])), key=lambda i: c["time"][i])
    up_since: dict[tuple[str, str], float] = {}
    out = []
    for i in order:
        a, b = c["a"][i], c["b"][i]
        if a == b or a is None or b is None or c["time"][i] is None or c["up"][i] is None:
            continue
        key = (a, b) if a < b else (b, a)
        t = c["time"][i]
        if c["up"][i]:
            up_since.setdefault(key, t)
        elif key in up_since:
            out.append((*key, up_since.pop(key), t))
    out += [(*k, s, max(s, until)) for k, s in up_since.items()]
    return out


class Oracle:
    """Earliest arrivals over time-respecting paths: a host holding a message at t hands it
    to a neighbour at max(t, start) over any contact with end >= t (Dijkstra per message)."""

    def __init__(self, intervals: list[tuple[str, str, float, float]]) -> None:
        adj: dict[str, list[tuple[float, float, str]]] = {}
        for a, b, s, e in intervals:
            adj.setdefault(a, []).append((s, e, b))
            adj.setdefault(b, []).append((s, e, a))
        self.adj = {h: sorted(v) for h, v in adj.items()}
        self.starts = {h: [s for s, _, _ in v] for h, v in self.adj.items()}
        self.longest = {h: max(e - s for s, e, _ in v) for h, v in self.adj.items()}

    def arrivals(self, origin: str, created: float, limit: float) -> dict[str, float]:
        best = {origin: created}
        heap = [(created, origin)]
        while heap:
            t, u = heapq.heappop(heap)
            if t > best[u] or u not in self.adj:
                continue
            edges = self.adj[u]
            for k in range(bisect.bisect_left(self.starts[u], t - self.longest[u]), len(edges)):
                s, e, v = edges[k]
                if s > limit:
                    break
                if e < t:
                    continue
                c = max(t, s)
                if c < best.get(v, math.inf):
                    best[v] = c
                    heapq.heappush(heap, (c, v))
        return best


def figures(run_dir: Path, until: float) -> dict[str, Any]:
    """Every figure the benchmark prints, from the run's log tables."""
    tg = _read(run_dir, "targets", ["msg_id", "host", "origin", "created", "deadline"])
    pairs: dict[tuple[str, str], list[Any]] = {}
    for m, h, o, c, d in zip(*tg.values(), strict=True):
        p = pairs.setdefault((m, h), [o, c, d])
        p[0], p[1], p[2] = min(p[0], o), min(p[1], c), max(p[2], d)
    ev = _read(
        run_dir, "messages", ["time", "host", "msg_id", "event", "bytes"],
        filters=[("event", "in", ["created", "complete", "delivered"])],
    )  # fmt: skip
    origin: dict[str, str] = {}
    first: dict[tuple[str, str], tuple[float, int]] = {}
    completes = []
    for t, h, m, e, b in zip(*ev.values(), strict=True):
        if e == "created":
            origin[m] = min(origin.get(m, h), h)
        elif e == "complete":
            completes.append((m, h))
        elif (m, h) not in first or t < first[(m, h)][0]:
            first[(m, h)] = (t, b)
    delays, delivered_bytes = [], 0
    for key, (_, created, deadline) in pairs.items():
        got = first.get(key)
        if got is not None and got[0] <= deadline:
            delays.append(got[0] - created)
            delivered_bytes += got[1]
    delivered = len(delays)
    relayed = sum(1 for m, h in completes if origin.get(m) != h)

    dg = _read(run_dir, "datagrams", ["kind", "direction", "bytes"])
    sent: dict[str, int] = {}
    for k, d, b in zip(*dg.values(), strict=True):
        if d == "sent":
            sent[k] = sent.get(k, 0) + b
    bytes_sent = sum(sent.values())

    oracle = Oracle(contact_intervals(run_dir, until))
    messages: dict[str, list[Any]] = {}
    for (m, _), (o, c, d) in pairs.items():
        x = messages.setdefault(m, [o, c, d])
        x[0], x[1], x[2] = min(x[0], o), min(x[1], c), max(x[2], d)
    reach: dict[str, dict[str, float]] = {}
    for m, (o, c, d) in messages.items():
        limit = min(d, until)
        reach[m] = oracle.arrivals(o, c, limit) if c <= limit else {}
    oracle_delays = []
    for (m, h), (o, c, d) in pairs.items():
        t = reach[m].get(h)
        if h != o and t is not None and t <= d:
            oracle_delays.append(t - c)

    n = len(pairs)
    ratio = delivered / n if n else None
    oracle_ratio = len(oracle_delays) / n if n else None
    return {
        "target_pairs": n,
        "delivered": delivered,
        "delivery_ratio": ratio,
        "oracle_delivered": len(oracle_delays),
        "oracle_ratio": oracle_ratio,
        "efficiency": ratio / oracle_ratio if ratio is not None and oracle_ratio else None,
        "delay_median": lower_median(delays),
        "oracle_delay_median": lower_median(oracle_delays),
        "delivered_bytes": delivered_bytes,
        "bytes_sent": bytes_sent,
        "fragment_bytes_sent": sent.get("fragment", 0),
        "fragment_share": sent.get("fragment", 0) / bytes_sent if bytes_sent else None,
        "bytes_per_delivered_byte": bytes_sent / delivered_bytes if delivered_bytes else None,
        "relayed": relayed,
        "overhead_ratio": (relayed - delivered) / delivered if delivered else None,
    }


# ------------------------------------------------------------------------------ child runs


def child(spec: dict[str, Any]) -> None:
    """Run one scenario with the ``sim`` package found first on the path (the tree under
    test), and print its figures as one JSON line."""
    from sim.runner import simulate
    from sim.scenario import load

    # Stopped with SIGTERM: unwind, so the temporary log folder goes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    sc = load(spec["scenario"])
    until = spec["until"] or None
    with tempfile.TemporaryDirectory(prefix="bench-delivery-") as tmp:
        out = Path(spec["logs"]) if spec["logs"] else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        t0, c0 = time.perf_counter(), time.process_time()
        res = simulate(sc, out, until=until)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        # the run's own peak, before reading its logs back (which can take more)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        fig = figures(out, res.until)
        fig |= diagnosis_figures(out, res.until)
    fig |= {
        "until": res.until,
        "hosts": res.hosts,
        "wall": wall,
        "cpu": cpu,
        "rss_mb": rss_mb,
        "publish_refused": res.counters.get("sim_publish_refused", 0),
    }
    print(json.dumps(fig), flush=True)


def diagnosis_figures(run_dir: Path, until: float) -> dict[str, Any]:
    """Where the pairs went (``delivery_diagnosis``): the shares that met a complete holder
    and were not delivered, and that never met one; copy hours; failed transfers."""
    from delivery_diagnosis import diagnose  # it imports this module

    d = diagnose(run_dir, until)
    return {
        "met_not_delivered_share": d["share"]["met_not_delivered"],
        "never_met_share": d["share"]["never_met"],
        "copy_hours_mean": d["copy_hours_mean"],
        "transfers_never_completed": d["transfers_never_completed"],
    }


def run_child(tree: Path, spec: dict[str, Any]) -> dict[str, Any] | str:
    """One run in a child process whose ``sim`` and ``dodwan`` come from ``tree``; its
    figures, or why there are none (its error output goes to ours)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode < 0 or proc.returncode == 128 + signal.SIGTERM:
        return f"stopped by signal {-proc.returncode if proc.returncode < 0 else 15}"
    if proc.returncode != 0:
        return f"failed with exit status {proc.returncode} (its error output is above)"
    try:
        out: dict[str, Any] = json.loads(lines[-1])
    except (ValueError, IndexError):
        return f"printed no result: {proc.stdout[-200:]!r}"
    return out


# ------------------------------------------------------------------------------- printing

Fmt = Callable[[Any], str]


def _num(digits: int) -> Fmt:
    return lambda v: "-" if v is None else f"{v:,.{digits}f}"


ROWS: list[tuple[str, str, Fmt]] = [
    ("target pairs", "target_pairs", _num(0)),
    ("delivered pairs", "delivered", _num(0)),
    ("delivery ratio", "delivery_ratio", _num(3)),
    ("oracle ratio", "oracle_ratio", _num(3)),
    ("efficiency (delivery / oracle)", "efficiency", _num(3)),
    ("met complete holder, undelivered", "met_not_delivered_share", _num(3)),
    ("never met a complete holder", "never_met_share", _num(3)),
    ("complete-copy hours per message", "copy_hours_mean", _num(2)),
    ("transfers never completed", "transfers_never_completed", _num(0)),
    ("median delay (s)", "delay_median", _num(0)),
    ("oracle median delay (s)", "oracle_delay_median", _num(0)),
    ("bytes sent per delivered byte", "bytes_per_delivered_byte", _num(2)),
    ("fragment share of bytes sent", "fragment_share", _num(3)),
    ("ONE relayed", "relayed", _num(0)),
    ("ONE overhead ratio", "overhead_ratio", _num(2)),
    ("publications refused", "publish_refused", _num(0)),
    ("simulation CPU (s)", "cpu", _num(1)),
    ("peak RSS (MiB)", "rss_mb", _num(0)),
]


def goals(kind: str | None, f: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """(goal, met or None when undecidable, the figures it compares) for a variant."""
    if kind == "1k":
        eff, d, od = f["efficiency"], f["delay_median"], f["oracle_delay_median"]
        delay_ok = None if d is None or od is None else d <= 2 * od
        return [
            ("delivery >= 0.95 x oracle", None if eff is None else eff >= 0.95,
             "-" if eff is None else f"{eff:.3f} x"),
            ("median delay <= 2 x oracle's", delay_ok,
             "-" if d is None or not od else f"{d / od:.2f} x"),
        ]  # fmt: skip
    if kind == "mb":
        r, o = f["delivery_ratio"], f["overhead_ratio"]
        return [
            ("delivery > 0.56", None if r is None else r > 0.56, _num(3)(r)),
            (f"ONE overhead ratio < {ONE_EPIDEMIC_OVERHEAD}",
             None if o is None else o < ONE_EPIDEMIC_OVERHEAD, _num(2)(o)),
        ]  # fmt: skip
    return []


def _verdict(g: tuple[str, bool | None, str]) -> str:
    state = {True: "met", False: "NOT met", None: "undecided"}[g[1]]
    return f"{state} ({g[2]})"


def report(v: Variant, until: float, results: list[tuple[str, dict[str, Any] | str]]) -> str:
    horizon = f"{until:,.0f} simulated s" if until else "whole run"
    lines = [f"== {v.label} ({Path(v.scenario).name}), {horizon}"]
    good = {n: r for n, r in results if isinstance(r, dict)}
    for n, r in results:
        if isinstance(r, str):
            lines.append(f"  {n}: {r}")
    if not good:
        return "\n".join(lines)
    cols = list(good)
    ratio = len(cols) == 2
    head = f"  {'figure':<32}" + "".join(f"{c:>14}" for c in cols)
    lines.append(head + (f"{cols[0] + '/' + cols[1]:>18}" if ratio else ""))
    for label, key, fmt in ROWS:
        vals = [good[c].get(key) for c in cols]
        row = f"  {label:<32}" + "".join(f"{fmt(x):>14}" for x in vals)
        if ratio:
            a, b = vals
            row += f"{'-' if a is None or not b else f'{a / b:.2f}':>18}"
        lines.append(row)
    per_goal = [goals(v.goal, good[c]) for c in cols]
    for i, g in enumerate(per_goal[0]):
        lines.append(
            f"  goal: {g[0]:<28}"
            + "".join(f"  {c}: {_verdict(per_goal[k][i])}" for k, c in enumerate(cols))
        )
    for c in cols:
        if good[c].get("publish_refused"):
            lines.append(
                f"  ({c}: {good[c]['publish_refused']:,} publications refused by a full cache "
                "have no target pairs: the ratios leave them out)"
            )
    covered = float(good[cols[0]]["until"])
    if per_goal[0] and covered < FULL:
        lines.append(f"  (goals are for the 12 h run; this run covers {covered / 3600:.2f} h)")
    return "\n".join(lines)


# ------------------------------------------------------------- reference routers (PONS)


def pons_report(v: Variant, results: list[tuple[str, str, dict[str, Any] | str]]) -> str:
    """The issue's reference routers replayed by PONS on the variant's own contacts and
    messages: ``(router, radio, PONS' result or why there is none)`` per run."""
    lines = [f"== {v.label}: reference routers on the same contacts and messages (PONS)"]
    lines.append(
        f"  {'router':<10}{'radio':<10}{'delivered':>10}{'delivery':>10}{'ONE overhead':>14}"
    )
    for router, radio, r in results:
        if isinstance(r, str):
            lines.append(f"  {router:<10}{radio:<10}  {r}")
            continue
        st = r["stats"]
        created, delivered = st["created"], st["delivered"]
        ratio = delivered / created if created else None
        overhead = (st["relayed"] - delivered) / delivered if delivered else None
        lines.append(
            f"  {router:<10}{radio:<10}{delivered:>10,}{_num(3)(ratio):>10}{_num(2)(overhead):>14}"
        )
    lines.append("  (parallel: PONS as it is, every transfer at once, arriving if the peer was")
    lines.append("  listed at the last 2 s scan; serial: our medium's physics, one radio per host,")
    lines.append("  the contact must last until the transfer ends; see bench/bench_one.py)")
    return "\n".join(lines)


def _trace_scenario(v: Variant, who: str) -> Scenario | str:
    """The variant's scenario when it replays a ONE contact trace, else the line saying
    that ``who`` cannot replay its contacts."""
    from sim.scenario import load

    sc = load(scenario_in(ROOT, v))
    if sc.contacts is None or sc.contacts.format != "one":
        return f"== {v.label}: no ONE contact trace, so {who} cannot replay its contacts (use --variant trace)"
    return sc


def run_references(v: Variant, until: float) -> str:
    """Run PONS' routers on a variant that replays a ONE contact trace (see ``--pons``)."""
    import bench_one

    sc = _trace_scenario(v, "PONS")
    if isinstance(sc, str):
        return sc
    horizon = until or float(sc.duration)
    results: list[tuple[str, str, dict[str, Any] | str]] = []
    for radio in bench_one.PONS_RADIOS:
        for router in bench_one.PONS_ROUTERS:
            results.append(
                (router, radio, bench_one.run_pons(sc, horizon, 6 * 3600, router, radio))
            )
    return pons_report(v, results)


def model_report(v: Variant, results: list[tuple[str, str, dict[str, Any]]]) -> str:
    """The issue's reference routers in ``bench/reference_routers.py``'s message-level
    model, on the variant's own contacts and messages: ``(router, physics, figures)``."""
    lines = [f"== {v.label}: reference routers on the same contacts and messages (model)"]
    lines.append(
        f"  {'router':<10}{'physics':<10}{'delivered':>10}{'delivery':>10}{'ONE overhead':>14}"
        f"{'median delay':>14}"
    )
    for router, physics, r in results:
        n = r["delivered"]
        lines.append(
            f"  {router:<10}{physics:<10}{n:>10,}{_num(3)(r['ratio']):>10}"
            f"{_num(2)(r['overhead'] if n else None):>14}"
            f"{_num(0)(r['median_delay'] if n else None):>12} s"
        )
    lines.append(
        "  (one: The ONE's physics, a host in one transfer at a time, sending or receiving;"
    )
    lines.append("  medium: our medium's, a host sends one at a time and receives from any number;")
    lines.append(
        "  whole messages, lost if the contact ends first; see bench/reference_routers.py)"
    )
    return "\n".join(lines)


def run_models(v: Variant, until: float) -> str:
    """Run the model's four routers under both physics (see ``--models``)."""
    import reference_routers

    from sim.scenario import load

    sc = load(scenario_in(ROOT, v))
    horizon = until or float(sc.duration)
    contacts = reference_routers.scenario_contacts(sc, horizon)  # once for all eight runs
    results = [
        (router, physics, reference_routers.simulate(sc, router, horizon, physics, contacts))
        for physics in reference_routers.PHYSICS
        for router in reference_routers.ROUTERS
    ]
    return model_report(v, results)


# ----------------------------------------------------------------------------------- main


def scenario_in(tree: Path, v: Variant) -> str:
    """The tree's own copy of a benchmark scenario when it has one, else ours."""
    if Path(v.scenario).is_absolute():
        return v.scenario
    own = tree / "scenarios" / v.scenario
    return str(own if own.exists() else ROOT / "scenarios" / v.scenario)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", help="git revision to run side by side (e.g. 3cd20bd)")
    ap.add_argument(
        "--until",
        type=float,
        default=0.0,
        help="simulated seconds per run (default 0: the scenario's whole 12 h)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        type=variant_of,
        help=f"{', '.join(VARIANTS)} or a scenario .toml (repeatable; default: town1k and town)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel child processes")
    ap.add_argument("--logs", type=Path, help="keep each run's logs in DIR/<tree>-<variant>")
    ap.add_argument(
        "--pons",
        action="store_true",
        help="also run PONS' Epidemic and Spray-and-Wait routers on the same contacts and "
        "messages (variants that replay a ONE trace: trace), as PONS is and with our medium's physics",
    )
    ap.add_argument(
        "--models",
        action="store_true",
        help="also run Epidemic, Spray-and-Wait, PRoPHET and MaxProp in a message-level model "
        "(bench/reference_routers.py) on the same contacts and messages, with "
        "The ONE's physics and ours",
    )
    args = ap.parse_args(argv)  # fmt: skip
    if args.child:
        child(json.loads(args.child))
        return
    if args.until < 0 or args.jobs < 1:
        ap.error("--until must be >= 0 and --jobs >= 1")
    variants: list[Variant] = args.variant or [VARIANTS["town1k"], VARIANTS["town"]]
    with source_trees(args.baseline) as trees:
        jobs = [(v, name, tree) for v in variants for name, tree in trees]

        def one(job: tuple[Variant, str, Path]) -> dict[str, Any] | str:
            v, name, tree = job
            logs = None
            if args.logs:
                safe = re.sub(r"[^\w.-]", "_", name)
                logs = str(args.logs.resolve() / f"{safe}-{v.key}")
            spec = {"scenario": scenario_in(tree, v), "until": args.until, "logs": logs}
            t0 = time.perf_counter()
            r = run_child(tree, spec)
            state = "done" if isinstance(r, dict) else "FAILED"
            print(f"  [{name} {v.key}: {state} after {time.perf_counter() - t0:,.0f} s wall]",
                  file=sys.stderr, flush=True)  # fmt: skip
            return r

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, jobs))
        for v in variants:
            rows = [(n, r) for (jv, n, _), r in zip(jobs, results, strict=True) if jv is v]
            print(report(v, args.until, rows), flush=True)
            if args.pons:
                print(run_references(v, args.until), flush=True)
            if args.models:
                print(run_models(v, args.until), flush=True)


if __name__ == "__main__":
    main()
