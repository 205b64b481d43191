"""Road maps for map-based mobility: WKT line files (The ONE's map format) as a graph.

A map is one or more named *layers* (roads, footpaths, tram lines ...), each a text file
of WKT geometries: ``LINESTRING`` and ``MULTILINESTRING`` are roads, ``POINT`` and
``MULTIPOINT`` are accepted too (route stops). The points of a line are joined by
straight segments; points with exactly the same coordinates, in any layer, are the same
node, which is how lines connect. Node coordinates are shifted so that the map's lowest x
and y are 0 (the same shift applies to route files), so a map fits a world whose width
and height are its extent.

Shortest paths are A* searches over the segments of the layers a group may use (a tram
line is not a road because it ends at road crossings); destinations are drawn from the
largest connected part of those segments' nodes, so that every trip has a path.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

Line = list[tuple[float, float]]

MAX_MAP_BYTES = 64 * 1024 * 1024
"""Largest map or route file read (The ONE's whole Helsinki map is under 1 MB)."""

_KEYWORD = re.compile(r"\s*([A-Za-z]+)\s*\(")
_NON_SPACE = re.compile(r"\S")
_GROUP = re.compile(r"\(([^()]*)\)")
_KINDS = ("LINESTRING", "MULTILINESTRING", "POINT", "MULTIPOINT")


class MapError(ValueError):
    """A map or route file that cannot be used; the message names the file and line."""


def parse_wkt(text: str, name: str = "<map>") -> list[Line]:
    """The lines of a WKT text (a point is a line of one point), in file order."""
    lines: list[Line] = []
    pos, end = 0, len(text)
    while pos < end:
        start = _NON_SPACE.search(text, pos)
        if start is None:
            break
        m = _KEYWORD.match(text, start.start())
        if m is None:
            raise MapError(
                f"{name}:{_line_of(text, start.start())}: expected a WKT geometry such as "
                f"LINESTRING (x y, x y)"
            )
        kind = m.group(1).upper()
        if kind not in _KINDS:
            raise MapError(
                f"{name}:{_line_of(text, m.start(1))}: unsupported geometry "
                f"{m.group(1)!r} (one of {', '.join(_KINDS)})"
            )
        close = _closing(text, m.end() - 1, name)
        body = text[m.end() : close]
        at = m.end()
        if kind == "MULTILINESTRING":
            groups = _GROUP.findall(body)
            if not groups or _GROUP.sub("", body).replace(",", "").strip():
                raise MapError(
                    f"{name}:{_line_of(text, at)}: MULTILINESTRING needs ((x y, ...), (x y, ...))"
                )
            lines.extend(_points(g, text, at, name) for g in groups)
        elif kind == "MULTIPOINT":
            pts = _points(body.replace("(", " ").replace(")", " "), text, at, name)
            lines.extend([p] for p in pts)
        else:
            pts = _points(body, text, at, name)
            if kind == "POINT" and len(pts) != 1:
                raise MapError(f"{name}:{_line_of(text, at)}: a POINT has one x y pair")
            lines.append(pts)
        pos = close + 1
    return lines


def _closing(text: str, open_at: int, name: str) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
    raise MapError(f"{name}:{_line_of(text, open_at)}: '(' is never closed")


def _points(body: str, text: str, at: int, name: str) -> Line:
    out: Line = []
    for part in body.split(","):
        xy = part.split()
        try:
            if len(xy) != 2:
                raise ValueError
            x, y = float(xy[0]), float(xy[1])
        except ValueError:
            raise MapError(
                f"{name}:{_line_of(text, at)}: {part.strip()!r} is not a coordinate pair 'x y'"
            ) from None
        if not (math.isfinite(x) and math.isfinite(y)):
            raise MapError(f"{name}:{_line_of(text, at)}: coordinates must be finite numbers")
        out.append((x, y))
    return out


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def read_wkt(path: Path) -> list[Line]:
    """Parse a WKT file (errors name the file and line)."""
    try:
        size = path.stat().st_size
        if size > MAX_MAP_BYTES:
            raise MapError(
                f"{path}: {size:,} bytes, more than the {MAX_MAP_BYTES:,} a map may have"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise MapError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise MapError(f"{path}: not UTF-8 text") from None
    return parse_wkt(text, str(path))


class RoadMap:
    """The nodes and segments of a map's layers."""

    def __init__(self, layers: Sequence[tuple[str, Sequence[Line]]]) -> None:
        self.layer_names = [name for name, _ in layers]
        if len(self.layer_names) > 62:
            raise MapError("a map has at most 62 layers")
        index: dict[tuple[float, float], int] = {}
        coords: list[tuple[float, float]] = []
        masks: list[int] = []
        adj: list[dict[int, tuple[float, int]]] = []
        for bit, (_name, lines) in enumerate(layers):
            for line in lines:
                prev = -1
                for xy in line:
                    node = index.get(xy)
                    if node is None:
                        node = index[xy] = len(masks)
                        coords.append(xy)
                        masks.append(0)
                        adj.append({})
                    masks[node] |= 1 << bit
                    if prev >= 0 and prev != node:
                        (ax, ay), (bx, by) = xy, coords[prev]
                        d = math.hypot(ax - bx, ay - by)
                        _d, layers_of = adj[node].get(prev, (d, 0))
                        adj[prev][node] = adj[node][prev] = (d, layers_of | 1 << bit)
                    prev = node
        if not masks:
            raise MapError("the map has no points")
        raw = np.array(coords, dtype=np.float64)
        self.offset = (float(raw[:, 0].min()), float(raw[:, 1].min()))
        """What was subtracted from the files' coordinates."""
        self.xy = raw - np.array(self.offset)
        """Node coordinates, shifted so the lowest x and y are 0."""
        self.extent = (float(self.xy[:, 0].max()), float(self.xy[:, 1].max()))
        self.masks = masks
        self.adj = [[(v, d, m) for v, (d, m) in a.items()] for a in adj]
        """Per node: (neighbour, metres, mask of the layers the segment belongs to)."""
        self._pts = [(float(x), float(y)) for x, y in self.xy]

    def mask(self, layers: Iterable[str] = ()) -> int:
        """The bit mask of ``layers`` (all of the map's when empty)."""
        names = list(layers) or self.layer_names
        m = 0
        for n in names:
            if n not in self.layer_names:
                raise MapError(f"no map layer {n!r} (layers: {', '.join(self.layer_names)})")
            m |= 1 << self.layer_names.index(n)
        return m

    @functools.cache  # noqa: B019 - maps live as long as the run
    def component(self, mask: int) -> np.ndarray:
        """The nodes of the largest connected part of the map restricted to ``mask``."""
        ok = [bool(m & mask) for m in self.masks]
        seen = [False] * len(ok)
        best: list[int] = []
        for start in range(len(ok)):
            if not ok[start] or seen[start]:
                continue
            seen[start] = True
            part, stack = [start], [start]
            while stack:
                u = stack.pop()
                for v, _d, layers in self.adj[u]:
                    if layers & mask and not seen[v]:
                        seen[v] = True
                        part.append(v)
                        stack.append(v)
            if len(part) > len(best):
                best = part
        if not best:
            raise MapError("no node of the map is on these layers")
        return np.array(sorted(best), dtype=np.int64)

    def nearest(self, x: float, y: float, mask: int) -> tuple[int, float]:
        """The node of the largest connected part under ``mask`` nearest to (x, y), in
        shifted coordinates, and its distance."""
        nodes = self.component(mask)
        d = np.hypot(self.xy[nodes, 0] - x, self.xy[nodes, 1] - y)
        i = int(np.argmin(d))
        return int(nodes[i]), float(d[i])

    def path(self, src: int, dst: int, mask: int) -> list[int]:
        """The nodes of a shortest path from ``src`` to ``dst`` over nodes under ``mask``,
        without ``src`` (empty when they are the same node); ``MapError`` if none."""
        if src == dst:
            return []
        pts, adj = self._pts, self.adj
        tx, ty = pts[dst]
        best = {src: 0.0}
        prev: dict[int, int] = {}
        sx, sy = pts[src]
        todo = [(math.hypot(tx - sx, ty - sy), 0.0, src)]
        done: set[int] = set()
        while todo:
            _f, g, u = heapq.heappop(todo)
            if u == dst:
                out = [dst]
                while out[-1] in prev:
                    out.append(prev[out[-1]])
                out.pop()  # src
                out.reverse()
                return out
            if u in done:
                continue
            done.add(u)
            for v, w, layers in adj[u]:
                if not layers & mask or v in done:
                    continue
                ng = g + w
                if ng < best.get(v, math.inf):
                    best[v] = ng
                    prev[v] = u
                    vx, vy = pts[v]
                    heapq.heappush(todo, (ng + math.hypot(tx - vx, ty - vy), ng, v))
        raise MapError(f"no path from node {src} to node {dst} on these layers")


def _coordinate(v: float) -> str:
    """A WKT coordinate as its file may write it: ``1100``, ``1100.25``, never rounded to
    six digits as ``:g`` would (``123456.7`` is not ``123457``)."""
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def route_stops(roads: RoadMap, path: Path, mask: int, tolerance: float) -> list[int]:
    """The nodes of a route file's stops, in order: every point of its geometries, in the
    map files' coordinates, each at most ``tolerance`` metres from a node of the largest
    connected part of the layers ``mask`` (consecutive repeats of a node count once)."""
    stops: list[int] = []
    ox, oy = roads.offset
    for line in read_wkt(path):
        for x, y in line:
            node, d = roads.nearest(x - ox, y - oy, mask)
            if d > tolerance:
                raise MapError(
                    f"{path}: stop ({_coordinate(x)} {_coordinate(y)}) is {d:.1f} m from the "
                    f"nearest node of its layers (at most {tolerance:g} m)"
                )
            if not stops or stops[-1] != node:
                stops.append(node)
    if not stops:
        raise MapError(f"{path}: no stops")
    return stops


def load_map(layers: Sequence[tuple[str, Path]]) -> RoadMap:
    """The map of a scenario's ``[map]`` layers (kept while the files are unchanged, so
    the runs of a sweep read them once)."""
    key = tuple((name, str(p), p.stat().st_mtime_ns) for name, p in layers)
    return _load_map(key)


@functools.lru_cache(maxsize=4)
def _load_map(key: tuple[tuple[str, str, int], ...]) -> RoadMap:
    return RoadMap([(name, read_wkt(Path(p))) for name, p, _mtime in key])
