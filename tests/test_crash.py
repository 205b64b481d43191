"""kill -9 a daemon at random moments under publish/receive traffic, many times over.

Three daemons on loopback multicast: ``a`` and ``c`` stay up, ``b`` is killed with SIGKILL
``DODWAN_CRASH_CYCLES`` times (default 10, 50 when ``CI=true``) at moments drawn from a
seeded RNG (``DODWAN_CRASH_SEED``) while a client thread keeps publishing on ``a`` and ``b``.
``b`` and ``c`` subscribe to everything with a ``--dir`` sink and ``b`` also with an exec
sink that appends ``ID REDELIVERED`` to a log. After each kill:

* ``PRAGMA integrity_check`` of b's database is ``ok``;
* after the restart, every publication on ``b`` whose call had returned, and every message
  ``b`` had delivered (so completely received), is in b's cache; its subscriptions hold.

At the end, every publication that returned reaches both ``--dir`` sinks with the right
payload, and the exec log holds each id once without the redelivered flag (any further run
carries ``DODWAN_REDELIVERED=1``).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.daemon.client import ClientError

STALL = 60.0
ARGS = ["--announce-period", "0.5", "--cache-capacity", str(1 << 30)]


def _cycles() -> int:
    env = os.environ.get("DODWAN_CRASH_CYCLES")
    if env:
        return int(env)
    return 50 if os.environ.get("CI", "").lower() == "true" else 10


def _payload(rnd: random.Random) -> bytes:
    return rnd.randbytes(rnd.choice([100, 1_000, 5_000, 30_000]))


class Traffic(threading.Thread):
    """Publishes on a and b until stopped; remembers what each returned call published."""

    def __init__(self, procs: dict[str, DaemonProc], seed: int) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.rnd = random.Random(seed)
        self.stop = threading.Event()
        self.published: dict[str, tuple[str, str]] = {}  # id -> (host, sha256)
        self.lock = threading.Lock()
        self.failed = 0

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            host = self.rnd.choice(["a", "b"])
            data = _payload(self.rnd)
            n += 1
            try:
                res = (
                    self.procs[host]
                    .client()
                    .publish_bytes(data, attributes={"topic": f"crash.{n}"}, ttl=3600)
                )
            except (ClientError, OSError):
                self.failed += 1  # b is down or was killed during the call
                self.stop.wait(0.02)
                continue
            with self.lock:
                self.published[res["id"]] = (host, hashlib.sha256(data).hexdigest())
            self.stop.wait(0.01)

    def snapshot(self, host: str | None = None) -> dict[str, str]:
        with self.lock:
            return {k: v[1] for k, v in self.published.items() if host in (None, v[0])}


def _integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _delivered(out: Path) -> set[str]:
    return {p.name[:-5] for p in out.glob("*.json") if not p.name.startswith(".")}


def _missing_report(proc: DaemonProc, out: Path, published: dict[str, str]) -> str:
    """What a failed wait says: the ids missing from ``out`` and where ``proc`` has them."""
    missing = sorted(set(published) - _delivered(out))
    try:
        cache = {m["id"]: m for m in proc.client().get("/cache")}
        counters = proc.status()["counters"]
    except (ClientError, OSError) as exc:
        return f"{len(missing)} missing {missing[:5]}; daemon not answering: {exc}"
    where = {
        i: ("not cached" if i not in cache else f"complete={cache[i].get('complete')} "
            f"fragments={cache[i]['fragments']}/{cache[i]['total_fragments']} "
            f"reason={cache[i]['reason']!r}")
        for i in missing[:5]
    }  # fmt: skip
    return f"{len(missing)} missing, first {where}; counters {counters}"


def _wait_delivered(proc: DaemonProc, out: Path, published: dict[str, str]) -> None:
    """Wait until every publication is in ``out``. How long the catching up takes depends
    on the machine's load (b may be hundreds of messages behind, fetched a few catalog
    rounds at a time), so what fails the test is a stall: no new delivery for STALL s."""
    missing = len(set(published) - _delivered(out))
    progress = time.monotonic()
    while missing:
        time.sleep(0.2)
        now_missing = len(set(published) - _delivered(out))
        if now_missing < missing:
            missing, progress = now_missing, time.monotonic()
        elif time.monotonic() - progress > STALL:
            pytest.fail(
                f"no delivery into {out.name} for {STALL} s: "
                + _missing_report(proc, out, published)
            )


def test_kill_9_at_random_moments_loses_nothing(daemons, tmp_path: Path) -> None:
    cycles = _cycles()
    seed = int(os.environ.get("DODWAN_CRASH_SEED", "8"))
    rnd = random.Random(seed)
    group = random_group()
    procs = {n: daemons(n, "--group", group, "--host-id", n, *ARGS) for n in "abc"}
    outs = {n: tmp_path / f"out-{n}" for n in "bc"}
    log = tmp_path / "exec-b.log"
    for n in "bc":
        procs[n].client().post(
            "/subscribe",
            {"patterns": [{"topic": "crash\\..*"}], "key": f"dir-{n}",
             "sink": {"kind": "dir", "target": str(outs[n])}},
        )  # fmt: skip
    procs["b"].client().post(
        "/subscribe",
        {"patterns": [{"topic": "crash\\..*"}], "key": "exec-b",
         "sink": {"kind": "exec", "target": f'echo "$DODWAN_ID ${{DODWAN_REDELIVERED:-0}}" >> {log}'}},
    )  # fmt: skip
    wait_for(lambda: procs["a"].status()["neighbours"] == ["b", "c"], what="a hears b and c")

    traffic = Traffic(procs, seed)
    traffic.start()
    b = procs["b"]
    db = b.state_dir / "dodwan.db"
    try:
        for cycle in range(cycles):
            traffic.stop.wait(rnd.uniform(0.05, 0.6))  # the random moment of the fault
            assert b.kill(signal.SIGKILL) == -signal.SIGKILL, f"cycle {cycle}"
            must_keep = set(traffic.snapshot("b")) | _delivered(outs["b"])
            assert _integrity(db) == "ok", f"cycle {cycle}: integrity check failed"
            b.start()
            cached = {m["id"] for m in b.client().get("/cache") if m["complete"]}
            missing = must_keep - cached
            assert not missing, f"cycle {cycle} (seed {seed}): lost {sorted(missing)[:5]}"
            keys = sorted(s["key"] for s in b.client().get("/subscriptions"))
            assert keys == ["dir-b", "exec-b"], f"cycle {cycle}"
    finally:
        traffic.stop.set()
        traffic.join(30)
    published = traffic.snapshot()
    assert len(published) >= 5 * cycles  # the traffic really ran between the kills
    waited = time.monotonic()
    behind = {n: len(set(published) - _delivered(outs[n])) for n in "bc"}
    for n in "bc":
        _wait_delivered(procs[n], outs[n], published)
    for n in "bc":
        # Besides: publications on b whose call was cut by the kill after b had stored them.
        extra = _delivered(outs[n]) - set(published)
        assert all(x.startswith("b-") for x in extra) and len(extra) <= cycles, extra
        for msg_id, digest in published.items():
            assert hashlib.sha256((outs[n] / msg_id).read_bytes()).hexdigest() == digest
    wait_for(
        lambda: {x.split()[0] for x in log.read_text().splitlines()} >= set(published),
        timeout=30,
        what="every exec delivery",
    )
    runs = Counter(log.read_text().splitlines())
    for msg_id in _delivered(outs["b"]):
        assert runs[f"{msg_id} 0"] + runs[f"{msg_id} 1"] >= 1, f"{msg_id} never run"
        assert runs[f"{msg_id} 0"] <= 1, f"{msg_id} run twice without the redelivered flag"
    assert _integrity(db) == "ok"
    assert all(p.alive for p in procs.values())
    print(
        f"crash suite: {cycles} kills, {len(published)} publications, "
        f"{traffic.failed} calls refused while b was down, "
        f"{len(_delivered(outs['b']) - set(published))} stored on b though the call was cut, "
        f"{sum(v for k, v in runs.items() if k.endswith(' 1'))} flagged exec redeliveries, "
        f"all in both --dir sinks {time.monotonic() - waited:.1f} s after the traffic stopped "
        f"(then missing there: {behind})"
    )
