"""The ONE's external-events files (its ``StandardEventsReader`` format), message creations.

A line is ``<time> C <id> <from> <to> <size> [<respsize>]``: at ``time`` host ``from``
creates message ``id`` of ``size`` bytes for host ``to``. Blank lines and ``#`` comments
are skipped. Host ids follow the contact-trace convention (``sim.mobility.trace``): a
scenario host name, else a 0-based index into the scenario's host order, else The ONE's
``<prefix><index>`` form (``p12``: host 12). An index has no sign: ``+1`` and ``p-1`` name
no host (unless a host is called so), as in a contact trace. Sizes may carry The ONE's
units (``500k``, ``1M``, ``2kiB``). Only creations can be replayed: any other event kind
(The ONE's ``S``, ``DE``, ``A``, ``DR``, ``R``, ``CONN`` or anything else) and a non-zero
response size are errors naming the file and line, as is every malformed line. A UTF-8
byte order mark is ignored at the start of the file and an error anywhere else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dodwan.units import is_plain_number
from sim.contact_format import BOM, BOM_WHERE
from sim.mobility.trace import TraceError, host_index, unknown_host

CREATE = "C"
EVENT_ID = "event_id"
"""Descriptor attribute that carries the file's message id."""
_OTHER_KINDS = {
    "S": "transfer start",
    "DE": "transfer done",
    "A": "transfer abort",
    "DR": "drop",
    "R": "remove",
    "CONN": "connection (give contacts in [contacts])",
}
_UNITS = {"": 1, "k": 1000, "M": 10**6, "G": 10**9, "kiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE = re.compile(r"(\d+)(k|M|G|kiB|MiB|GiB)?", re.ASCII)
_ONE_ID = re.compile(r"\D*[^\d+-](\d+)", re.ASCII)
"""The ONE's ``<prefix><index>`` host id: a prefix that does not end in a sign (``p-1`` and
``+1`` would be host 1 read as a signed number, which a contact trace refuses)."""


class EventsError(Exception):
    """An external-events file that cannot be replayed (the message names file and line)."""


@dataclass(frozen=True, slots=True)
class Creation:
    """One message creation of an external-events file."""

    time: float
    msg_id: str
    """The file's message id (kept in the descriptor as ``event_id``)."""
    source: str
    """Host name of the creator."""
    destination: str
    """Host name of the destination."""
    size: int
    line: int


def _size(text: str) -> int | None:
    m = _SIZE.fullmatch(text)
    return int(m.group(1)) * _UNITS[m.group(2) or ""] if m else None


def _host(where: str, text: str, hosts: list[str], index: dict[str, int]) -> str:
    try:
        return hosts[host_index(text, index, len(hosts))]
    except TraceError:
        m = _ONE_ID.fullmatch(text) if text.isascii() else None
        if m and int(m.group(1)) < len(hosts):
            return hosts[int(m.group(1))]
        raise EventsError(f"{where}: {unknown_host('host', text, len(hosts))}") from None


def parse(path: Path, hosts: list[str]) -> list[Creation]:
    """Every creation of the file, in file order (host ids mapped to ``hosts``)."""
    index = {h: i for i, h in enumerate(hosts)}
    out: list[Creation] = []
    try:
        with path.open(encoding="utf-8-sig") as f:  # a BOM (Windows editors) is no field
            for lineno, line in enumerate(f, 1):
                text = line.split("#", 1)[0]
                if BOM in text:  # (the codec drops the one at the start of the file)
                    raise EventsError(f"{path}:{lineno}: byte order mark (U+FEFF) {BOM_WHERE}")
                fields = text.split()
                if fields:
                    out.append(_creation(f"{path}:{lineno}", lineno, fields, hosts, index))
    except OSError as e:
        raise EventsError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise EventsError(f"{path}: not a text file ({e.reason})") from e
    except ValueError as e:  # e.g. a NUL byte in the path
        raise EventsError(f"{path!r}: cannot read: {e}") from e
    return out


def _creation(
    where: str, lineno: int, fields: list[str], hosts: list[str], index: dict[str, int]
) -> Creation:
    if len(fields) < 2:
        raise EventsError(f"{where}: expected '<time> C <id> <from> <to> <size> [<respsize>]'")
    kind = fields[1]
    if kind != CREATE:
        what = _OTHER_KINDS.get(kind)
        known = f"a {what} event, which is not replayed" if what else "an unknown event kind"
        raise EventsError(f"{where}: {kind!r} is {known}; only C (create) lines are supported")
    if len(fields) not in (6, 7):
        raise EventsError(f"{where}: expected '<time> C <id> <from> <to> <size> [<respsize>]'")
    if not is_plain_number(fields[0]):  # ASCII digits only: float() also reads "1_0", "٣"
        raise EventsError(f"{where}: time {fields[0]!r} is not a number")
    time = float(fields[0])
    if not math.isfinite(time) or time < 0:
        raise EventsError(f"{where}: time {fields[0]!r} must be a finite number >= 0")
    size = _size(fields[5])
    if size is None:
        raise EventsError(f"{where}: size {fields[5]!r} is not a byte count (e.g. 500k, 1M)")
    if len(fields) == 7:
        resp = _size(fields[6])
        if resp is None:
            raise EventsError(f"{where}: response size {fields[6]!r} is not a byte count")
        if resp:
            raise EventsError(
                f"{where}: response messages (respsize {fields[6]}) are not simulated"
            )
    source = _host(where, fields[3], hosts, index)
    destination = _host(where, fields[4], hosts, index)
    if source == destination:
        raise EventsError(f"{where}: message {fields[2]!r} is from and to the same host {source}")
    return Creation(time, fields[2], source, destination, size, lineno)


def write(path: Path, creations: Iterable[tuple[float, str, int, int, int]]) -> int:
    """Write ``(time, msg_id, from index, to index, size)`` rows as an external-events file
    (times as Python's shortest round-tripping repr, so :func:`parse` reads them back bit
    for bit); return the number of lines. Lets The ONE or another simulator replay the
    traffic a scenario generated (see :func:`sim.traffic.as_events`)."""
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for time, msg_id, a, b, size in creations:
            f.write(f"{time!r} {CREATE} {msg_id} {a} {b} {size}\n")
            n += 1
    return n
