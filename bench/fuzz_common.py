"""Shared driver of the fuzz harnesses (bench/fuzz_wire.py, bench/fuzz_stomp.py).

With atheris installed (``pip install atheris``) the target runs under libFuzzer,
coverage-guided, for ``--seconds``; without it, a random-mutation loop over the seed inputs
(bit flips, truncation, splicing, random bytes) runs for the same time. Either way the
target raises :class:`Finding` (or any unexpected exception) on a bug, which stops the run
with the input that caused it written to ``--crash-dir``. Peak RSS is reported at the end.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class Finding(AssertionError):
    """The target misbehaved on an input (an exception escaped, a bound was exceeded)."""


def _mutate(rnd: random.Random, seeds: Sequence[bytes]) -> bytes:
    data = bytearray(rnd.choice(seeds))
    for _ in range(rnd.randrange(1, 6)):
        op = rnd.randrange(6)
        if op == 0 and data:
            i = rnd.randrange(len(data))
            data[i] ^= 1 << rnd.randrange(8)
        elif op == 1 and data:
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        elif op == 2 and data:
            del data[rnd.randrange(len(data)) :]
        elif op == 3:
            other = rnd.choice(seeds)
            cut = rnd.randrange(len(other) + 1)
            data[rnd.randrange(len(data) + 1) :] = other[cut:]
        elif op == 4:
            pos = rnd.randrange(len(data) + 1)
            data[pos:pos] = rnd.randbytes(rnd.randrange(1, 16))
        elif data:
            i = rnd.randrange(len(data))
            data[i] = rnd.choice((0, 0x7F, 0x80, 0xFF, 0x0A, 0x3A))
    return bytes(data)


def run(
    name: str,
    target: Callable[[bytes], None],
    seeds: Sequence[bytes],
    instrument: Sequence[str],
    argv: Sequence[str] | None = None,
) -> None:
    ap = argparse.ArgumentParser(description=f"Fuzz {name}.")
    ap.add_argument("--seconds", type=float, default=60.0, help="run time (default 60)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the fallback mutation loop")
    ap.add_argument("--no-atheris", action="store_true", help="use the fallback loop")
    ap.add_argument("--crash-dir", default=".", help="where a failing input is written")
    args = ap.parse_args(argv)
    crash_dir = Path(args.crash_dir)
    crash_dir.mkdir(
        parents=True, exist_ok=True
    )  # libFuzzer exits if the prefix's folder is missing
    try:
        if args.no_atheris:
            raise ImportError
        import atheris  # type: ignore[import-not-found]
    except ImportError:
        _fallback(name, target, seeds, args.seconds, args.seed, crash_dir)
        return
    import tempfile

    corpus = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    for i, s in enumerate(seeds):
        (corpus / f"seed{i}").write_bytes(s)
    for mod in instrument:
        __import__(mod)
    atheris.instrument_all()  # the targets' modules are already imported: instrument them now

    def one(data: bytes) -> None:
        target(data)

    lib_args = [
        sys.argv[0],
        f"-max_total_time={max(1, int(args.seconds))}",
        f"-artifact_prefix={crash_dir}/",
        "-rss_limit_mb=2048",
        "-max_len=4096",
        "-print_final_stats=1",
        str(corpus),
    ]
    print(f"{name}: atheris (libFuzzer) for {args.seconds:.0f} s; libFuzzer prints the stats")
    atheris.Setup(lib_args, one)
    atheris.Fuzz()


def _report(name: str, engine: str, runs: int, started: float) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    secs = time.monotonic() - started
    print(
        f"{name}: {engine}, {runs} inputs in {secs:.0f} s, no finding, peak RSS {peak // 1024} MB"
    )


def _fallback(
    name: str,
    target: Callable[[bytes], None],
    seeds: Sequence[bytes],
    seconds: float,
    seed: int,
    crash_dir: Path,
) -> None:
    rnd = random.Random(seed)
    started = time.monotonic()
    runs = 0
    while time.monotonic() - started < seconds:
        data = _mutate(rnd, seeds) if rnd.random() < 0.9 else rnd.randbytes(rnd.randrange(300))
        runs += 1
        try:
            target(data)
        except BaseException:
            path = crash_dir / f"crash-{name}-{runs}"
            path.write_bytes(data)
            print(f"{name}: finding after {runs} inputs; input written to {path}")
            raise
    _report(name, "random mutation (atheris not used)", runs, started)
