"""Road maps (``sim.maps``) and the movement along them (``sim.mobility.onmap``)."""

from __future__ import annotations

import itertools
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sim.maps import MapError, RoadMap, load_map, parse_wkt, route_stops
from sim.mobility.base import build_world
from sim.mobility.contacts import link_changes
from sim.mobility.onmap import MapRoute, MapWalk
from sim.scenario import ScenarioError, load

# A 200 x 100 m block: the bottom road (three nodes), both sides, the top road.
BLOCK = """\
LINESTRING (1000 2000, 1100 2000, 1200 2000)

LINESTRING (1200 2000, 1200 2100)
MULTILINESTRING ((1000 2000, 1000 2100),
    (1000 2100, 1100 2100, 1200 2100))
"""


def block() -> RoadMap:
    return RoadMap([("roads", parse_wkt(BLOCK))])


def on_block(p: np.ndarray) -> np.ndarray:
    """Whether each point lies on one of the block's four roads."""
    x, y = p[:, 0], p[:, 1]
    return ((np.isclose(y, 0) | np.isclose(y, 100)) & (x > -1e-9) & (x < 200 + 1e-9)) | (
        (np.isclose(x, 0) | np.isclose(x, 200)) & (y > -1e-9) & (y < 100 + 1e-9)
    )


# ----------------------------------------------------------------------------- WKT


def test_wkt_geometries_in_file_order() -> None:
    text = "POINT (1 2)\nMULTIPOINT ((3 4), (5 6))\nMULTIPOINT (7 8, 9 10)\n" + BLOCK
    lines = parse_wkt(text)
    assert lines[:5] == [[(1.0, 2.0)], [(3.0, 4.0)], [(5.0, 6.0)], [(7.0, 8.0)], [(9.0, 10.0)]]
    assert lines[5] == [(1000.0, 2000.0), (1100.0, 2000.0), (1200.0, 2000.0)]
    assert lines[7:] == [[(1000.0, 2000.0), (1000.0, 2100.0)],
                         [(1000.0, 2100.0), (1100.0, 2100.0), (1200.0, 2100.0)]]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("LINESTRING (0 0, 1 1)\n\nPOLYGON ((0 0, 1 0, 0 0))", 3, "unsupported geometry"),
        ("LINESTRING (0 0, 1 1)\nLINESTRING (0 0,\n 1 1", 2, "never closed"),
        ("LINESTRING (0 0, 1 x)", 1, "not a coordinate pair"),
        ("LINESTRING (0 0, 1 2 3)", 1, "not a coordinate pair"),
        ("LINESTRING (0 0, inf 1)", 1, "finite"),
        ("POINT (0 0, 1 1)", 1, "one x y pair"),
        ("\n\n  hello", 3, "expected a WKT geometry"),
        ("MULTILINESTRING (0 0, 1 1)", 1, "MULTILINESTRING needs"),
    ],
)
def test_wkt_errors_name_the_line(text: str, line: int, says: str) -> None:
    with pytest.raises(MapError, match=rf"^roads\.wkt:{line}: .*{says}"):
        parse_wkt(text, "roads.wkt")


# ----------------------------------------------------------------------------- graph


def test_lines_join_at_shared_points_and_the_map_is_shifted_to_zero() -> None:
    m = block()
    assert m.offset == (1000.0, 2000.0)
    assert m.extent == (200.0, 100.0)
    assert len(m.xy) == 6  # the shared corners are one node each
    corner = m.nearest(0.0, 0.0, m.mask())[0]
    assert sorted(d for _v, d, _layers in m.adj[corner]) == [100.0, 100.0]


def test_shortest_path_takes_the_shorter_way_round() -> None:
    m = block()
    a = m.nearest(0.0, 0.0, m.mask())[0]
    b = m.nearest(200.0, 0.0, m.mask())[0]
    top_middle = m.nearest(100.0, 100.0, m.mask())[0]
    path = m.path(a, b, m.mask())
    assert [tuple(m.xy[n]) for n in path] == [(100.0, 0.0), (200.0, 0.0)]
    # from the top middle to the bottom middle: 300 m round either side, never across
    # the block (there is no road there)
    mid = m.nearest(100.0, 0.0, m.mask())[0]
    way = [top_middle, *m.path(top_middle, mid, m.mask())]
    assert sum(math.dist(m.xy[u], m.xy[v]) for u, v in itertools.pairwise(way)) == pytest.approx(
        300.0
    )
    assert m.path(a, a, m.mask()) == []


def test_layers_restrict_paths_and_the_largest_part_is_used() -> None:
    tram = parse_wkt("LINESTRING (1000 2000, 1200 2000)\nLINESTRING (5000 5000, 5001 5000)")
    m = RoadMap([("roads", parse_wkt(BLOCK)), ("tram", tram)])
    roads, only_tram = m.mask(["roads"]), m.mask(["tram"])
    a = m.nearest(0.0, 0.0, roads)[0]
    b = m.nearest(200.0, 0.0, roads)[0]
    assert len(m.path(a, b, only_tram)) == 1  # the tram line goes straight
    assert len(m.path(a, b, roads)) == 2  # the road passes its middle node
    assert set(m.component(only_tram).tolist()) == {a, b}  # not the 1 m stub far away
    stub = int(np.flatnonzero((m.xy == (4000.0, 3000.0)).all(axis=1))[0])
    with pytest.raises(MapError, match="no path"):
        m.path(a, stub, m.mask())
    with pytest.raises(MapError, match="no map layer 'rail'"):
        m.mask(["rail"])


def test_route_stops_snap_to_nodes_within_the_tolerance(tmp_path: Path) -> None:
    m = block()
    f = tmp_path / "tram.wkt"
    f.write_text("LINESTRING (1000.4 2000, 1200 2000, 1200 2000, 1200 2100)")
    stops = route_stops(m, f, m.mask(), 1.0)
    assert [tuple(m.xy[s]) for s in stops] == [(0.0, 0.0), (200.0, 0.0), (200.0, 100.0)]
    f.write_text("POINT (1100 2050)")
    with pytest.raises(MapError, match=r"tram\.wkt: stop \(1100 2050\) is 50\.0 m from"):
        route_stops(m, f, m.mask(), 1.0)


# ----------------------------------------------------------------------------- movement


def walkers(
    m: RoadMap, n: int, seed: int, speed: tuple[float, float], pause: tuple[float, float]
) -> MapWalk:
    """``n`` hosts walking every layer of ``m`` (the area is unused on a map)."""
    return MapWalk(
        slice(0, n), (0, 0, 1, 1), np.random.default_rng(seed), m, m.mask(), speed, pause
    )


def test_walkers_stay_on_roads_and_keep_their_speed_through_nodes() -> None:
    # a straight road of 1 m segments: a host at 10 m/s covers 10 m per step regardless
    line = "LINESTRING (" + ", ".join(f"{x} 0" for x in range(0, 1001)) + ")"
    m = RoadMap([("r", parse_wkt(line))])
    w = walkers(m, 1, seed=1, speed=(10.0, 10.0), pause=(0.0, 0.0))
    pos = np.zeros((1, 2))
    w.place(pos)
    start = float(pos[0, 0])
    goal = float(m.xy[w.ahead[0][-1], 0])
    w.step(pos, 1.0)
    assert abs(float(pos[0, 0]) - start) == pytest.approx(min(10.0, abs(goal - start)))
    assert pos[0, 1] == 0.0

    m = block()
    w = walkers(m, 20, seed=2, speed=(0.5, 13.9), pause=(0.0, 5.0))
    pos = np.zeros((20, 2))
    w.place(pos)
    for _ in range(500):
        before = pos.copy()
        w.step(pos, 1.0)
        assert on_block(pos).all()
        # nobody moves faster than its speed (straight-line distance <= path distance)
        assert (np.hypot(*(pos - before).T) <= w.speed + 1e-9).all()


def test_a_route_visits_its_stops_in_order_and_pauses_at_each() -> None:
    m = block()
    stops = [m.nearest(x, y, m.mask())[0] for x, y in ((0, 0), (200, 0), (200, 100))]
    for back, order in ((False, [1, 2, 0, 1, 2, 0]), (True, [1, 2, 1, 0, 1, 2])):
        r = MapRoute(slice(0, 1), (0, 0, 200, 100), np.random.default_rng(3), m, m.mask(),
                     (5.0, 5.0), (4.0, 4.0), stops, back)  # fmt: skip
        r.stop[:] = 0
        pos = np.zeros((1, 2))
        r.at[:] = stops[0]
        pos[0] = m.xy[stops[0]]
        r._set_off(0)
        visited, still, was_paused = [], 0, False
        for _ in range(600):
            before = pos.copy()
            r.step(pos, 1.0)
            paused = bool(r.pause_left[0] > 0)
            if paused and not was_paused:
                visited.append(int(r.at[0]))
            was_paused = paused
            still += bool(np.allclose(before, pos))
        assert [stops.index(n) for n in visited[:6]] == order
        assert still >= 4 * 6  # it waited 4 s at every stop


def test_map_scenario_runs_from_its_files(tmp_path: Path) -> None:
    (tmp_path / "roads.wkt").write_text(BLOCK)
    (tmp_path / "tram.wkt").write_text("LINESTRING (1000 2000, 1200 2000, 1200 2100)")
    sc = load(_scenario(tmp_path))
    assert sc.mobility_warmup == 50.0
    assert [g.mobility.model for g in sc.groups] == ["map", "map_route"]
    world = build_world(sc, 1)
    assert on_block(world.pos).all()
    again = build_world(sc, 1)
    assert np.array_equal(world.pos, again.pos)  # a seed's movement is repeatable
    # the warm-up moved them: without it, every host starts on a node
    cold = build_world(_replace(sc, mobility_warmup=0.0), 1)
    nodes = {tuple(p) for p in load_map(sc.map_layers).xy.tolist()}
    assert all(tuple(p) in nodes for p in cold.pos.tolist())
    assert not all(tuple(p) in nodes for p in world.pos.tolist())
    changes = list(link_changes(sc, 1, until=120.0))
    assert len(changes) == 121


def _replace(sc, **kw):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(sc, **kw)


def _scenario(folder: Path, extra: str = "", tram: str = 'stops = "tram.wkt", ') -> Path:
    p = folder / "s.toml"
    p.write_text(
        textwrap.dedent(
            f"""\
            name = "m"
            seed = 1
            duration = 600.0
            mobility_warmup = 50.0
            [world]
            width = 300.0
            height = 200.0
            [radio]
            range = 10.0
            [map]
            roads = "roads.wkt"
            {extra}
            [[groups]]
            name = "p"
            count = 8
            mobility = {{ model = "map", speed = [1.0, 2.0], pause = [0.0, 10.0] }}
            [[groups]]
            name = "t"
            count = 2
            mobility = {{ model = "map_route", {tram}route = "back_and_forth", speed = [5.0, 5.0], pause = [5.0, 5.0] }}
            """
        )
    )
    return p


@pytest.mark.parametrize(
    ("roads", "tram", "edit", "says"),
    [
        (BLOCK, "POINT (1100 2050)", None, r"groups\[1\]\.mobility\.stops: .*50\.0 m from"),
        (
            "LINESTRING (0 0,\n 1 x)",
            "POINT (0 0)",
            None,
            r"map\.roads: .*roads\.wkt:1: .*coordinate",
        ),
        ("LINESTRING (0 0, 500 0)", "POINT (0 0)", None, r"map: the map spans 500\.0 x 0\.0 m"),
        (BLOCK, None, None, r"groups\[1\]\.mobility\.stops: no such file"),
        (BLOCK, "POINT (1000 2000)", ('route = "back_and_forth"', 'route = "random"'), r"route"),
        (
            BLOCK,
            "POINT (1000 2000)",
            ('model = "map", ', 'model = "map", layers = ["rail"], '),
            r"no map layer 'rail'",
        ),
        (BLOCK, "POINT (1000 2000)", ('roads = "roads.wkt"', ""), r"needs a \[map\] table"),
        (
            BLOCK,
            "POINT (1000 2000)",
            ("mobility_warmup = 50.0", "mobility_warmup = -1"),
            r"mobility_warmup",
        ),
        (
            BLOCK,
            "POINT (1000 2000)",
            ("mobility_warmup = 50.0", "mobility_warmup = 100000.0\nmobility_step = 0.01"),
            r"mobility_warmup: at most 1,000,000 mobility steps",
        ),
    ],
)
def test_bad_maps_are_reported_with_their_key(
    tmp_path: Path, roads: str, tram: str | None, edit: tuple[str, str] | None, says: str
) -> None:
    (tmp_path / "roads.wkt").write_text(roads)
    if tram is not None:
        (tmp_path / "tram.wkt").write_text(tram)
    p = _scenario(tmp_path)
    if edit is not None:
        text = p.read_text()
        assert edit[0] in text
        text = text.replace(edit[0], edit[1])
        if not edit[1].strip():
            text = text.replace("[map]\n", "")
        p.write_text(text)
    with pytest.raises(ScenarioError, match=says):
        load(p)
