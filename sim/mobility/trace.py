"""Contact traces: The ONE's connectivity format and a simple CSV, parsed into link events.

The ONE: one event per line, ``<time> CONN <a> <b> up|down`` (blank lines and ``#``
comments are skipped). CSV: ``time,a,b,up`` with an optional header line; ``up`` is one of
``up/down``, ``1/0``, ``true/false``. Host ids in a trace name scenario hosts: either a
host's name or a 0-based index into the scenario's host list (The ONE numbers its hosts).
"""

from __future__ import annotations

import csv
import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

_UP = {"up": True, "1": True, "true": True, "down": False, "0": False, "false": False}


class TraceError(Exception):
    """A contact trace that cannot be replayed (the message names the file and line)."""


@dataclass(frozen=True)
class LinkEvent:
    """A link between two trace hosts coming up or going down."""

    time: float
    a: str
    b: str
    up: bool


def _event(path: Path, lineno: int, t: str, a: str, b: str, state: str) -> LinkEvent:
    try:
        time = float(t)
    except ValueError:
        raise TraceError(f"{path}:{lineno}: time {t!r} is not a number") from None
    if not math.isfinite(time) or time < 0:
        raise TraceError(f"{path}:{lineno}: time {t!r} must be a finite number >= 0")
    up = _UP.get(state.strip().lower())
    if up is None:
        raise TraceError(f"{path}:{lineno}: state {state!r} is not up or down")
    if a == b:
        raise TraceError(f"{path}:{lineno}: a host cannot be in contact with itself ({a!r})")
    return LinkEvent(time, a.strip(), b.strip(), up)


def _open(path: Path, newline: str | None = None) -> TextIO:
    """A trace file as text; ``*.gz`` files are decompressed on the fly."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline=newline)
    return path.open(encoding="utf-8", newline=newline)


def parse_one(path: Path) -> list[LinkEvent]:
    """Parse The ONE's connectivity trace (``<time> CONN <a> <b> up|down``)."""
    events = []
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 5 or fields[1] != "CONN":
                raise TraceError(f"{path}:{lineno}: expected '<time> CONN <a> <b> up|down'")
            events.append(_event(path, lineno, fields[0], fields[2], fields[3], fields[4]))
    return events


def parse_csv(path: Path) -> list[LinkEvent]:
    """Parse ``time,a,b,up`` lines (a header line naming the columns is allowed)."""
    events = []
    with _open(path, newline="") as f:
        for lineno, row in enumerate(csv.reader(f), 1):
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if lineno == 1 and row[0].strip().lower() == "time":
                continue
            if len(row) != 4:
                raise TraceError(f"{path}:{lineno}: expected 4 columns time,a,b,up")
            events.append(_event(path, lineno, row[0], row[1], row[2], row[3]))
    return events


def load_trace(path: Path, fmt: str) -> list[LinkEvent]:
    """Parse a trace and return its events sorted by time (stable for equal times)."""
    try:
        events = parse_csv(path) if fmt == "csv" else parse_one(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not a text file ({e.reason})") from e
    except (gzip.BadGzipFile, EOFError) as e:
        raise TraceError(f"{path}: not a readable gzip file ({e})") from e
    return sorted(events, key=lambda e: e.time)


def host_index(name: str, index: dict[str, int], count: int) -> int:
    """A trace host id as a host index: a scenario host name, else a 0-based index."""
    i = index.get(name)
    if i is None and name.isdigit() and int(name) < count:
        i = int(name)
    if i is None:
        raise TraceError(f"trace host {name!r} is not a scenario host nor an index below {count}")
    return i


def map_hosts(events: list[LinkEvent], hosts: list[str]) -> list[tuple[float, int, int, bool]]:
    """Turn trace host ids into host indices (by name, else as a 0-based index)."""
    index = {h: i for i, h in enumerate(hosts)}
    n = len(hosts)
    return [(e.time, host_index(e.a, index, n), host_index(e.b, index, n), e.up) for e in events]
