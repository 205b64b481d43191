"""The ONE-default workload for ``bench_sim.py --workload one``: our runs and PONS on the
same contact trace and the same messages.

Every run happens in a child process (this file run with ``--child SPEC``, or PONS'
script), so each peak RSS is that run's own (``ru_maxrss`` of the child itself) and one
run's heap does not slow the next. The parent prints one block per run and the ratios.

* Ours: ``scenarios/one_default_trace.toml`` (126 hosts replaying the bundled 12-hour
  trace ``scenarios/traces/one_default.one.txt.gz``), altruistic or not (every group's
  ``altruistic`` replaced), 0.5-1 MB or 1 kB messages (the generator's ``size`` replaced).
* PONS: the same trace as a CORE contact plan (one contact per up/down pair, integer
  seconds: start rounded down, end up; 250 kB/s, no loss, no delay), one shared plan for
  all nodes; the messages our generator draws for that run (``sim.traffic.schedule`` ->
  ``as_events``: same times, sources, destinations, sizes; same TTL), created by a SimPy
  process at their exact times the way PONS' own generator creates its messages
  (``router.add``); epidemic routers with 5 MB buffers.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.scenario import Scenario, load  # noqa: E402
from sim.traffic import as_events, schedule  # noqa: E402

TRACE_SCENARIO = ROOT / "scenarios" / "one_default_trace.toml"
GOAL_WALL = 120.0
GOAL_RSS_MB = 1536.0
LINK_RATE = 250_000  # bytes per second (2 Mbit/s), PONS' contact-plan bandwidth unit

# (label, altruistic, size) of every run; the 1 kB ones only with --with-1k.
VARIANTS = [
    ("altruistic, 0.5-1 MB", True, "mb"),
    ("not altruistic, 0.5-1 MB", False, "mb"),
]
VARIANTS_1K = [
    ("altruistic, 1 kB", True, "1k"),
    ("not altruistic, 1 kB", False, "1k"),
]


def variant(
    sc: Scenario,
    altruistic: bool,
    size: str,
    max_datagram: int | None = None,
    request_window: int | None = None,
) -> Scenario:
    """``sc`` with every group's ``altruistic`` set, 1 kB messages when ``size`` is 1k, the
    radio's ``max_datagram`` replaced when given, and every group's ``request_window``
    (fragments) when given."""
    extra: dict[str, Any] = {"altruistic": altruistic}
    if request_window is not None:
        extra["request_window"] = request_window
    groups = tuple(
        dataclasses.replace(
            g,
            protocol=dataclasses.replace(g.protocol, settings={**g.protocol.settings, **extra}),
        )
        for g in sc.groups
    )
    gens = sc.generate
    if size == "1k":
        gens = tuple(dataclasses.replace(g, size=(1000, 1000)) for g in gens)
    radio = sc.radio
    if max_datagram is not None:
        radio = dataclasses.replace(radio, max_datagram=max_datagram)
    return dataclasses.replace(sc, groups=groups, generate=gens, radio=radio)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(spec: dict[str, Any]) -> None:
    """Run one variant of ours (in this process) and print its figures as one JSON line."""
    from sim.cli import ProgressLines
    from sim.runner import simulate

    sc = variant(
        load(spec["scenario"]), spec["altruistic"], spec["size"], spec.get("max_datagram"),
        spec.get("request_window"),
    )  # fmt: skip
    until = spec["until"]
    progress = ProgressLines(spec["label"], until, spec["progress"]) if spec["progress"] else None
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        res = simulate(sc, Path(tmp), until=until, progress=progress)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {
        "wall": wall,
        "cpu": cpu,
        "rss_mb": _peak_rss_mb(),
        "hosts": res.hosts,
        "until": res.until,
        "events": res.events,
        "counters": res.counters,
    }
    print(json.dumps(out), flush=True)


def _run_child(cmd: list[str], timeout: float) -> dict[str, Any] | str:
    """Run a child that prints one JSON line last; its figures, or why there are none."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"did not finish within {timeout:.0f} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0:
        return f"failed with exit status {proc.returncode} (its error output is above)"
    try:
        out: dict[str, Any] = json.loads(lines[-1])
    except (ValueError, IndexError):
        return f"printed no result: {proc.stdout[-200:]!r}"
    return out


# ------------------------------------------------------------------------------ PONS

PONS_SCRIPT = r"""
import copy, json, logging, resource, sys, time
logging.disable(logging.CRITICAL)
import pons, pons.routing
from pons.net.plans.core import CoreContact, CoreContactPlan

class SharedPlan(CoreContactPlan):
    # PONS deep-copies each node's network settings; one read-only plan serves all nodes.
    def __deepcopy__(self, memo):
        return self

with open(sys.argv[1]) as f:
    cfg = json.load(f)
n, until = cfg["hosts"], cfg["until"]
plan = SharedPlan(contacts=[
    CoreContact((s, e), (a, b), cfg["rate"], 0.0, 0.0, 0.0) for s, e, a, b in cfg["contacts"]])
net = pons.NetworkSettings("contactplan", range=0, contactplan=plan)
ROUTERS = {
    "epidemic": lambda: pons.routing.EpidemicRouter(capacity=cfg["cache"]),
    # The ONE's default for its Spray-and-Wait router: binary, 6 copies.
    "spray": lambda: pons.routing.SprayAndWaitRouter(copies=6, binary=True, capacity=cfg["cache"]),
}
nodes = pons.generate_nodes(n, net=[net], router=ROUTERS[cfg["router"]]())

if cfg["radio"] == "serial":
    # One radio per host, as in our medium: a host's transmissions go one after another
    # (PONS starts each at once, in parallel, whatever else the host is sending); each
    # still arrives only if the pair is in contact at its end.
    import pons.node
    from pons.net.common import BROADCAST_ADDR
    from simpy.util import start_delayed

    busy = [0.0] * n

    def serial_send(self, netsim, to_nid, msg):
        now = netsim.env.now
        for net in self.net.values():
            nbrs = self.neighbors[net.name]
            targets = list(nbrs) if to_nid == BROADCAST_ADDR else [to_nid] if to_nid in nbrs else []
            if not targets:
                continue
            try:
                tx = net.tx_time_for_contact(now, self.node_id, targets[0], msg.size)
            except Exception:
                continue
            end = max(now, busy[self.node_id]) + tx
            busy[self.node_id] = end
            for nid in targets:
                netsim.net_stats["tx"] += 1
                start_delayed(netsim.env, arrive(netsim, net, self.node_id, nid, msg), end - now)

    def arrive(netsim, net, frm, to, msg):
        # PONS checks the receiver's neighbour list, refreshed at its scans (every 2 s):
        # here the contact itself must last until the transfer ends.
        plan, now = net.contactplan, netsim.env.now
        if plan.has_contact(now, frm, to) or plan.has_contact(now, to, frm):
            yield from netsim.nodes[to].on_recv(netsim, frm, msg)
        else:
            netsim.net_stats["drop"] += 1
            netsim.nodes[frm].router._on_tx_failed(msg.unique_id(), to)
            yield netsim.env.timeout(0)

    pons.node.Node.send = serial_send

def creations(netsim):
    env = netsim.env
    for t, mid, src, dst, size in cfg["messages"]:
        if t > env.now:
            yield env.timeout(t - env.now)
        netsim.routing_stats["created"] += 1
        netsim.nodes[src].router.add(pons.Message(mid, src, dst, size, env.now, ttl=cfg["ttl"],
                                                  metadata={}))

sim = pons.NetSim(until, nodes, world_size=(1, 1), config={"movement_logger": False,
                  "peers_logger": False})
sim.setup()
sim.env.process(creations(sim))
t, c = time.perf_counter(), time.process_time()
sim.run()
wall, cpu = time.perf_counter() - t, time.process_time() - c
print()
print(json.dumps({"wall": wall, "cpu": cpu, "host_seconds": n * until, "until": until,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "net": sim.net_stats, "stats": sim.routing_stats}))
"""


def one_contacts(path: Path, until: float) -> list[tuple[int, int, int, int]]:
    """The up/down pairs of a ONE connectivity trace (0-based host numbers) as
    ``(start, end, a, b)`` in integer seconds (start rounded down, end up), cut at
    ``until``; links still up at the end of the file close at ``until``."""
    opener = gzip.open if path.suffix == ".gz" else open
    up: dict[tuple[int, int], float] = {}
    out: list[tuple[int, int, int, int]] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if len(fields) != 5 or fields[1] != "CONN":
                continue
            t, a, b, state = float(fields[0]), int(fields[2]), int(fields[3]), fields[4]
            key = (min(a, b), max(a, b))
            if t >= until:
                break
            if state == "up":
                up.setdefault(key, t)
            elif key in up:
                start = up.pop(key)
                out.append((math.floor(start), math.ceil(t), key[0], key[1]))
    out.extend((math.floor(s), math.ceil(until), a, b) for (a, b), s in up.items())
    out.sort()
    return out


PONS_RADIOS = ("parallel", "serial")
"""How PONS' hosts transmit. ``parallel`` is PONS as it is: every transmission starts at
once and takes size / rate, however many a host has under way (its routers hand a peer
their whole store at each scan), and it arrives if the receiver still lists the sender
as a neighbour, a list each host refreshes at its scans (every 2 s), so a transfer may
end up to 2 s after its contact did. ``serial`` is the physics of our medium: one radio
per host (its transmissions queue one after another), and a transfer arrives only if the
pair is still in contact when it ends."""

PONS_ROUTERS = ("epidemic", "spray")
"""PONS routers the comparison can run: epidemic, and binary Spray-and-Wait with 6 copies
(The ONE's default for that router). Not PRoPHET: pons-dtn 0.2.1's PRoPHET router stops
with an IndexError in ``make_room_for`` once 5 MB buffers fill (its used-bytes count
drifts from its store)."""


def pons_config(
    sc: Scenario, until: float, router: str = "epidemic", radio: str = "parallel"
) -> dict[str, Any]:
    """PONS' inputs: the scenario's contact trace and the messages it generates."""
    if router not in PONS_ROUTERS:
        raise ValueError(f"unknown PONS router {router!r} (one of {', '.join(PONS_ROUTERS)})")
    if radio not in PONS_RADIOS:
        raise ValueError(f"unknown PONS radio {radio!r} (one of {', '.join(PONS_RADIOS)})")
    if sc.contacts is None or sc.contacts.format != "one":
        raise ValueError(f"{sc.name}: needs a ONE contact trace in [contacts]")
    names = sc.host_names()
    pubs = schedule(sc, names, until)
    ttls = {p.ttl for p in pubs}
    if len(ttls) > 1:
        raise ValueError(f"{sc.name}: messages with different TTLs ({sorted(ttls)[:3]} ...)")
    caches = {g.protocol.cache_capacity for g in sc.groups}
    return {
        "hosts": len(names),
        "until": int(until),
        "rate": LINK_RATE,
        "cache": max(caches),
        "ttl": int(ttls.pop()) if ttls else 3600,
        "contacts": one_contacts(sc.contacts.path, until),
        "messages": as_events(sc, pubs),
        "router": router,
        "radio": radio,
    }


def run_pons(
    sc: Scenario, until: float, timeout: float, router: str = "epidemic", radio: str = "parallel"
) -> dict[str, Any] | str:
    try:
        import pons  # noqa: F401
    except ImportError:
        return "PONS is not installed; install it with: pip install '.[bench]' (pons-dtn)"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(pons_config(sc, until, router, radio), f)
    try:
        res = _run_child([sys.executable, "-c", PONS_SCRIPT, f.name], timeout)
        if isinstance(res, dict):
            res["router"], res["radio"] = router, radio
        return res
    finally:
        Path(f.name).unlink()


# ------------------------------------------------------------------------------ report


def _print_ours(label: str, r: dict[str, Any]) -> None:
    c = r["counters"]
    hs = r["hosts"] * r["until"]
    print(f"== dodwan-sim, {label}: {r['hosts']} hosts, {r['until']:.0f} simulated s")
    print(f"wall time            {r['wall']:10.1f} s (set-up, run and Parquet logs)")
    print(f"cpu time             {r['cpu']:10.1f} s")
    print(f"host-seconds / s     {hs / r['wall']:10,.0f}  ({hs / r['cpu']:,.0f} per CPU second)")
    print(f"events / s           {r['events'] / r['wall']:10,.0f}  ({r['events']:,} events)")
    print(f"peak RSS             {r['rss_mb']:10.0f} MB (this run's own process)")
    print(
        f"datagrams sent       {c.get('medium_sent', 0):10,}  "
        f"({c.get('bytes_sent', 0) / 1e6:,.1f} MB; {c.get('medium_delivered', 0):,} received)"
    )
    print(
        f"messages             {c.get('sim_published', 0):10,} published, "
        f"{c.get('sim_deliveries', 0):,} delivered to their destination"
    )


def _print_goal(r: dict[str, Any]) -> None:
    if r["until"] < 43200:
        print(
            f"goal (whole 12 h run < {GOAL_WALL:.0f} s, < {GOAL_RSS_MB / 1024:.1f} GB peak RSS): "
            f"not judged, this run covers {r['until'] / 3600:.2f} h (use the default --until)"
        )
        return
    rss_ok = r["rss_mb"] < GOAL_RSS_MB
    for what in ("wall", "cpu"):
        ok = r[what] < GOAL_WALL and rss_ok
        print(
            f"goal (< {GOAL_WALL:.0f} s and < {GOAL_RSS_MB / 1024:.1f} GB peak RSS) "
            f"{'met' if ok else 'NOT met'} in {what} time "
            f"({r[what]:.0f} s, {r['rss_mb']:,.0f} MB)"
        )


def _print_pons(label: str, r: dict[str, Any], ours: dict[str, Any] | None) -> None:
    st, net = r["stats"], r["net"]
    hs = float(r["host_seconds"])
    print(
        f"== PONS, same trace and messages ({label}), {r['router']}, {r['radio']} radio, "
        f"{r['until']:.0f} simulated s"
    )
    print(f"wall time            {r['wall']:10.1f} s (run only, set-up excluded)")
    print(f"cpu time             {r['cpu']:10.1f} s")
    print(f"host-seconds / s     {hs / r['wall']:10,.0f}  ({hs / r['cpu']:,.0f} per CPU second)")
    print(f"peak RSS             {r['rss_mb']:10.0f} MB")
    print(f"transmissions        {net['tx']:10,}  (whole messages, {net['rx']:,} received)")
    print(
        f"messages             {st['created']:10,} created, {st['delivered']:,} delivered "
        f"({st['delivered'] / max(1, st['created']):.3f})"
    )
    if ours is not None:
        o_hs = ours["hosts"] * ours["until"]
        print(
            f"ratio ours / PONS    {o_hs / ours['wall'] / (hs / r['wall']):10.2f} wall, "
            f"{o_hs / ours['cpu'] / (hs / r['cpu']):.2f} per CPU second "
            f"(host-seconds per second; > 1: we are faster)"
        )


def main(
    until: float | None,
    with_1k: bool,
    skip_pons: bool,
    progress: float | None,
    max_datagram: int | None = None,
    pons_routers: tuple[str, ...] = ("epidemic",),
    pons_radios: tuple[str, ...] = ("parallel",),
    request_window: int | None = None,
) -> None:
    sc = load(TRACE_SCENARIO)
    horizon = float(sc.duration if until is None else until)
    print(
        f"ONE-default workload: {TRACE_SCENARIO.relative_to(ROOT)} on "
        f"{sc.contacts.path.relative_to(ROOT) if sc.contacts else '?'}, {horizon:.0f} simulated s, "
        f"datagrams of at most {max_datagram or sc.radio.max_datagram} bytes"
        + (f", request window {request_window} fragments" if request_window else "")
    )
    ours: dict[str, dict[str, Any]] = {}
    for label, altruistic, size in VARIANTS + (VARIANTS_1K if with_1k else []):
        spec = {
            "scenario": str(TRACE_SCENARIO), "label": label, "altruistic": altruistic,
            "size": size, "until": horizon, "progress": progress, "max_datagram": max_datagram,
            "request_window": request_window,
        }  # fmt: skip
        res = _run_child([sys.executable, __file__, "--child", json.dumps(spec)], 6 * 3600)
        if isinstance(res, str):
            print(f"== dodwan-sim, {label}: {res}")
            continue
        _print_ours(label, res)
        if altruistic and size == "mb":
            _print_goal(res)
        ours[f"{altruistic}/{size}"] = res
        sys.stdout.flush()
    if skip_pons:
        return
    for size, label in (("mb", "0.5-1 MB"), ("1k", "1 kB")):
        if size == "1k" and not with_1k:
            continue
        for radio in pons_radios:
            for router in pons_routers:
                pres = run_pons(variant(sc, True, size), horizon, 6 * 3600, router, radio)
                if isinstance(pres, str):
                    print(f"== PONS ({label}, {router}, {radio} radio): {pres}")
                    continue
                _print_pons(label, pres, ours.get(f"True/{size}"))
                sys.stdout.flush()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        sys.exit("run bench/bench_sim.py --workload one (this file is its helper)")
