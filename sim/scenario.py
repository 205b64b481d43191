"""Scenario files: the TOML format, its loader and its validator.

Owns the dataclasses a run is built from and the rules a scenario must satisfy. Every
problem found is reported at once, each with its dotted key and the line where that key
appears in the file; unknown keys are errors. The format is documented in
``docs/scenarios.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dodwan.core.message import APP_SETTABLE, ONCE, SYSTEM_ATTRIBUTES
from dodwan.core.node import CacheFullError, Node
from dodwan.core.patterns import Pattern, PatternError
from dodwan.daemon.config import NODE_RANGES
from dodwan.units import as_given
from sim.contact_format import guess_format
from sim.external_events import EVENT_ID, Creation, EventsError
from sim.external_events import parse as parse_events
from sim.maps import MapError, load_map, route_stops
from sim.medium import MTU
from sim.mobility.trace import TraceError, load_trace, map_hosts
from sim.protocol import DEFAULTS as PROTOCOL_DEFAULTS
from sim.protocol import LIMIT_DEFAULTS, Protocol

MOBILITY_MODELS = (
    "static",
    "island",
    "random_waypoint",
    "random_walk",
    "carrier",
    "map",
    "map_route",
)
TRACE_FORMATS = ("one", "csv")
ARRIVAL_PROCESSES = ("periodic", "poisson")
GENERATOR_MODES = ("one", "all")
MAP_MODELS = ("map", "map_route")
MAX_DURATION = 10 * 365 * 86400.0
"""Longest simulated time (``duration``, ``--until``): ten years, the longest ``max_ttl``
the daemon accepts."""
MIN_STEP = 1e-6
"""Shortest ``mobility_step`` and ``cache_sample_period`` (a microsecond): the clock still
moves by it at ``MAX_DURATION`` (a float there is exact to about 6e-8 s), where 1e-300
would add nothing and the run would never end."""
TIMER_BOUNDS = {k: NODE_RANGES[k] for k in ("announce_period", "request_timeout")}
"""The daemon's range of the protocol timers a simulated host runs on: far below it (an
``announce_period`` of 1e-9) a run fills the memory without moving the clock. The other
settings keep the wider range the core accepts (a simulation may want a tiny cache)."""
MIN_INTERVAL = 1e-3
"""Shortest publication ``interval`` of a traffic entry (a thousand messages a second from
each publisher): 1e-12 once validated and then filled the memory without moving the clock."""
MAX_WARMUP = 7 * 86400.0
"""Longest ``mobility_warmup`` (a week of movement before the run)."""
MAX_WARMUP_STEPS = 1_000_000
"""Most mobility steps a warm-up may take (each moves every host once)."""
MAX_TTL: float = LIMIT_DEFAULTS["max_ttl"]
"""Longest message lifetime a scenario may ask for (the core's ``limits.max_ttl``)."""
MAX_HOSTS = 100_000
"""Hosts one scenario may have, all groups together (each runs a real protocol core: a
count of 10^8 made the loader itself allocate tens of gigabytes before refusing anything)."""
INDEX_RANGE = re.compile(r"(\d+)\.\.(\d+)")
"""A host selector ``"<first>..<last>"``: host indices first to last, both included."""

# Keys each mobility model accepts (besides "model").
_MODEL_KEYS: dict[str, tuple[str, ...]] = {
    "static": ("positions", "area"),
    "island": ("center", "radius"),
    "random_waypoint": ("speed", "pause", "area"),
    "random_walk": ("speed", "leg", "area"),
    "carrier": ("islands", "speed", "pause", "route"),
    "map": ("speed", "pause", "layers"),
    "map_route": ("stops", "route", "speed", "pause", "layers"),
}
_ROUTES = {"carrier": ("random", "cycle"), "map_route": ("cycle", "back_and_forth")}
"""The ``route`` values each model accepts (the first is its default)."""
STOP_TOLERANCE = 1.0
"""Metres a ``map_route`` stop may lie from the nearest node of its layers."""


def _finite(x: Any) -> bool:
    """A finite int or float (TOML reads ``nan`` and ``inf`` as floats; bool is not a number)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario."""

    key: str
    """Dotted key path, e.g. ``groups[1].mobility.speed`` (``groups[1]`` is the second)."""
    line: int | None
    """1-based line of the key in the file, when it could be located."""
    message: str
    """What is wrong, in words."""

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "line ?"
        return f"{where}: {self.key}: {self.message}"


class ScenarioError(Exception):
    """A scenario file that cannot be used; ``problems`` lists every error found."""

    def __init__(self, path: str, problems: list[Problem]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(
            f"{path}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems)
        )


@dataclass(frozen=True)
class Radio:
    """The shared radio medium."""

    range: float
    """Metres within which two hosts hear each other."""
    bit_rate: float
    """Bits per second; a datagram of n bytes occupies the sender's radio 8n/bit_rate s."""
    loss: float
    """Probability that one receiver independently loses one link frame."""
    max_datagram: int
    """Largest datagram in bytes (given to each node's config)."""
    mtu: int
    """Link MTU in bytes: a larger datagram travels as IP fragments, lost if one is."""


@dataclass(frozen=True)
class Mobility:
    """How the hosts of a group move (parameters not used by the model keep defaults)."""

    model: str
    """One of ``MOBILITY_MODELS``."""
    speed: tuple[float, float] = (1.0, 1.0)
    """Uniform range of speeds in m/s."""
    pause: tuple[float, float] = (0.0, 0.0)
    """Uniform range of pauses in s at each waypoint or island."""
    leg: tuple[float, float] = (10.0, 60.0)
    """Random walk: uniform range of seconds before picking a new direction."""
    area: tuple[float, float, float, float] | None = None
    """Rectangle (x0, y0, x1, y1) the hosts stay in; the whole world when None."""
    positions: tuple[tuple[float, float], ...] = ()
    """Static: explicit positions, one per host (random in ``area`` when empty)."""
    center: tuple[float, float] = (0.0, 0.0)
    """Island: centre of the disc the hosts sit in."""
    radius: float = 0.0
    """Island: radius of that disc."""
    islands: tuple[str, ...] = ()
    """Carrier: names of the island groups it travels between."""
    route: str = "random"
    """Carrier: ``random`` (next island at random, never the current one) or ``cycle``.
    Map route: ``cycle`` (after the last stop, the first) or ``back_and_forth``."""
    layers: tuple[str, ...] = ()
    """Map models: the ``[map]`` layers the hosts move on (all of them when empty)."""
    stops: Path | None = None
    """Map route: the WKT file of its stops, in order (the points of its geometries)."""


@dataclass(frozen=True)
class Group:
    """Hosts that share mobility and protocol settings; hosts are named ``<name>-<i>``."""

    name: str
    count: int
    mobility: Mobility
    protocol: Protocol

    def host_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]


@dataclass(frozen=True)
class Publish:
    """DoDWAN publishers: each selected host publishes messages with these attributes."""

    hosts: tuple[str, ...]
    attributes: Mapping[str, str]
    interval: float
    process: str = "poisson"
    size: int = 1000
    ttl: float = 3600.0
    start: float = 0.0
    stop: float | None = None
    priority: int = 4
    persistent: bool = True
    at: tuple[float, ...] = ()
    """Exact publication times (each selected host publishes at each); when given,
    ``interval`` is ``inf`` and ``process``, ``start`` and ``stop`` are unused."""


@dataclass(frozen=True)
class Generate:
    """A ONE-style message generator (The ONE's MessageEventGenerator): messages between
    random hosts, at uniform random intervals, of uniform random sizes (``sim.generators``).
    """

    name: str
    """Names the entry's random stream and, in mode ``all``, the shared address."""
    sources: tuple[str, ...]
    destinations: tuple[str, ...]
    interval: tuple[float, float]
    """Uniform range of seconds between two messages of the entry."""
    size: tuple[int, int] = (1000, 1000)
    """Uniform range of payload bytes (bounds included)."""
    ttl: tuple[float, float] = (3600.0, 3600.0)
    start: float = 0.0
    stop: float | None = None
    mode: str = "one"
    """``one``: each message to one random destination other than its source; ``all``: each
    message to every destination (but its source)."""
    attribute: str = "dest"
    """Descriptor attribute holding the address: the destination's host name (mode
    ``one``) or the entry's name (mode ``all``); destinations subscribe to their address."""
    attributes: Mapping[str, str] = field(default_factory=dict)
    """Further descriptor attributes of every message (e.g. a ``topic``)."""
    priority: int = 4
    persistent: bool = True


@dataclass(frozen=True)
class External:
    """The message creations of a ONE external-events file, replayed exactly."""

    path: Path
    events: tuple[Creation, ...]
    ttl: float = 3600.0
    attribute: str = "dest"
    """Descriptor attribute holding the destination's host name (it subscribes to it)."""
    attributes: Mapping[str, str] = field(default_factory=dict)
    priority: int = 4
    persistent: bool = True


@dataclass(frozen=True)
class Subscribe:
    """DoDWAN subscribers: each selected host subscribes with these patterns (OR-ed)."""

    hosts: tuple[str, ...]
    patterns: tuple[Mapping[str, str], ...]


@dataclass(frozen=True)
class JomsTopic:
    """JOMS topic traffic: publishers send JMS messages, subscribers consume with a selector.

    Either side may be empty, so one topic can have several entries (e.g. publishers with
    different properties, subscribers with different selectors).
    """

    name: str
    publishers: tuple[str, ...]
    subscribers: tuple[str, ...]
    selector: str = ""
    interval: float = 60.0
    size: int = 1000
    ttl: float = 3600.0
    properties: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    """JMS user properties of every message the publishers send."""
    durable: bool = False
    """Subscribers use durable subscriptions (client id + name) instead of plain consumers."""
    process: str = "poisson"
    priority: int = 4
    persistent: bool = True


@dataclass(frozen=True)
class JomsQueue:
    """JOMS queue traffic: ``manager`` creates the queue ``name@manager``."""

    name: str
    manager: str
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    interval: float = 60.0
    size: int = 1000
    ttl: float = 3600.0


@dataclass(frozen=True)
class ContactTrace:
    """A recorded contact trace replayed instead of the groups' mobility."""

    path: Path
    format: str


@dataclass(frozen=True)
class Scenario:
    """A whole validated scenario."""

    name: str
    source: Path | None
    seed: int
    duration: float
    world: tuple[float, float]
    radio: Radio
    groups: tuple[Group, ...]
    description: str = ""
    mobility_step: float = 1.0
    cache_sample_period: float = 60.0
    publish: tuple[Publish, ...] = ()
    subscribe: tuple[Subscribe, ...] = ()
    generate: tuple[Generate, ...] = ()
    external: tuple[External, ...] = ()
    joms_topics: tuple[JomsTopic, ...] = ()
    joms_queues: tuple[JomsQueue, ...] = ()
    contacts: ContactTrace | None = None
    map_layers: tuple[tuple[str, Path], ...] = ()
    """``[map]``: the road map's layers (name, WKT file), for the map mobility models."""
    mobility_warmup: float = 0.0
    """Seconds the hosts move before the run starts (The ONE's ``MovementModel.warmup``)."""
    data_sha256: str = ""
    """SHA-256 of the parsed scenario (values set by ``--set`` or a sweep included) without
    ``seed`` and ``[sweep]``: :func:`settings_digest` adds the files it refers to."""

    def host_names(self) -> list[str]:
        """All hosts, group by group, in file order."""
        return [h for g in self.groups for h in g.host_names()]

    def group_of(self) -> dict[str, str]:
        """Host name -> group name."""
        return {h: g.name for g in self.groups for h in g.host_names()}

    def resolve(self, selectors: Iterable[str]) -> list[str]:
        """Expand group names, index ranges (``"3..7"``: hosts 3 to 7 of the scenario's
        host order) and host names into host names (file order, no repeats)."""
        wanted: set[str] = set()
        names = self.host_names()
        by_group = {g.name: g.host_names() for g in self.groups}
        for s in selectors:
            m = INDEX_RANGE.fullmatch(s)
            if s in by_group:
                wanted.update(by_group[s])
            elif m:
                wanted.update(names[int(m.group(1)) : int(m.group(2)) + 1])
            else:
                wanted.add(s)
        return [h for h in names if h in wanted]

    @property
    def uses_joms(self) -> bool:
        return bool(self.joms_topics or self.joms_queues)


# --------------------------------------------------------------------------- loading


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raise ``ScenarioError`` listing every problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(str(p), [Problem("(file)", None, f"cannot read: {e.strerror}")]) from e
    except UnicodeDecodeError as e:
        raise ScenarioError(str(p), [not_utf8(e)]) from e
    return loads(text, source=p)


def not_utf8(e: UnicodeDecodeError) -> Problem:
    """A scenario file that is not UTF-8 text (TOML's encoding), with the line at fault."""
    line = e.object[: e.start].count(b"\n") + 1
    return Problem("(file)", line, f"not UTF-8 text (byte 0x{e.object[e.start]:02x})")


def loads(text: str, source: Path | None = None) -> Scenario:
    """Validate scenario text; relative trace paths resolve against ``source``'s folder."""
    name = str(source) if source else "<scenario>"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        line = int(m.group(1)) if m else None
        raise ScenarioError(name, [Problem("(syntax)", line, f"not valid TOML: {e}")]) from e
    return from_data(data, text, source)


def from_data(data: dict[str, Any], text: str = "", source: Path | None = None) -> Scenario:
    """Validate an already parsed scenario (``text`` is only used to find line numbers).

    A ``[sweep]`` table is the sweep's business (``sim.sweep``); a single run ignores it.
    """
    name = str(source) if source else "<scenario>"
    data = {k: v for k, v in data.items() if k != "sweep"}
    v = _Validator(text, source)
    scenario = v.scenario(data)
    if v.problems or scenario is None:
        raise ScenarioError(name, v.problems)
    return replace(scenario, data_sha256=data_digest(data))


def data_digest(data: Mapping[str, Any]) -> str:
    """SHA-256 of parsed scenario TOML without ``seed`` and ``[sweep]`` (comments and layout
    do not count; the files it names are :func:`input_files`' business)."""
    kept = {k: v for k, v in data.items() if k not in ("seed", "sweep")}
    canon = json.dumps(kept, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


# --------------------------------------------------------------------------- input files


def input_files(scenario: Scenario, contacts: ContactTrace | None = None) -> list[tuple[str, Path]]:
    """Every file a run of ``scenario`` reads besides the scenario itself, with the key that
    names it: the contact trace (``contacts``, e.g. ``--contacts``, replaces the scenario's),
    the external-events files, the ``[map]`` layers and the map routes' stops. The one list
    sweeps (``sweep.json``) and runs (``run.json``) record and digest."""
    files: list[tuple[str, Path]] = []
    trace = contacts if contacts is not None else scenario.contacts
    if trace is not None:
        files.append(("contacts.trace", trace.path))
    files += [(f"traffic.external[{i}].file", e.path) for i, e in enumerate(scenario.external)]
    files += [(f"map.{name}", p) for name, p in scenario.map_layers]
    files += [
        (f"groups[{i}].mobility.stops", g.mobility.stops)
        for i, g in enumerate(scenario.groups)
        if g.mobility.stops is not None
    ]
    return files


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def input_digests(scenario: Scenario, contacts: ContactTrace | None = None) -> list[dict[str, str]]:
    """:func:`input_files` with the SHA-256 of each: ``{"key", "file", "sha256"}``."""
    return [
        {"key": key, "file": str(p), "sha256": file_sha256(p)}
        for key, p in input_files(scenario, contacts)
    ]


def settings_digest(
    scenario: Scenario, inputs: Iterable[Mapping[str, str]], contacts_format: str | None = None
) -> str:
    """SHA-256 of what a run depends on besides its seed and end time: the scenario's
    settings (:attr:`Scenario.data_sha256`) and the content of every input file (by key, so
    a copy of the scenario and its files elsewhere digests the same)."""
    canon = json.dumps(
        {
            "scenario": scenario.data_sha256,
            "inputs": sorted([i["key"], i["sha256"]] for i in inputs),
            "contacts_format": contacts_format,
        },
        separators=(",", ":"),
    )
    return hashlib.sha256(canon.encode()).hexdigest()


# --------------------------------------------------------------------------- validation

_Path = tuple[str | int, ...]


def _dotted(path: _Path) -> str:
    out = ""
    for seg in path:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else seg)
    return out or "(top)"


class _LineFinder:
    """Locates a key path in the source text (headers and ``key =`` lines, in order)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def line(self, path: _Path) -> int | None:
        cursor = 0
        found: int | None = None
        table: list[str] = []
        for seg in path:
            if isinstance(seg, int):
                header = re.compile(
                    r"^\s*\[\[\s*" + r"\s*\.\s*".join(map(re.escape, table)) + r"\s*\]\]"
                )
                hits = [i for i, ln in enumerate(self.lines) if header.match(ln)]
                if seg < len(hits):
                    cursor = found_i = hits[seg]
                    found = found_i + 1
                continue
            table.append(seg)
            key = re.compile(r"(^|[\[{,\s.])\"?" + re.escape(seg) + r"\"?\s*(=|\]|\.)")
            for i in range(cursor, len(self.lines)):
                if key.search(self.lines[i].split("#", 1)[0]) or _quoted_key(self.lines[i], seg):
                    cursor, found = i, i + 1
                    break
        return found


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"\s*(=|\]|\.)')
"""A basic-string key, with TOML escapes (``"k\\u001b"``)."""


def _quoted_key(line: str, key: str) -> bool:
    """Whether ``line`` names ``key`` as a quoted key written with escapes (a key holding
    a control character can only be written so)."""
    if key.isprintable() or '"' not in line:
        return False
    for m in _QUOTED.finditer(line):
        try:
            if tomllib.loads(f'k = "{m.group(1)}"')["k"] == key:
                return True
        except tomllib.TOMLDecodeError:
            continue
    return False


class _Validator:
    """Walks the parsed TOML, collecting problems instead of stopping at the first."""

    def __init__(self, text: str, source: Path | None) -> None:
        self.finder = _LineFinder(text)
        self.source = source
        self.problems: list[Problem] = []
        self.traced = False
        """Whether the scenario replays a contact trace (then mobility is optional)."""

    # -- helpers

    def err(self, path: _Path, message: str) -> None:
        self.problems.append(Problem(_dotted(path), self.finder.line(path), message))

    def table(self, data: Any, path: _Path, allowed: Iterable[str]) -> dict[str, Any] | None:
        if not isinstance(data, dict):
            self.err(path, "must be a table")
            return None
        allowed = set(allowed)
        for k in data:
            if k not in allowed:
                self.err((*path, k), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return data

    def num(
        self,
        t: Mapping[str, Any],
        path: _Path,
        key: str,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        positive: bool = False,
        integer: bool = False,
    ) -> Any:
        if key not in t:
            if default is None:
                self.err((*path, key), "is required")
            return default
        val = t[key]
        kind = "an integer" if integer else "a number"
        ok_type = isinstance(val, int) if integer else isinstance(val, int | float)
        if isinstance(val, bool) or not ok_type or not math.isfinite(val):
            self.err((*path, key), f"must be {kind}, got {val!r}")
            return default
        if positive and val <= 0:
            self.err((*path, key), f"must be > 0, got {val!r}")
            return default
        if minimum is not None and val < minimum:
            self.err((*path, key), f"must be >= {minimum}, got {val!r}")
            return default
        if maximum is not None and val > maximum:
            self.err((*path, key), f"must be <= {maximum}, got {val!r}")
            return default
        return val if integer else float(val)

    def string(
        self,
        t: Mapping[str, Any],
        path: _Path,
        key: str,
        default: str | None = None,
        choices: tuple[str, ...] | None = None,
    ) -> Any:
        if key not in t:
            if default is None:
                self.err((*path, key), "is required")
            return default
        val = t[key]
        if not isinstance(val, str):
            self.err((*path, key), f"must be a string, got {val!r}")
            return default
        if choices is not None and val not in choices:
            self.err((*path, key), f"must be one of {', '.join(choices)}; got {val!r}")
            return default
        return val

    def boolean(self, t: Mapping[str, Any], path: _Path, key: str, default: bool) -> bool:
        val = t.get(key, default)
        if not isinstance(val, bool):
            self.err((*path, key), f"must be true or false, got {val!r}")
            return default
        return val

    def numbers(self, t: Mapping[str, Any], path: _Path, key: str, n: int, default: Any) -> Any:
        if key not in t:
            if default is None:
                self.err((*path, key), "is required")
            return default
        val = t[key]
        if not isinstance(val, list) or len(val) != n or not all(_finite(x) for x in val):
            self.err((*path, key), f"must be a list of {n} finite numbers, got {val!r}")
            return default
        return tuple(float(x) for x in val)

    def span(self, t: Mapping[str, Any], path: _Path, key: str, default: Any) -> Any:
        val = self.numbers(t, path, key, 2, default)
        if val is not default and (val[0] < 0 or val[1] < val[0]):
            self.err((*path, key), f"must be [min, max] with 0 <= min <= max, got {list(val)}")
            return default
        return val

    def names(self, t: Mapping[str, Any], path: _Path, key: str, required: bool = True) -> Any:
        if key not in t:
            if required:
                self.err((*path, key), "is required")
            return ()
        val = t[key]
        if isinstance(val, str):
            val = [val]
        if not isinstance(val, list) or not all(isinstance(x, str) for x in val) or not val:
            self.err((*path, key), f"must be a non-empty list of names, got {val!r}")
            return ()
        return tuple(val)

    def items(self, data: Any, path: _Path) -> list[tuple[_Path, Any]]:
        if data is None:
            return []
        if not isinstance(data, list):
            self.err(path, "must be an array of tables ([[...]])")
            return []
        return [((*path, i), x) for i, x in enumerate(data)]

    def attrs(self, val: Any, path: _Path, descriptor: bool = False) -> dict[str, str] | None:
        """A table of string attributes; ``descriptor``: a message's, checked as
        ``Node.publish`` would check them."""
        if not isinstance(val, dict) or not val:
            self.err(path, "must be a non-empty table of string attributes")
            return None
        bad = [k for k, x in val.items() if not isinstance(x, str)]
        for k in bad:
            self.err((*path, k), f"must be a string, got {val[k]!r}")
        if descriptor and not bad:
            for k, x in val.items():
                if k in SYSTEM_ATTRIBUTES and k not in APP_SETTABLE:
                    self.err((*path, k), f"{k!r} is a DoDWAN system attribute")
                elif k == ONCE and x not in ("true", "false"):
                    self.err((*path, k), f'must be "true" or "false", got {x!r}')
        return None if bad else dict(val)

    def patterns(self, val: Any, path: _Path) -> tuple[dict[str, str], ...]:
        if isinstance(val, dict):
            val = [val]
        if not isinstance(val, list) or not val:
            self.err(path, "must be a table or a non-empty list of tables of regexes")
            return ()
        out = []
        for i, p in enumerate(val):
            a = self.attrs(p, (*path, i))
            if a is None:
                continue
            for k, rx in a.items():
                try:
                    Pattern.from_spec({k: rx})
                except (PatternError, TypeError, ValueError) as e:
                    self.err((*path, i, k), f"not a valid pattern: {e}")
            out.append(a)
        return tuple(out)

    # -- sections

    def scenario(self, data: dict[str, Any]) -> Scenario | None:
        top = self.table(
            data,
            (),
            (
                "name", "description", "seed", "duration", "mobility_step",
                "cache_sample_period", "world", "radio", "protocol", "groups", "traffic",
                "contacts", "map", "mobility_warmup",
            ),
        )  # fmt: skip
        assert top is not None
        name = self.string(top, (), "name")
        description = self.string(top, (), "description", "")
        seed = self.num(top, (), "seed", 0, minimum=0, integer=True)
        duration = self.num(top, (), "duration", None, positive=True, maximum=MAX_DURATION)
        step = self.num(top, (), "mobility_step", 1.0, minimum=MIN_STEP)
        warmup = self.num(top, (), "mobility_warmup", 0.0, minimum=0.0, maximum=MAX_WARMUP)
        if warmup and step and warmup / step > MAX_WARMUP_STEPS:
            self.err(("mobility_warmup",), f"at most {MAX_WARMUP_STEPS:,} mobility steps "
                     f"({MAX_WARMUP_STEPS * step:g} s with mobility_step = {as_given(step)})")  # fmt: skip
        sample = self.num(top, (), "cache_sample_period", 60.0, minimum=MIN_STEP)

        world = self.table(top.get("world", {}), ("world",), ("width", "height")) or {}
        width = self.num(world, ("world",), "width", None, positive=True)
        height = self.num(world, ("world",), "height", None, positive=True)

        rt = self.table(top.get("radio", {}), ("radio",), Radio.__annotations__) or {}
        radio = Radio(
            range=self.num(rt, ("radio",), "range", None, positive=True) or 1.0,
            bit_rate=self.num(rt, ("radio",), "bit_rate", 1e6, positive=True),
            loss=self.num(rt, ("radio",), "loss", 0.0, minimum=0.0, maximum=1.0),
            max_datagram=self.num(
                rt, ("radio",), "max_datagram", 1400, minimum=256, maximum=65507, integer=True
            ),
            mtu=self.num(rt, ("radio",), "mtu", MTU, minimum=68, maximum=65535, integer=True),
        )
        base = self.protocol(top.get("protocol", {}), ("protocol",), Protocol())

        self.traced = "contacts" in top
        problems_before_groups = len(self.problems)
        groups = []
        raw_groups = top.get("groups")
        if not raw_groups:
            self.err(("groups",), "at least one [[groups]] is required")
        for gpath, g in self.items(raw_groups, ("groups",)):
            grp = self.group(g, gpath, base, (width, height))
            if grp is not None:
                groups.append(grp)
        seen: set[str] = set()
        for i, grp in enumerate(groups):
            if grp.name in seen:
                self.err(("groups", i, "name"), f"duplicate group name {grp.name!r}")
            seen.add(grp.name)
        if sum(g.count for g in groups) > MAX_HOSTS:
            self.err(("groups",), f"at most {MAX_HOSTS:,} hosts in all groups together")
            groups = []  # refused: do not name them all
        self.check_carriers(groups)
        # the host list is complete: trace host ids can be checked against it
        hosts_known = len(self.problems) == problems_before_groups
        map_layers = self.map_layers(top.get("map"), groups, (width, height))

        host_set = {h for g in groups for h in g.host_names()}
        known = host_set | {g.name for g in groups}

        n_hosts = sum(g.count for g in groups)

        def check_sel(path: _Path, sel: tuple[str, ...]) -> bool:
            """Report unknown selectors; whether all of ``sel`` are usable."""
            ok = bool(sel)
            for s in sel:
                m = INDEX_RANGE.fullmatch(s)
                if m and s not in known:
                    first, last = int(m.group(1)), int(m.group(2))
                    if not first <= last < n_hosts:
                        ok = False
                        self.err(
                            path,
                            f"range {s!r} must be first..last with 0 <= first "
                            f"<= last < {n_hosts} (the number of hosts)",
                        )
                elif s not in known:
                    ok = False
                    self.err(path, f"{s!r} is neither a group, a host nor a range of host indices")
            return ok

        traffic = self.table(
            top.get("traffic", {}),
            ("traffic",),
            ("publish", "subscribe", "generate", "external", "joms"),
        )
        traffic = traffic or {}
        partial = Scenario(
            name="", source=None, seed=0, duration=0.0, world=(1.0, 1.0), radio=radio,
            groups=tuple(groups),
        )  # fmt: skip
        group_of = {h: g for g in groups for h in g.host_names()}
        max_size = {
            h: g.protocol.limits.get("max_message_size", LIMIT_DEFAULTS["max_message_size"])
            for h, g in group_of.items()
        }

        def check_publish(
            path: _Path, hosts: list[str], attrs: Mapping[str, str], size: int, ttl: float
        ) -> None:
            """What each publishing host's core would refuse (``path``: the entry): every
            group that would, for every reason, each against the key to blame."""
            first: dict[str, str] = {}  # the first host of each publishing group
            for h in hosts:
                first.setdefault(group_of[h].name, h)
            for h in first.values():
                g = group_of[h]
                checked = size
                if size > max_size[h]:
                    bound = max_size[h]
                    self.err(
                        (*path, "size"), f"{size} bytes exceed {h}'s max_message_size ({bound})"
                    )
                    checked = 0  # reported: the core checks the rest without the payload
                for key, why in _refusals(g, radio.max_datagram, attrs, checked, ttl):
                    self.err((*path, key), f"{g.name} hosts would refuse it: {why}")

        publish = []
        for path, t in self.items(traffic.get("publish"), ("traffic", "publish")):
            before = len(self.problems)
            pub = self.publish(t, path, duration or 0.0)
            if pub is not None:
                if check_sel((*path, "hosts"), pub.hosts) and len(self.problems) == before:
                    hosts = partial.resolve(pub.hosts)
                    check_publish(path, hosts, pub.attributes, pub.size, pub.ttl)
                publish.append(pub)
        subscribe = []
        for path, t in self.items(traffic.get("subscribe"), ("traffic", "subscribe")):
            tt = self.table(t, path, ("hosts", "patterns"))
            if tt is None:
                continue
            sub = Subscribe(
                hosts=self.names(tt, path, "hosts"),
                patterns=self.patterns(tt.get("patterns"), (*path, "patterns")),
            )
            check_sel((*path, "hosts"), sub.hosts)
            subscribe.append(sub)
        topics, queues = self.joms(
            traffic.get("joms", {}), ("traffic", "joms"), check_sel, host_set
        )
        generate = []
        for path, t in self.items(traffic.get("generate"), ("traffic", "generate")):
            before = len(self.problems)
            gen = self.generate(t, path, duration or 0.0)
            if gen is not None:
                ok = check_sel((*path, "sources"), gen.sources)
                if check_sel((*path, "destinations"), gen.destinations) and ok:
                    self.check_destinations(gen, path, partial)
                if ok and len(self.problems) == before:
                    # the longest address a message may carry, its largest size and ttl
                    dests = partial.resolve(gen.destinations) if gen.mode == "one" else []
                    address = max(dests, key=len) if dests else gen.name
                    attrs = {**gen.attributes, gen.attribute: address}
                    sources = partial.resolve(gen.sources)
                    check_publish(path, sources, attrs, gen.size[1], gen.ttl[1])
                generate.append(gen)
        names_seen: set[str] = set()
        for i, gen in enumerate(generate):
            if gen.name in names_seen:
                self.err(("traffic", "generate", i, "name"), f"duplicate name {gen.name!r}")
            names_seen.add(gen.name)

        def check_external(path: _Path, ext: External) -> None:
            """The largest message of each group's sources, with the longest id and address:
            every group that would refuse it, for every reason (and the first message over
            each group's max_message_size)."""
            if not ext.events:
                return
            longest_id = max((c.msg_id for c in ext.events), key=len)
            longest_dest = max((c.destination for c in ext.events), key=len)
            attrs = {**ext.attributes, ext.attribute: longest_dest, EVENT_ID: longest_id}
            largest: dict[str, Creation] = {}
            too_large: set[str] = set()
            for c in ext.events:
                g = group_of[c.source].name
                if c.size > max_size[c.source] and g not in too_large:
                    too_large.add(g)
                    bound = max_size[c.source]
                    self.err(
                        (*path, "file"),
                        f"{ext.path}:{c.line}: {c.size} bytes exceed {c.source}'s "
                        f"max_message_size ({bound})",
                    )
                if g not in largest or c.size > largest[g].size:
                    largest[g] = c
            for g, c in largest.items():
                size = 0 if g in too_large else c.size  # (reported: the rest without it)
                group = group_of[c.source]
                for _key, why in _refusals(group, radio.max_datagram, attrs, size, ext.ttl):
                    where = f"{ext.path}:{c.line}"
                    self.err((*path, "file"), f"{where}: {c.source} would refuse it: {why}")

        external = []
        for path, t in self.items(traffic.get("external"), ("traffic", "external")):
            ext = self.external(t, path, partial.host_names())
            if ext is not None:
                check_external(path, ext)
                external.append(ext)

        contacts = None
        if "contacts" in top:
            trace_hosts = partial.host_names() if hosts_known else None
            contacts = self.contacts(top["contacts"], ("contacts",), trace_hosts)

        if self.problems:
            return None
        return Scenario(
            name=name,
            source=self.source,
            seed=seed,
            duration=duration,
            world=(width, height),
            radio=radio,
            groups=tuple(groups),
            description=description,
            mobility_step=step,
            cache_sample_period=sample,
            publish=tuple(publish),
            subscribe=tuple(subscribe),
            generate=tuple(generate),
            external=tuple(external),
            joms_topics=topics,
            joms_queues=queues,
            contacts=contacts,
            map_layers=map_layers,
            mobility_warmup=warmup,
        )

    def protocol(self, raw: Any, path: _Path, base: Protocol) -> Protocol:
        """A ``[protocol]`` table over ``base``: types from the core's defaults, values
        checked by building a NodeConfig (its error is reported against the key it names)."""
        t = self.table(raw, path, (*PROTOCOL_DEFAULTS, "limits")) or {}
        settings = dict(base.settings)
        for k in t:
            if k in PROTOCOL_DEFAULTS:
                settings[k] = self.setting(
                    t, path, k, PROTOCOL_DEFAULTS[k], settings[k], TIMER_BOUNDS.get(k)
                )
        limits = dict(base.limits)
        lt: dict[str, Any] = {}
        if "limits" in t:
            lt = self.table(t["limits"], (*path, "limits"), LIMIT_DEFAULTS) or {}
            for k in lt:
                if k in LIMIT_DEFAULTS:
                    old = limits.get(k, LIMIT_DEFAULTS[k])
                    val = self.setting(lt, (*path, "limits"), k, LIMIT_DEFAULTS[k], old)
                    if val <= 0:  # Limits itself takes anything; every bound needs room
                        self.err((*path, "limits", k), f"must be > 0, got {val!r}")
                        val = old
                    limits[k] = val
        proto = Protocol(settings=settings, limits=limits)
        try:
            proto.node_config("x")
        except (TypeError, ValueError) as e:
            given = [k for k in t if k != "limits"] + [f"limits.{k}" for k in lt]
            named = [k for k in given if re.search(rf"\b{re.escape(k.split('.')[-1])}\b", str(e))]
            key: _Path = path
            if named:
                key = (*path, *named[0].split("."))
            self.err(key, str(e))
            return base
        return proto

    def setting(
        self,
        t: Mapping[str, Any],
        path: _Path,
        key: str,
        default: Any,
        current: Any,
        bounds: tuple[float, float] | None = None,
    ) -> Any:
        """One protocol value, type-checked against its default and within ``bounds``
        (``current`` when wrong)."""
        lo, hi = bounds if bounds is not None else (None, None)
        if isinstance(default, bool):
            return self.boolean(t, path, key, current)
        if isinstance(default, int):
            val = self.num(t, path, key, current, integer=True, minimum=lo, maximum=hi)
        elif isinstance(default, float):
            val = self.num(t, path, key, current, minimum=lo, maximum=hi)
        else:  # pragma: no cover - every settable field is a bool, int or float today
            raise TypeError(f"protocol setting {key} has an unsupported type")
        return val

    def group(
        self, raw: Any, path: _Path, base: Protocol, world: tuple[float | None, float | None]
    ) -> Group | None:
        t = self.table(raw, path, ("name", "count", "mobility", "protocol"))
        if t is None:
            return None
        name = self.string(t, path, "name")
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_.]+", name):
            self.err((*path, "name"), "must use only letters, digits, '_' and '.'")
        count = self.num(t, path, "count", None, minimum=1, maximum=MAX_HOSTS, integer=True)
        mob = self.mobility(t.get("mobility"), (*path, "mobility"), count or 0, world)
        proto = self.protocol(t.get("protocol", {}), (*path, "protocol"), base)
        if name is None or count is None or mob is None:
            return None
        return Group(name=name, count=count, mobility=mob, protocol=proto)

    def mobility(
        self, raw: Any, path: _Path, count: int, world: tuple[float | None, float | None]
    ) -> Mobility | None:
        """A group's ``mobility`` table; static ``positions`` and an island's disc must lie
        in the world (``world``: its width and height, None when they have problems of their
        own), or for positions in the group's ``area`` when it gives one."""
        if raw is None and self.traced:
            return Mobility(model="static")
        if raw is None:
            self.err(path, "is required (a table with at least model = ...)")
            return None
        if not isinstance(raw, dict):
            self.err(path, "must be a table")
            return None
        model = self.string(raw, path, "model", choices=MOBILITY_MODELS)
        if model is None:
            return None
        t = self.table(raw, path, ("model", *_MODEL_KEYS[model])) or {}
        d = Mobility(model=model)
        area = self.numbers(t, path, "area", 4, None) if "area" in t else None
        if area is not None and (area[2] <= area[0] or area[3] <= area[1]):
            self.err((*path, "area"), "must be [x0, y0, x1, y1] with x0 < x1 and y0 < y1")
            area = None
        positions: tuple[tuple[float, float], ...] = ()
        if "positions" in t:
            raw_pos = t["positions"]
            if not isinstance(raw_pos, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(_finite(x) for x in p) for p in raw_pos
            ):
                self.err((*path, "positions"), "must be a list of [x, y] pairs of finite numbers")
            elif len(raw_pos) != count:
                self.err((*path, "positions"), f"has {len(raw_pos)} entries for {count} hosts")
            else:
                positions = tuple((float(x), float(y)) for x, y in raw_pos)
        width, height = world
        if width is not None and height is not None:
            self.check_in_world(path, positions, area, (width, height))
        islands = self.names(t, path, "islands") if model == "carrier" else ()
        routes = _ROUTES.get(model, ("random",))
        layers = self.names(t, path, "layers", required=False) if "layers" in t else ()
        stops = None
        if model == "map_route":
            stops = self.file(t, path, "stops")
        island = model == "island"
        center = self.numbers(t, path, "center", 2, None if island else d.center)
        radius = self.num(t, path, "radius", None if island else 0.0, minimum=0.0)
        if island and center is not None and radius is not None and None not in world:
            self.check_disc(path, center, radius, (width, height))  # type: ignore[arg-type]
        return Mobility(
            model=model,
            speed=self.span(t, path, "speed", d.speed),
            pause=self.span(t, path, "pause", d.pause),
            leg=self.span(t, path, "leg", d.leg),
            area=area,
            positions=positions,
            center=center or d.center,
            radius=radius or 0.0,
            islands=islands,
            route=self.string(t, path, "route", routes[0], choices=routes),
            layers=tuple(layers or ()),
            stops=stops,
        )

    def check_in_world(
        self,
        path: _Path,
        positions: tuple[tuple[float, float], ...],
        area: tuple[float, float, float, float] | None,
        world: tuple[float, float],
    ) -> None:
        """Static ``positions`` outside the world (or the group's ``area``), reported once
        for the key: how many, and the first."""
        x0, y0, x1, y1 = area if area is not None else (0.0, 0.0, *world)
        out = [
            (i, p) for i, p in enumerate(positions) if not (x0 <= p[0] <= x1 and y0 <= p[1] <= y1)
        ]
        if not out:
            return
        i, (x, y) = out[0]
        where = (
            f"the group's area [{as_given(x0)}, {as_given(y0)}, {as_given(x1)}, {as_given(y1)}]"
            if area is not None
            else f"the world ([0, {as_given(x1)}] x [0, {as_given(y1)}] m)"
        )
        which = f"{len(out)} of {len(positions)} positions are" if len(out) > 1 else "a position is"
        self.err(
            (*path, "positions"),
            f"{which} outside {where}: positions[{i}] = [{as_given(x)}, {as_given(y)}]",
        )

    def check_disc(
        self,
        path: _Path,
        center: tuple[float, float],
        radius: float,
        world: tuple[float, float],
    ) -> None:
        """An island's disc must lie in the world: its hosts are placed anywhere in it."""
        (cx, cy), (width, height) = center, world
        size = f"the world ([0, {as_given(width)}] x [0, {as_given(height)}] m)"
        disc = f"the disc center [{as_given(cx)}, {as_given(cy)}] ± radius {as_given(radius)}"
        if 2 * radius > min(width, height):
            self.err((*path, "radius"), f"{disc} is wider than {size}")
        elif not (radius <= cx <= width - radius and radius <= cy <= height - radius):
            self.err((*path, "center"), f"{disc} reaches outside {size}")

    def file(self, t: Mapping[str, Any], path: _Path, key: str) -> Path | None:
        """A required file name, relative to the scenario's folder; None (reported) when
        it is missing or names no file."""
        name = self.string(t, path, key)
        if name is None:
            return None
        p = self.relative(name)
        if not p.is_file():
            self.err((*path, key), f"no such file: {p}")
            return None
        return p

    def relative(self, name: str) -> Path:
        """A file named in the scenario: relative names are in the scenario's folder."""
        p = Path(name)
        return self.source.parent / p if not p.is_absolute() and self.source is not None else p

    def map_layers(
        self, raw: Any, groups: list[Group], world: tuple[float | None, float | None]
    ) -> tuple[tuple[str, Path], ...]:
        """``[map]`` (layer name = WKT file), checked with the groups that move on it: the
        files parse, the map fits the world, layers and route stops exist."""
        path: _Path = ("map",)
        on_map = [(i, g) for i, g in enumerate(groups) if g.mobility.model in MAP_MODELS]
        if raw is None:
            for i, _g in on_map:
                self.err(("groups", i, "mobility", "model"), "a map model needs a [map] table")
            return ()
        if not isinstance(raw, dict) or not raw:
            self.err(path, 'must be a table of layers, e.g. roads = "maps/roads.wkt"')
            return ()
        layers: list[tuple[str, Path]] = []
        for name in raw:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                self.err((*path, name), "a layer name uses only letters, digits, '_', '.', '-'")
                continue
            p = self.file(raw, path, name)
            if p is not None:
                layers.append((name, p))
        if len(layers) != len(raw):
            return ()
        try:
            roads = load_map(layers)  # the run's own map: it reads the files once
        except MapError as e:
            # a file's error (it starts with the file's name) is the layer's, else the map's
            bad = [name for name, p in layers if str(e).startswith(f"{p}:")]
            self.err((*path, bad[0]) if bad else path, str(e))
            return ()
        width, height = world
        ex, ey = roads.extent
        if width is not None and height is not None and (ex > width or ey > height):
            self.err(path, f"the map spans {ex:.1f} x {ey:.1f} m, more than the world "
                     f"({as_given(width)} x {as_given(height)} m)")  # fmt: skip
        for i, g in on_map:
            mp: _Path = ("groups", i, "mobility")
            try:
                mask = roads.mask(g.mobility.layers)
                roads.component(mask)
            except MapError as e:
                self.err((*mp, "layers"), str(e))
                continue
            if g.mobility.stops is not None:
                try:
                    route_stops(roads, g.mobility.stops, mask, STOP_TOLERANCE)
                except MapError as e:
                    self.err((*mp, "stops"), str(e))
        return tuple(layers)

    def check_carriers(self, groups: list[Group]) -> None:
        kinds = {g.name: g.mobility.model for g in groups}
        for i, g in enumerate(groups):
            if g.mobility.model != "carrier":
                continue
            if g.mobility.speed[1] <= 0:
                self.err(("groups", i, "mobility", "speed"), "carriers need a speed > 0")
            for isl in g.mobility.islands:
                if kinds.get(isl) != "island":
                    self.err(
                        ("groups", i, "mobility", "islands"),
                        f'{isl!r} is not a group with model = "island"',
                    )
            if len(set(g.mobility.islands)) < 2:
                self.err(("groups", i, "mobility", "islands"), "needs at least two islands")

    def publish(self, raw: Any, path: _Path, duration: float) -> Publish | None:
        allowed = (
            "hosts", "attributes", "interval", "process", "size", "ttl", "start", "stop",
            "priority", "persistent", "at",
        )  # fmt: skip
        t = self.table(raw, path, allowed)
        if t is None:
            return None
        hosts = self.names(t, path, "hosts")
        attrs = self.attrs(t.get("attributes"), (*path, "attributes"), descriptor=True)
        at = self.times(t, path, duration) if "at" in t else ()
        if "at" in t:
            for k in ("interval", "process", "start", "stop"):
                if k in t:
                    self.err((*path, k), "cannot be combined with at (the exact times)")
            t = {k: v for k, v in t.items() if k not in ("interval", "process", "start", "stop")}
        interval = (
            math.inf if "at" in t else self.num(t, path, "interval", None, minimum=MIN_INTERVAL)
        )
        start = self.num(t, path, "start", 0.0, minimum=0.0)
        stop = self.num(t, path, "stop", duration or 0.0, minimum=0.0)
        if stop is not None and start is not None and stop < start:
            self.err((*path, "stop"), f"must be >= start ({start})")
        pub = Publish(
            hosts=hosts,
            attributes=attrs or {},
            interval=interval or 1.0,
            process=self.string(t, path, "process", "poisson", choices=ARRIVAL_PROCESSES),
            size=self.num(t, path, "size", 1000, minimum=0, integer=True),
            ttl=self.num(t, path, "ttl", 3600.0, positive=True, maximum=MAX_TTL),
            start=start,
            stop=stop,
            priority=self.num(t, path, "priority", 4, minimum=0, maximum=9, integer=True),
            persistent=self.boolean(t, path, "persistent", True),
            at=at,
        )
        return pub

    def times(self, t: Mapping[str, Any], path: _Path, duration: float) -> tuple[float, ...]:
        val = t["at"]
        if (
            not isinstance(val, list)
            or not val
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in val)
        ):
            self.err((*path, "at"), f"must be a non-empty list of times in seconds, got {val!r}")
            return ()
        bad = [x for x in val if not (math.isfinite(x) and 0 <= x < duration)]
        if bad:
            self.err((*path, "at"), f"times must be in [0, duration = {duration}): {bad}")
            return ()
        return tuple(float(x) for x in val)

    def range_of(
        self, t: Mapping[str, Any], path: _Path, key: str, default: Any, *, integer: bool
    ) -> Any:
        """``key = x`` or ``key = [min, max]`` with 0 <= min <= max, as a (min, max) pair."""
        if key not in t:
            if default is None:
                self.err((*path, key), "is required")
            return default
        val = t[key]
        vals = val if isinstance(val, list) else [val]
        kind = "integers" if integer else "numbers"
        if (
            len(vals) not in (1, 2)
            or not all(
                (isinstance(x, int) if integer else isinstance(x, int | float))
                and not isinstance(x, bool)
                and math.isfinite(x)
                for x in vals
            )
            or not 0 <= vals[0] <= vals[-1]
        ):
            self.err(
                (*path, key),
                f"must be a number or [min, max] of {kind} with 0 <= min <= max, got {val!r}",
            )
            return default
        lo, hi = vals[0], vals[-1]
        return (lo, hi) if integer else (float(lo), float(hi))

    def address(self, t: Mapping[str, Any], path: _Path) -> tuple[str, dict[str, str]]:
        """The ``attribute`` naming the address and the other ``attributes`` of an entry."""
        attribute = self.string(t, path, "attribute", "dest")
        if not attribute:
            self.err((*path, "attribute"), "must not be empty")
        elif attribute in SYSTEM_ATTRIBUTES:
            self.err((*path, "attribute"), f"{attribute!r} is a DoDWAN system attribute")
        attrs: dict[str, str] = {}
        if "attributes" in t:
            attrs = self.attrs(t["attributes"], (*path, "attributes"), descriptor=True) or {}
            if attribute in attrs:
                self.err((*path, "attributes", attribute), "is the address attribute")
        return attribute, attrs

    def generate(self, raw: Any, path: _Path, duration: float) -> Generate | None:
        allowed = (
            "name", "sources", "destinations", "interval", "size", "ttl", "start", "stop",
            "mode", "attribute", "attributes", "priority", "persistent",
        )  # fmt: skip
        t = self.table(raw, path, allowed)
        if t is None:
            return None
        name = self.string(t, path, "name", f"generate{path[-1]}")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", name):
            self.err((*path, "name"), "must use only letters, digits, '_' and '.'")
        interval = self.range_of(t, path, "interval", None, integer=False)
        if interval is not None and interval[0] < MIN_INTERVAL:
            self.err((*path, "interval"), f"must be >= {MIN_INTERVAL}, got {t['interval']!r}")
            interval = None
        ttl = self.range_of(t, path, "ttl", (3600.0, 3600.0), integer=False)
        if ttl[0] <= 0:
            self.err((*path, "ttl"), f"must be > 0, got {t['ttl']!r}")
        elif ttl[1] > MAX_TTL:
            self.err((*path, "ttl"), f"must be <= {MAX_TTL:g} (limits.max_ttl), got {t['ttl']!r}")
        start = self.num(t, path, "start", 0.0, minimum=0.0)
        stop = self.num(t, path, "stop", duration or 0.0, minimum=0.0)
        if stop is not None and start is not None and stop < start:
            self.err((*path, "stop"), f"must be >= start ({start})")
        attribute, attrs = self.address(t, path)
        gen = Generate(
            name=name,
            sources=self.names(t, path, "sources"),
            destinations=self.names(t, path, "destinations"),
            interval=interval or (1.0, 1.0),
            size=self.range_of(t, path, "size", (1000, 1000), integer=True),
            ttl=ttl,
            start=start,
            stop=stop,
            mode=self.string(t, path, "mode", "one", choices=GENERATOR_MODES),
            attribute=attribute,
            attributes=attrs,
            priority=self.num(t, path, "priority", 4, minimum=0, maximum=9, integer=True),
            persistent=self.boolean(t, path, "persistent", True),
        )
        return gen

    def check_destinations(self, gen: Generate, path: _Path, partial: Scenario) -> None:
        """Every source needs a destination other than itself: only a lone destination can
        fail that, for the source that is that host (linear: no set copied per source)."""
        dests = partial.resolve(gen.destinations)
        if len(dests) != 1:
            return  # none is check_sel's business; two or more suit every source
        (lone,) = dests
        if lone in set(partial.resolve(gen.sources)):
            self.err((*path, "destinations"), f"source {lone} has no destination but itself")

    def external(self, raw: Any, path: _Path, hosts: list[str]) -> External | None:
        allowed = ("file", "ttl", "attribute", "attributes", "priority", "persistent")
        t = self.table(raw, path, allowed)
        if t is None:
            return None
        file = self.string(t, path, "file")
        ttl = self.num(t, path, "ttl", 3600.0, positive=True, maximum=MAX_TTL)
        attribute, attrs = self.address(t, path)
        if attribute == EVENT_ID:
            self.err((*path, "attribute"), f"{EVENT_ID!r} holds the file's message id")
        if EVENT_ID in attrs:
            self.err((*path, "attributes", EVENT_ID), "is set to the file's message id")
        priority = self.num(t, path, "priority", 4, minimum=0, maximum=9, integer=True)
        persistent = self.boolean(t, path, "persistent", True)
        if file is None:
            return None
        p = self.relative(file)
        try:
            events = parse_events(p, hosts)
        except EventsError as e:
            self.err((*path, "file"), str(e))
            return None
        return External(
            path=p, events=tuple(events), ttl=ttl, attribute=attribute, attributes=attrs,
            priority=priority, persistent=persistent,
        )  # fmt: skip

    def joms(
        self,
        raw: Any,
        path: _Path,
        check_sel: Callable[[_Path, tuple[str, ...]], bool],
        hosts: set[str],
    ) -> tuple[tuple[JomsTopic, ...], tuple[JomsQueue, ...]]:
        t = self.table(raw, path, ("topics", "queues")) or {}
        topics = []
        for p, x in self.items(t.get("topics"), (*path, "topics")):
            allowed = (
                "name", "publishers", "subscribers", "selector", "interval", "size", "ttl",
                "properties", "durable", "process", "priority", "persistent",
            )  # fmt: skip
            tt = self.table(x, p, allowed)
            if tt is None:
                continue
            topic = JomsTopic(
                name=self.string(tt, p, "name") or "",
                publishers=self.names(tt, p, "publishers", required=False),
                subscribers=self.names(tt, p, "subscribers", required=False),
                selector=self.string(tt, p, "selector", ""),
                interval=self.num(tt, p, "interval", 60.0, minimum=MIN_INTERVAL),
                size=self.num(tt, p, "size", 1000, minimum=0, integer=True),
                ttl=self.num(tt, p, "ttl", 3600.0, positive=True, maximum=MAX_TTL),
                properties=self.jms_properties(tt.get("properties", {}), (*p, "properties")),
                durable=self.boolean(tt, p, "durable", False),
                process=self.string(tt, p, "process", "poisson", choices=ARRIVAL_PROCESSES),
                priority=self.num(tt, p, "priority", 4, minimum=0, maximum=9, integer=True),
                persistent=self.boolean(tt, p, "persistent", True),
            )
            if not topic.publishers and not topic.subscribers:
                self.err(p, "needs publishers, subscribers or both")
            self.jms_selector(topic.selector, (*p, "selector"))
            check_sel((*p, "publishers"), topic.publishers)
            check_sel((*p, "subscribers"), topic.subscribers)
            topics.append(topic)
        queues = []
        for p, x in self.items(t.get("queues"), (*path, "queues")):
            tt = self.table(
                x, p, ("name", "manager", "senders", "receivers", "interval", "size", "ttl")
            )
            if tt is None:
                continue
            q = JomsQueue(
                name=self.string(tt, p, "name") or "",
                manager=self.string(tt, p, "manager") or "",
                senders=self.names(tt, p, "senders"),
                receivers=self.names(tt, p, "receivers"),
                interval=self.num(tt, p, "interval", 60.0, minimum=MIN_INTERVAL),
                size=self.num(tt, p, "size", 1000, minimum=0, integer=True),
                ttl=self.num(tt, p, "ttl", 3600.0, positive=True, maximum=MAX_TTL),
            )
            if q.manager and q.manager not in hosts:
                self.err((*p, "manager"), f"{q.manager!r} is not a host")
            check_sel((*p, "senders"), q.senders)
            check_sel((*p, "receivers"), q.receivers)
            queues.append(q)
        return tuple(topics), tuple(queues)

    def jms_properties(self, raw: Any, path: _Path) -> dict[str, str | int | float | bool]:
        from joms.errors import MessageFormatException
        from joms.service.model import check_property_name

        if not isinstance(raw, dict):
            self.err(path, "must be a table of property = value")
            return {}
        out: dict[str, str | int | float | bool] = {}
        for k, v in raw.items():
            try:
                check_property_name(k)
            except MessageFormatException as e:
                self.err((*path, k), f"not a usable JMS property name: {e}")
                continue
            if not isinstance(v, str | int | float | bool):
                self.err((*path, k), f"must be a string, number or boolean, got {v!r}")
                continue
            out[k] = v
        return out

    def jms_selector(self, text: str | None, path: _Path) -> None:
        from joms.errors import InvalidSelectorException
        from joms.service.service import compile_selector

        try:
            compile_selector(text)
        except InvalidSelectorException as e:
            self.err(path, str(e))

    def contacts(self, raw: Any, path: _Path, hosts: list[str] | None) -> ContactTrace | None:
        """The ``[contacts]`` table; the trace is read as the run reads it (every line, and
        host ids against ``hosts`` unless None: the groups have problems of their own)."""
        t = self.table(raw, path, ("trace", "format"))
        if t is None:
            return None
        trace = self.string(t, path, "trace")
        if trace is None:
            return None
        p = self.relative(trace)
        fmt = self.string(t, path, "format", guess_trace_format(p), choices=TRACE_FORMATS)
        if not p.is_file():
            what = "not a file" if p.exists() else "no such file"
            self.err((*path, "trace"), f"{what}: {p}")
            return None
        try:
            events = load_trace(p, fmt)
            if hosts is not None:
                map_hosts(events, hosts, p)
        except TraceError as e:
            self.err((*path, "trace"), str(e))
            return None
        return ContactTrace(path=p, format=fmt)


def _refusals(
    group: Group, max_datagram: int, attrs: Mapping[str, str], size: int, ttl: float
) -> list[tuple[str, str]]:
    """Why a host of ``group`` would refuse to publish such a message: every reason, as
    (the traffic entry's key to blame, the core's words); [] when it would take it.

    Asks the core itself (a throwaway node publishes an incompressible payload, as the run
    does), so the check stays what ``Node.publish`` checks: attribute names, the payload's
    size, ``max_ttl``, the fragment count, the descriptor's size. The core stops at the
    first problem, so each one found is set aside and the core asked again: refused
    attributes are left out (the size is then checked without them), a payload over
    ``max_message_size`` is left empty, a ttl is cut to ``max_ttl``. A full cache is no
    error: the run counts it.
    """
    host = f"{group.name}-{group.count - 1}"  # its longest name, the largest descriptor
    config = group.protocol.node_config(host, max_datagram=max_datagram)
    found: list[tuple[str, str]] = []
    for _ in range(4):  # at most one round per kind of problem set aside, and the last
        node = Node(config, random.Random(0))
        try:
            node.publish(attrs, random.Random(0).randbytes(size), deadline=ttl, now=0.0)
        except CacheFullError:
            break
        except (TypeError, ValueError) as e:
            why = str(e)
            key = _blamed(why)
            found.append((key, why))
            if key == "ttl" and ttl > config.limits.max_ttl:
                ttl = config.limits.max_ttl
            elif key == "attributes" and attrs:
                attrs = {}
            elif key == "size" and size > config.limits.max_message_size:
                size = 0
            else:
                break
        else:
            break
    return found


def _blamed(why: str) -> str:
    """The traffic entry's key a refusal of ``Node.publish`` (its words) is to blame on."""
    if "time to live" in why:
        return "ttl"
    if "fragments" in why:  # (its advice names attributes too: the size is to blame)
        return "size"
    if "attribute" in why or "descriptor" in why:
        return "attributes"
    return "size"


def guess_trace_format(path: Path) -> str:
    """``csv`` for ``*.csv`` (and ``*.csv.gz``) files, The ONE's connectivity format
    otherwise (``sim.contact_format.guess_format``, which the analysis uses too)."""
    return guess_format(path.name)
