"""The synthetic town map (``sim.townmap``) and the benchmark scenario that moves on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.maps import load_map, route_stops
from sim.mobility.base import build_world
from sim.scenario import load
from sim.townmap import Town, write

ROOT = Path(__file__).resolve().parent.parent
MAPS = ROOT / "scenarios" / "maps"


def test_the_bundled_town_is_what_the_generator_writes(tmp_path: Path) -> None:
    files = write(Town(), 1, tmp_path)
    assert [f.name for f in files] == [
        "town.wkt",
        "town_tram1.wkt",
        "town_tram2.wkt",
        "town_tram3.wkt",
    ]
    for f in files:
        assert f.read_bytes() == (MAPS / f.name).read_bytes(), f.name
    other = write(Town(), 2, tmp_path / "two")
    assert other[0].read_bytes() != files[0].read_bytes()  # the seed matters


def _segments(roads) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.array(
        [(*roads.xy[u], *roads.xy[v]) for u, a in enumerate(roads.adj) for v, _d, _m in a if u < v]
    )


def _off_road(points: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Each point's distance to the nearest street."""
    a, b = seg[:, :2], seg[:, 2:]
    ab = b - a
    t = ((points[:, None, :] - a) * ab).sum(-1) / (ab * ab).sum(-1)
    near = a + np.clip(t, 0.0, 1.0)[..., None] * ab
    return np.hypot(*(points[:, None, :] - near).transpose(2, 0, 1)).min(axis=1)


def test_the_town_is_one_street_network_and_its_trams_stop_on_it() -> None:
    sc = load(ROOT / "scenarios" / "one_town.toml")
    roads = load_map(sc.map_layers)
    assert len(roads.component(roads.mask())) == len(roads.xy)  # every corner reachable
    assert roads.extent[0] <= 4500 and roads.extent[1] <= 3400
    lengths = [d for a in roads.adj for _v, d, _m in a]
    assert 80_000 < sum(lengths) / 2 < 130_000  # metres of streets (Helsinki's map: 123 km)
    for g in sc.groups:
        if g.mobility.model == "map_route":
            assert g.mobility.stops is not None
            stops = route_stops(roads, g.mobility.stops, roads.mask(), 0.0)
            assert len(stops) >= 5


def test_the_town_benchmark_moves_every_host_along_its_streets() -> None:
    sc = load(ROOT / "scenarios" / "one_town.toml")
    assert sc.mobility_warmup == 1000.0
    world = build_world(sc, 3)
    seg = _segments(load_map(sc.map_layers))
    for _ in range(30):
        world.step(sc.mobility_step)
    assert _off_road(world.pos, seg).max() < 1e-6
    caps = {g.name: g.protocol.cache_capacity for g in sc.groups}
    assert caps == {"p1": 5_000_000, "c2": 5_000_000, "p3": 5_000_000,
                    "t4": 50_000_000, "t5": 50_000_000, "t6": 50_000_000}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--corners", "3"], "--corners must be at least 50"),
        (["--core-share", "1.5"], "--core-share must be between 0 and 1"),
        (["--core-sigma", "0"], "--core-sigma must be > 0"),
        (["--seed", "x"], "invalid int value"),
    ],
)
def test_bad_generator_arguments_are_refused(tmp_path: Path, args: list[str], says: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "sim.townmap", "--out", str(tmp_path / "m"), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "m").exists()
