"""Contact traces replayed by the simulator: The ONE's connectivity format and a simple CSV.

The formats are defined once in ``sim.contact_format`` (the Spark analysis reads traces with
the same functions). Host ids in a trace name scenario hosts: either a host's name or a
0-based index into the scenario's host list (The ONE numbers its hosts).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sim import contact_format as cf


class TraceError(Exception):
    """A contact trace that cannot be replayed (the message names the file and line)."""


@dataclass(frozen=True)
class LinkEvent:
    """A link between two trace hosts coming up or going down."""

    time: float
    a: str
    b: str
    up: bool
    line: int = field(default=0, compare=False)
    """Line of the event in its file (0: unknown)."""


def _open(path: Path, newline: str | None = None) -> TextIO:
    """A trace file as text; ``*.gz`` files are decompressed on the fly. A UTF-8 byte order
    mark at the start of the file is dropped (one elsewhere is a bad line)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline=newline)
    return path.open(encoding="utf-8-sig", newline=newline)


def parse_one(path: Path) -> list[LinkEvent]:
    """Parse The ONE's connectivity trace (``<time> CONN <a> <b> up|down``)."""
    events = []
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            try:
                ev = cf.parse_one_line(line)
            except cf.FormatError as e:
                raise TraceError(f"{path}:{lineno}: {e}") from None
            if ev is not None:
                events.append(LinkEvent(*ev, line=lineno))
    return events


def parse_csv(path: Path) -> list[LinkEvent]:
    """Parse ``time,a,b,up`` rows (an optional header line may name the columns)."""
    events = []
    layout, header = cf.PLAIN, None
    with _open(path, newline="") as f:
        for lineno, line in enumerate(f, 1):
            try:
                fields = cf.split_csv(line)
                if fields and header is None and not events:
                    found = cf.csv_layout(fields)
                    if found is not None:
                        layout, header = found, fields
                        continue
                ev = cf.parse_csv_fields(fields, layout, header)
            except cf.FormatError as e:
                raise TraceError(f"{path}:{lineno}: {e}") from None
            if ev is not None:
                events.append(LinkEvent(*ev, line=lineno))
    return events


def load_trace(path: Path, fmt: str) -> list[LinkEvent]:
    """Parse a trace and return its events sorted by time (stable for equal times)."""
    try:
        events = parse_csv(path) if fmt == "csv" else parse_one(path)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # before OSError (BadGzipFile is)
        # BadGzipFile: not gzip, bad CRC or length; EOFError: truncated; zlib.error:
        # corrupt deflate data ("invalid distance too far back", ...)
        raise TraceError(f"{path}: not a readable gzip file ({e})") from e
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not a text file ({e.reason})") from e
    return sorted(events, key=lambda e: e.time)


SIGNED = re.compile(r"[+-]\d+", re.ASCII)
"""A signed number (``+1``, ``-1``): no host number has a sign."""


def unknown_host(what: str, name: str, count: int) -> str:
    """The words for a host id that names no host (``what``: how the file calls hosts)."""
    sign = " (a host number has no sign)" if SIGNED.fullmatch(name) else ""
    return f"{what} {name!r} is not a scenario host nor an index below {count}{sign}"


def host_index(name: str, index: dict[str, int], count: int) -> int:
    """A trace host id as a host index: a scenario host name, else a 0-based index (ASCII
    digits only: no sign)."""
    i = index.get(name)
    if i is None and name.isascii() and name.isdigit() and int(name) < count:
        i = int(name)
    if i is None:
        raise TraceError(unknown_host("trace host", name, count))
    return i


def map_hosts(
    events: list[LinkEvent], hosts: list[str], path: Path | None = None
) -> list[tuple[float, int, int, bool]]:
    """Turn trace host ids into host indices (by name, else as a 0-based index); errors
    name ``path`` and the event's line. Two ids of one host (``0`` and its name) are a
    host in contact with itself: an error, as when the ids are equal."""
    index = {h: i for i, h in enumerate(hosts)}
    n = len(hosts)
    out = []
    for e in events:
        try:
            a, b = host_index(e.a, index, n), host_index(e.b, index, n)
            if a == b:
                raise TraceError(
                    f"a host cannot be in contact with itself ({e.a!r} and {e.b!r} are both "
                    f"{hosts[a]})"
                )
        except TraceError as err:
            raise TraceError(f"{path}:{e.line}: {err}" if path is not None else str(err)) from None
        out.append((e.time, a, b, e.up))
    return out
