"""Opt-in memory probes for a running daemon (diagnosis only; off unless asked for).

``DODWAN_MEMTRACE=DIR`` makes the daemon append one JSON line to ``DIR/mem.jsonl`` every
``DODWAN_MEMTRACE_PERIOD`` seconds (default 30): RSS, glibc ``mallinfo2`` (heap in use vs.
free-but-kept), SQLite's own allocator (``sqlite3_memory_used``), the number of live Python
objects by type, and the sizes of the daemon's own tables. With ``DODWAN_TRACEMALLOC=N``
(frames per traceback) tracemalloc runs too and a snapshot is written to
``DIR/snap-<seconds>.tracemalloc`` at each sample, for ``Snapshot.load(...).compare_to``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import json
import os
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

_MALLINFO2 = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2]


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


@functools.cache
def _libsqlite() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
    except OSError:
        return None


def mallinfo() -> dict[str, int]:
    """glibc's heap figures (empty elsewhere): ``uordblks`` in use, ``fordblks`` free."""
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {name: int(getattr(info, name)) for name in _MALLINFO2}


def sqlite_memory() -> dict[str, int]:
    """Bytes SQLite's allocator holds (all connections of the process) and its high mark."""
    lib = _libsqlite()
    if lib is None or not hasattr(lib, "sqlite3_memory_used"):
        return {}
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    lib.sqlite3_memory_highwater.restype = ctypes.c_int64
    lib.sqlite3_memory_highwater.argtypes = [ctypes.c_int]
    return {
        "used": int(lib.sqlite3_memory_used()),
        "highwater": int(lib.sqlite3_memory_highwater(0)),
    }


def rss_kb(field: str = "VmRSS", pid: int | str = "self") -> int:
    """A ``/proc/PID/status`` figure in kB (``VmRSS``, ``RssAnon``, ...); 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def object_counts(top: int = 25) -> dict[str, int]:
    counts = Counter(type(o).__name__ for o in gc.get_objects())
    return dict(counts.most_common(top))


class MemProbe:
    """Writes the samples described in the module docstring; ``sample(extra)`` takes one."""

    def __init__(self, directory: str | Path, period: float, frames: int = 0) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.period = period
        self.frames = frames
        self.started = time.monotonic()
        if frames > 0 and not tracemalloc.is_tracing():
            tracemalloc.start(frames)

    @classmethod
    def from_environment(cls) -> MemProbe | None:
        directory = os.environ.get("DODWAN_MEMTRACE")
        if not directory:
            return None
        period = float(os.environ.get("DODWAN_MEMTRACE_PERIOD", "30"))
        frames = int(os.environ.get("DODWAN_TRACEMALLOC", "0") or 0)
        return cls(directory, period, frames)

    def sample(self, extra: dict[str, Any]) -> None:
        t = round(time.monotonic() - self.started, 1)
        gc.collect()
        rec: dict[str, Any] = {
            "t": t,
            "rss_kb": rss_kb(),
            "rss_anon_kb": rss_kb("RssAnon"),
            "mallinfo": mallinfo(),
            "sqlite": sqlite_memory(),
            "gc_objects": len(gc.get_objects()),
            "types": object_counts(),
            **extra,
        }
        if tracemalloc.is_tracing():
            cur, peak = tracemalloc.get_traced_memory()
            rec["tracemalloc"] = {"current": cur, "peak": peak}
            tracemalloc.take_snapshot().dump(str(self.dir / f"snap-{int(t):06d}.tracemalloc"))
        with open(self.dir / "mem.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
