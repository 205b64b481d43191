"""The contact-trace formats, defined once: the simulator's replay (``sim.mobility.trace``)
and the Spark analysis (``sim.analysis.load``) both parse every line with these functions.

Rules shared by both formats:

* ``#`` starts a comment, at the start of a line or after its fields; blank lines are skipped;
* a UTF-8 byte order mark is ignored at the start of the file, an error anywhere else;
* a time is a finite number >= 0 (seconds) written with ASCII digits: an optional ``+``,
  digits with an optional fraction, an optional exponent (``+5``, ``1e1``, ``.5``); no
  ``_`` nor other scripts' digits, which Python's ``float`` would read
  (``dodwan.units.is_plain_number``, the check of external-events files too);
* host ids are non-empty and a host cannot be in contact with itself;
* the state is ``up``/``down``, ``1``/``0`` or ``true``/``false`` (any case).

The ONE connectivity format: ``<time> CONN <a> <b> <state>`` (``CONN`` in any case).

CSV: ``time,a,b,up``. The first line is a header when its first field is not a number; the
header then names the columns in any order (any case, extra columns ignored) and must name
all four. Without a header the rows have exactly those four columns in that order. A line
repeating the header (concatenated files) is skipped.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence

from dodwan.units import is_plain_number

FORMATS = ("one", "csv")
COLUMNS = ("time", "a", "b", "up")
STATES = {"up": True, "1": True, "true": True, "down": False, "0": False, "false": False}

Event = tuple[float, str, str, bool]
"""(time, a, b, up) of one link event."""

Layout = tuple[int, int, int, int]
"""Indices of the time, a, b and up columns of a CSV file."""

PLAIN: Layout = (0, 1, 2, 3)

BOM = "\ufeff"
"""A UTF-8 byte order mark: ignored at the start of a file (the readers open files with the
``utf-8-sig`` codec, Hadoop's line reader skips it), an error anywhere else."""
BOM_WHERE = "is only allowed at the start of the file"


def guess_format(name: str) -> str:
    """The format a trace's file name implies: ``csv`` for ``*.csv`` (also gzipped,
    ``*.csv.gz``), The ONE's connectivity format otherwise."""
    low = name.rstrip("/").lower().removesuffix(".gz")
    return "csv" if low.endswith(".csv") else "one"


class FormatError(ValueError):
    """A line that breaks the format (the message says how; callers add file and line)."""


def strip_comment(line: str) -> str:
    """The fields part of a line. A UTF-8 byte order mark (what some editors write at the
    start of a file) is dropped by the readers at the start of the file only (``BOM``);
    one in the fields of any line is an error."""
    text = line.split("#", 1)[0]
    if BOM in text:
        raise FormatError(f"byte order mark (U+FEFF) {BOM_WHERE}")
    return text.strip()


def has_fields(line: str) -> bool:
    """Whether a line is more than a blank or comment line (never raises)."""
    return bool(line.split("#", 1)[0].strip())


def _event(t: str, a: str, b: str, state: str) -> Event:
    try:
        time = float(t)
    except ValueError:
        raise FormatError(f"time {t.strip()!r} is not a number") from None
    if not math.isfinite(time) or time < 0:
        raise FormatError(f"time {t.strip()!r} must be a finite number >= 0")
    if not is_plain_number(t.strip()):  # float() also reads "1_0" (10) and "٣" (3)
        raise FormatError(f"time {t.strip()!r} is not a number (ASCII digits, no '_')")
    up = STATES.get(state.strip().lower())
    if up is None:
        raise FormatError(f"state {state.strip()!r} is not up or down")
    a, b = a.strip(), b.strip()
    if not a or not b:
        raise FormatError("empty host id")
    if a == b:
        raise FormatError(f"a host cannot be in contact with itself ({a!r})")
    return time, a, b, up


def parse_one_line(line: str) -> Event | None:
    """One line of The ONE's format; None for a blank or comment line."""
    fields = strip_comment(line).split()
    if not fields:
        return None
    if len(fields) != 5 or fields[1].upper() != "CONN":
        raise FormatError("expected '<time> CONN <a> <b> up|down'")
    return _event(fields[0], fields[2], fields[3], fields[4])


def split_csv(line: str) -> list[str]:
    """The fields of one CSV line (comment removed; [] for a blank line)."""
    text = strip_comment(line)
    if not text:
        return []
    return next(csv.reader([text]))


def csv_layout(first: Sequence[str]) -> Layout | None:
    """The layout a header row gives, or None when ``first`` is a data row.

    Raises FormatError for a header that does not name all four columns."""
    try:
        float(first[0])
        return None
    except (ValueError, IndexError):
        pass
    names = [f.strip().lower() for f in first]
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise FormatError(f"CSV header must contain time,a,b,up (missing {', '.join(missing)})")
    return (names.index("time"), names.index("a"), names.index("b"), names.index("up"))


def parse_csv_fields(
    fields: Sequence[str], layout: Layout = PLAIN, header: Sequence[str] | None = None
) -> Event | None:
    """One CSV row split into fields; None for a blank line or a repeated header."""
    if not fields:
        return None
    if header is not None and [f.strip().lower() for f in fields] == [
        h.strip().lower() for h in header
    ]:
        return None
    width = len(header) if header is not None else 4
    if len(fields) != width:
        raise FormatError(f"expected {width} columns ({','.join(header or COLUMNS)})")
    t, a, b, u = (fields[i] for i in layout)
    return _event(t, a, b, u)


def first_data_line(lines: Sequence[str]) -> list[str] | None:
    """The fields of the first non-blank, non-comment line (where a CSV header may be)."""
    for line in lines:
        if has_fields(line):
            return split_csv(line)
    return None
