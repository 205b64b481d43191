"""Benchmark dodwan-sim on a scenario (default: campus) or the ONE-default workload, and compare with PONS.

``--workload campus`` (default): prints simulated host-seconds per wall second, simulation
events per second, peak memory, a cProfile of a shorter run (where time goes), and the
speed of PONS (``pons-dtn``, a SimPy DTN simulator with abstract routers) on an equivalent
random-waypoint epidemic configuration, with our speed as a ratio to it.

``--workload one``: The ONE's default workload (126 hosts, 12 h, one 0.5-1 MB message every
25-35 s to a random host, TTL 5 h, 5 MB caches, 250 kB/s links) replayed from the bundled
contact trace ``scenarios/traces/one_default.one.txt.gz`` (``scenarios/one_default_trace.toml``),
altruistic and not (and with ``--with-1k`` the 1 kB variant), each run in its own child
process so its peak RSS is its own; then PONS (epidemic router, 5 MB buffers) on the SAME
contact trace (as a CORE contact plan at 250 kB/s) and the SAME generated messages (same
times, sources, destinations, sizes, TTL), with the ratio. See ``bench_one.py``.

PONS runs in a child process; when it is missing or fails, the reason is printed and our
figures still are.

    .venv/bin/python bench/bench_sim.py                    # full 12-hour campus run
    .venv/bin/python bench/bench_sim.py --until 3600 --profile-until 600
    .venv/bin/python bench/bench_sim.py --workload one --until 10800
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.scenario import Scenario, load  # noqa: E402

PONS_SCRIPT = r"""
import json, logging, random, sys, time
logging.disable(logging.CRITICAL)
import pons, pons.routing
cfg = json.loads(sys.argv[1])
random.seed(cfg["seed"])
n, until = cfg["hosts"], cfg["until"]
moves = pons.generate_randomwaypoint_movement(
    until, n, cfg["width"], cfg["height"], min_speed=cfg["speed"][0], max_speed=cfg["speed"][1],
    min_pause=cfg["pause"][0], max_pause=cfg["pause"][1])
net = pons.NetworkSettings("radio", range=cfg["range"])
nodes = pons.generate_nodes(n, net=[net], router=pons.routing.EpidemicRouter(capacity=cfg["cache"]))
gen = {"type": "single", "interval": cfg["interval"], "src": (0, n), "dst": (0, n),
       "size": cfg["size"], "id": "M", "ttl": cfg["ttl"]}
sim = pons.NetSim(until, nodes, world_size=(cfg["width"], cfg["height"]), movements=moves,
                  config={"movement_logger": False, "peers_logger": False}, msggens=[gen])
sim.setup()
t, c = time.perf_counter(), time.process_time()
sim.run()
wall, cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"wall": wall, "cpu": cpu, "host_seconds": n * until, "stats": sim.routing_stats}))
"""


def pons_config(sc: Scenario, until: float) -> dict[str, object]:
    """An equivalent PONS setup: same hosts, world, range, waypoint speeds/pauses, traffic."""
    walkers = [g for g in sc.groups if g.mobility.model == "random_waypoint"] or list(sc.groups)
    g = walkers[0]
    rate = sum(len(sc.resolve(p.hosts)) / p.interval for p in sc.publish) or 1 / 3600
    pub = sc.publish[0] if sc.publish else None
    return {
        "seed": sc.seed,
        "hosts": len(sc.host_names()),
        "until": int(until),
        "width": sc.world[0],
        "height": sc.world[1],
        "range": sc.radio.range,
        "speed": list(g.mobility.speed),
        "pause": list(g.mobility.pause),
        "cache": g.protocol.cache_capacity,
        "interval": max(1, round(1 / rate)),
        "size": pub.size if pub else 1000,
        "ttl": int(pub.ttl) if pub else 3600,
    }


def run_pons(sc: Scenario, until: float) -> dict[str, object] | str:
    """Run PONS in a child process; return its figures or why it could not run."""
    cfg = json.dumps(pons_config(sc, until))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PONS_SCRIPT, cfg], capture_output=True, text=True, timeout=3600
        )
    except subprocess.TimeoutExpired:
        return "PONS did not finish within an hour"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"PONS failed ({last}); install it with: pip install pons-dtn"
    try:
        out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"PONS printed no result: {proc.stdout[-200:]!r}"
    return out


def profile(sc: Scenario, until: float, top: int) -> str:
    from sim.runner import Simulation

    sim = Simulation(sc, until=until)
    prof = cProfile.Profile()
    prof.enable()
    sim.run()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=["campus", "one"], default="campus",
                    help="campus: --scenario vs PONS on an equivalent random-waypoint setup; "
                         "one: the ONE-default workload on its bundled contact trace, "
                         "altruistic and not, vs PONS on the same trace and messages")  # fmt: skip
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "campus.toml"),
                    help="scenario of the campus workload")  # fmt: skip
    ap.add_argument("--until", type=float, help="simulated seconds (default: whole scenario)")
    ap.add_argument("--profile-until", type=float,
                    help="simulated seconds of the profiled run (0: no profile; default 1800, "
                         "3600 for the one workload, whose first minutes carry few messages)")  # fmt: skip
    ap.add_argument("--top", type=int, default=25, help="profile entries to print")
    ap.add_argument("--pons-until", type=float,
                    help="campus: simulated seconds of the PONS run (default: same as ours; 0: skip)")  # fmt: skip
    ap.add_argument("--skip-pons", action="store_true", help="do not run PONS")
    ap.add_argument("--with-1k", action="store_true",
                    help="one: also the 1 kB message variants (ours and PONS)")  # fmt: skip
    ap.add_argument("--pons-router", action="append", metavar="NAME",
                    help="one: PONS router to compare with (epidemic, spray: binary "
                         "Spray-and-Wait with 6 copies); repeatable, default epidemic")  # fmt: skip
    ap.add_argument("--pons-radio", action="append", metavar="MODE",
                    help="one: how PONS' hosts transmit: parallel (PONS as it is: every "
                         "transmission at once) or serial (one radio per host, as ours); "
                         "repeatable, default parallel")  # fmt: skip
    ap.add_argument("--max-datagram", type=int, metavar="BYTES",
                    help="one: our runs send datagrams of at most BYTES (the scenario's 1400 "
                         "otherwise); fewer, larger fragments for the same bytes")  # fmt: skip
    ap.add_argument("--request-window", type=int, metavar="FRAGMENTS",
                    help="one: our runs' request_window (the scenario's otherwise, 64): with "
                         "--max-datagram, the same bytes asked at once is 64 x 1400 / BYTES")  # fmt: skip
    ap.add_argument("--progress", type=float, metavar="SECONDS",
                    help="one: each of our runs prints a progress line every SECONDS on stderr")  # fmt: skip
    args = ap.parse_args()
    if args.until is not None and args.until <= 0:
        ap.error("--until must be > 0")
    if args.max_datagram is not None and not 256 <= args.max_datagram <= 65507:
        ap.error("--max-datagram must be between 256 and 65507 bytes")
    if args.request_window is not None and args.request_window < 1:
        ap.error("--request-window must be at least 1 fragment")

    if args.workload == "one":
        import bench_one

        routers = tuple(args.pons_router or ["epidemic"])
        unknown = [r for r in routers if r not in bench_one.PONS_ROUTERS]
        if unknown:
            ap.error(
                f"--pons-router: unknown {unknown[0]!r} (one of {', '.join(bench_one.PONS_ROUTERS)})"
            )
        radios = tuple(args.pons_radio or ["parallel"])
        unknown = [r for r in radios if r not in bench_one.PONS_RADIOS]
        if unknown:
            ap.error(
                f"--pons-radio: unknown {unknown[0]!r} (one of {', '.join(bench_one.PONS_RADIOS)})"
            )
        bench_one.main(
            args.until, args.with_1k, args.skip_pons, args.progress, args.max_datagram, routers,
            radios, args.request_window,
        )  # fmt: skip
        profile_until = 3600.0 if args.profile_until is None else args.profile_until
        if profile_until > 0:
            sc = bench_one.variant(
                load(bench_one.TRACE_SCENARIO), True, "mb", args.max_datagram, args.request_window
            )
            print(
                f"\n== profile of a {profile_until:.0f} s run, altruistic, 0.5-1 MB (top {args.top})"
            )
            print(profile(sc, profile_until, args.top))
        return
    if args.skip_pons:
        args.pons_until = 0.0
    if args.profile_until is None:
        args.profile_until = 1800.0

    from sim.runner import simulate

    sc = load(args.scenario)
    hosts = len(sc.host_names())
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        sim_result = simulate(sc, Path(tmp), until=args.until)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    host_seconds = hosts * sim_result.until
    ours = host_seconds / wall
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    c = sim_result.counters
    print(f"== dodwan-sim: {sc.name}, {hosts} hosts, {sim_result.until:.0f} simulated s")
    print(f"wall time            {wall:10.1f} s (tables and run.json included)")
    print(f"cpu time             {cpu:10.1f} s (differs from wall when the machine is busy)")
    print(f"host-seconds / s     {ours:10,.0f}  ({host_seconds / cpu:,.0f} per CPU second)")
    print(f"events / s           {sim_result.events / wall:10,.0f}  ({sim_result.events:,} events)")
    print(f"peak memory (RSS)    {peak_mb:10.0f} MB")
    print(
        f"protocol traffic     {c.get('medium_sent', 0):,} datagrams sent, "
        f"{c.get('bytes_sent', 0) / 1e6:.1f} MB; {c.get('sim_published', 0)} published, "
        f"{c.get('sim_deliveries', 0)} deliveries"
    )
    if sim_result.until >= 43200 and hosts >= 100:
        for label, secs in (("wall", wall), ("CPU", cpu)):
            verdict = "met" if secs < 180 else "NOT met"
            print(f"goal (< 180 s for the whole run) {verdict} in {label} time ({secs:.0f} s)")

    if args.profile_until > 0:
        print(f"\n== profile of a {args.profile_until:.0f} s run (top {args.top})")
        print(profile(sc, args.profile_until, args.top))

    pons_until = sim_result.until if args.pons_until is None else args.pons_until
    if pons_until > 0:
        print(f"== PONS, equivalent random-waypoint epidemic run, {pons_until:.0f} s")
        if pons_until != sim_result.until:
            print("(not the same duration as ours: rates change as caches fill, compare with care)")
        res = run_pons(sc, pons_until)
        if isinstance(res, str):
            print(res)
        else:
            pons_rate = float(res["host_seconds"]) / float(res["wall"])  # type: ignore[arg-type]
            print(f"PONS wall time       {float(res['wall']):10.1f} s")  # type: ignore[arg-type]
            print(f"PONS host-seconds/s  {pons_rate:10,.0f}")
            pons_cpu = float(res["host_seconds"]) / float(res["cpu"])  # type: ignore[arg-type]
            print(f"PONS per CPU second  {pons_cpu:10,.0f}")
            print(f"ratio ours / PONS    {ours / pons_rate:10.2f}  (goal >= 1; wall clock)")
            print(f"ratio per CPU second {host_seconds / cpu / pons_cpu:10.2f}")


if __name__ == "__main__":
    main()
