"""A synthetic town map for ONE-like benchmarks (The ONE's Helsinki map is GPL, not ours).

Street corners are drawn around a dense centre thinning out towards the edges (a Gaussian
core over a uniform background), kept at least ``min_gap`` apart; streets join corners
that are relative neighbours (no other corner nearer to both than they are to each
other): a planar, connected network, about as sparse as a real street map. Tram lines are
shortest paths between far-apart corners through the centre, with a stop every
``tram_stop_gap`` metres.

Written as WKT in the map format ``sim.maps`` reads (coordinates to the centimetre):
``<out>/<name>.wkt`` (one ``LINESTRING`` per street) and ``<out>/<name>_tram<k>.wkt``
(each tram line's stops, in order)::

    python -m sim.townmap --out scenarios/maps --seed 1

Same arguments, same files, byte for byte.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.maps import RoadMap, parse_wkt


@dataclass(frozen=True)
class Town:
    width: float = 4500.0
    height: float = 3400.0
    corners: int = 1500
    """Street corners drawn (fewer remain when one falls within ``min_gap`` of another)."""
    core_share: float = 0.8
    """Share of the corners drawn around the centre, the rest uniform over the town."""
    core_sigma: float = 400.0
    """Spread (metres, standard deviation) of the centre's corners."""
    min_gap: float = 30.0
    """Closest two corners may be (metres)."""
    trams: int = 3
    """Tram lines."""
    tram_stop_gap: float = 400.0
    """Metres of line between two stops (at least)."""


def corners(town: Town, rng: np.random.Generator) -> np.ndarray:
    """The street corners, (k, 2), in drawing order."""
    w, h = town.width, town.height
    centre = np.array([w / 2, h / 2])
    core = int(town.corners * town.core_share)
    pts = np.vstack(
        (
            centre + rng.normal(0.0, town.core_sigma, (core, 2)),
            np.column_stack(
                (rng.uniform(0, w, town.corners - core), rng.uniform(0, h, town.corners - core))
            ),
        )
    )
    pts = pts[(pts[:, 0] >= 0) & (pts[:, 0] <= w) & (pts[:, 1] >= 0) & (pts[:, 1] <= h)]
    kept: list[np.ndarray] = []
    cell: dict[tuple[int, int], list[int]] = {}
    g = town.min_gap
    for p in pts:
        cx, cy = int(p[0] // g), int(p[1] // g)
        near = (
            kept[j]
            for dx, dy in itertools.product((-1, 0, 1), repeat=2)
            for j in cell.get((cx + dx, cy + dy), ())
        )
        if any(math.dist(p, q) < g for q in near):
            continue
        cell.setdefault((cx, cy), []).append(len(kept))
        kept.append(p)
    return np.round(np.array(kept), 2)


def streets(pts: np.ndarray, k: int = 8) -> list[tuple[int, int]]:
    """Relative-neighbourhood-graph edges (i < j) among each corner's ``k`` nearest."""
    n = len(pts)
    d2 = ((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    nearest = np.argsort(d2, axis=1)[:, :k]
    edges: set[tuple[int, int]] = set()
    for i in range(n):
        for j in nearest[i].tolist():
            a, b = (i, j) if i < j else (j, i)
            if (a, b) in edges:
                continue
            # a lune: no corner nearer to both ends than they are to each other
            inside = np.maximum(d2[a], d2[b]) < d2[a, b] - 1e-9
            if not inside.any():
                edges.add((a, b))
    return sorted(edges)


def tram_lines(town: Town, roads: RoadMap, rng: np.random.Generator) -> list[list[int]]:
    """Each tram line's stops (nodes of ``roads``): from a corner near one edge of the town
    to one near the opposite edge, through the corner nearest the centre."""
    mask = roads.mask()
    centre = roads.nearest(
        town.width / 2 - roads.offset[0], town.height / 2 - roads.offset[1], mask
    )[0]
    lines = []
    for t in range(town.trams):
        angle = math.pi * t / town.trams + rng.uniform(0, math.pi / town.trams)
        r = 0.45 * min(town.width, town.height)
        ends = []
        for s in (1, -1):
            x = town.width / 2 + s * r * math.cos(angle) - roads.offset[0]
            y = town.height / 2 + s * r * math.sin(angle) - roads.offset[1]
            ends.append(roads.nearest(x, y, mask)[0])
        way = [ends[0], *roads.path(ends[0], centre, mask), *roads.path(centre, ends[1], mask)]
        stops, run = [way[0]], 0.0
        for u, v in itertools.pairwise(way):
            run += math.dist(roads.xy[u], roads.xy[v])
            if run >= town.tram_stop_gap or v == way[-1]:
                stops.append(v)
                run = 0.0
        lines.append(stops)
    return lines


def _xy(p: np.ndarray) -> str:
    return f"{p[0]:.2f} {p[1]:.2f}"


def write(town: Town, seed: int, out: Path, name: str = "town") -> list[Path]:
    """Draw the town and write its files; returns their paths."""
    rng = np.random.default_rng([seed, 0x70776E])
    pts = corners(town, rng)
    edges = streets(pts)
    text = "".join(f"LINESTRING ({_xy(pts[a])}, {_xy(pts[b])})\n" for a, b in edges)
    roads = RoadMap([("roads", parse_wkt(text))])
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"{name}.wkt"]
    files[0].write_text(text, encoding="utf-8")
    ox, oy = roads.offset
    for k, stops in enumerate(tram_lines(town, roads, rng), start=1):
        line = ", ".join(_xy(roads.xy[s] + (ox, oy)) for s in stops)
        f = out / f"{name}_tram{k}.wkt"
        f.write_text(f"LINESTRING ({line})\n", encoding="utf-8")
        files.append(f)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the WKT files")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--name", default="town")
    d = Town()
    ap.add_argument("--corners", type=int, default=d.corners, help="street corners drawn")
    ap.add_argument("--core-share", type=float, default=d.core_share,
                    help="share of the corners drawn around the centre")  # fmt: skip
    ap.add_argument("--core-sigma", type=float, default=d.core_sigma,
                    help="spread of the centre's corners (metres)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.corners < 50:
        ap.error("--corners must be at least 50")
    if not 0.0 <= args.core_share <= 1.0:
        ap.error("--core-share must be between 0 and 1")
    if not args.core_sigma > 0:
        ap.error("--core-sigma must be > 0 (metres)")
    town = Town(corners=args.corners, core_share=args.core_share, core_sigma=args.core_sigma)
    for f in write(town, args.seed, args.out, args.name):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
