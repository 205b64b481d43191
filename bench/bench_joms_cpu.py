"""CPU per message of JOMS in one process, without sockets or a client.

The same path as ``bench_stomp.py``'s JOMS broker (``joms.runtime`` with a state
directory: STOMP gateway, JOMS service and its SQLite store, a DoDWAN core node with its
SQLite cache), fed runs of 50 one-KB SENDs (a receipt on the last) through in-memory
transports, one subscriber taking the messages (``ack:auto``): the CPU time of the
process per message, and how much of it the core's ``Node.publish`` takes. Where
``bench_stomp.py`` measures a broker against ActiveMQ on a machine others share (its
throughput follows their load), this isolates JOMS's own cost, run after run.

Modes as in ``bench_stomp.py``: ``non-persistent`` (a topic, a plain subscription,
``persistent:false``) and ``persistent`` (a durable subscription, ``persistent:true``).

Usage::

    .venv/bin/python bench/bench_joms_cpu.py [--count 10000] [--rounds 5] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dodwan.core import node as core_node  # noqa: E402
from dodwan.daemon.collector import settle_collector  # noqa: E402
from joms.runtime import HostConfig, LoopbackHost  # noqa: E402
from joms.stomp.frame import Frame, encode  # noqa: E402

RUN = 50
"""SENDs per run (one read, one receipt), as bench_stomp.py's --window."""


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.frames = 0

    def write(self, data: Any) -> None:
        self.frames += bytes(data).count(b"MESSAGE\n")

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _client(host: LoopbackHost, **headers: str) -> tuple[Any, _Transport]:
    conn = host.server.gateway.protocol()  # type: ignore[union-attr]
    t = _Transport()
    conn.connection_made(t)
    conn.data_received(encode(Frame("CONNECT", {"accept-version": "1.2", "host": "b", **headers})))
    return conn, t


class _CoreClock:
    """Wall time spent inside ``Node.publish`` (its store writes included)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._orig = core_node.Node.publish

    def __enter__(self) -> _CoreClock:
        orig, clock = self._orig, self

        def timed(node: Any, *a: Any, **k: Any) -> str:
            t = time.perf_counter()
            try:
                return orig(node, *a, **k)
            finally:
                clock.seconds += time.perf_counter() - t
                clock.calls += 1

        core_node.Node.publish = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        core_node.Node.publish = self._orig  # type: ignore[method-assign]


async def _round(mode: str, count: int, profile: cProfile.Profile | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-joms-cpu-") as tmp:
        h = await LoopbackHost(HostConfig("bench", state_dir=Path(tmp))).start()
        gc_threshold = gc.get_threshold()
        settle_collector()  # as python -m joms.runtime does once started
        try:
            persistent = mode == "persistent"
            sub, st = _client(h, **({"client-id": "b1"} if persistent else {}))
            sh = {"destination": "/topic/bench", "id": "1", "ack": "auto"}
            if persistent:
                sh["activemq.subscriptionName"] = "bench"
            sub.data_received(encode(Frame("SUBSCRIBE", sh)))
            pub, _ = _client(h)
            body = b"x" * 1024
            headers = {"destination": "/topic/bench", "seq": "t",
                       "persistent": "true" if persistent else "false",
                       "content-type": "application/octet-stream"}  # fmt: skip

            def run(i: int) -> bytes:
                last = {**headers, "receipt": f"r{i}"}
                frames = [
                    Frame("SEND", last if k == RUN - 1 else headers, body) for k in range(RUN)
                ]
                return b"".join(encode(f) for f in frames)

            warm = [run(i) for i in range(20)]
            runs = [run(i) for i in range(20, 20 + count // RUN)]
            for r in warm:  # caches, the first SQLite pages
                pub.data_received(r)
                await asyncio.sleep(0)
            taken = st.frames
            with _CoreClock() as core:
                if profile is not None:
                    profile.enable()
                c0, w0 = time.process_time(), time.perf_counter()
                for r in runs:
                    pub.data_received(r)
                    await asyncio.sleep(0)  # the loop turn between two reads
                c1, w1 = time.process_time(), time.perf_counter()
                if profile is not None:
                    profile.disable()
            n = len(runs) * RUN
            assert st.frames - taken == n, f"{st.frames - taken} of {n} messages delivered"
            return {
                "cpu_us": (c1 - c0) / n * 1e6,
                "wall_us": (w1 - w0) / n * 1e6,
                "core_us": core.seconds / max(1, core.calls) * 1e6,
            }
        finally:
            await h.stop()
            gc.unfreeze()  # (the next round starts from the same state)
            gc.set_threshold(*gc_threshold)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--count", type=int, default=10_000, help="messages per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="non-persistent,persistent")
    ap.add_argument("--profile", help="write a cProfile of the measured part here (+.MODE)")
    args = ap.parse_args()
    print(f"{args.rounds} rounds of {args.count} messages (runs of {RUN} SENDs), per message:")
    print("| mode | CPU us (median, min) | wall us (median) | core Node.publish us (median) |")
    print("|---|---|---|---|")
    for mode in args.modes.split(","):
        prof = cProfile.Profile() if args.profile else None
        rounds = [asyncio.run(_round(mode, args.count, prof)) for _ in range(args.rounds)]
        if prof is not None:
            prof.dump_stats(f"{args.profile}.{mode}")

        def med(k: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[k] for r in rounds)

        print(
            f"| {mode} | {med('cpu_us'):.0f} ({min(r['cpu_us'] for r in rounds):.0f}) | "
            f"{med('wall_us'):.0f} | {med('core_us'):.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
