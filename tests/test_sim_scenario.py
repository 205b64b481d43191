"""Scenario format: shipped scenarios load, bad ones list every problem with key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.scenario import ScenarioError, load, loads

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

GOOD = """
name = "t"
seed = 3
duration = 100.0
[world]
width = 100.0
height = 50.0
[radio]
range = 10.0
[[groups]]
name = "g"
count = 3
mobility = { model = "random_waypoint", speed = [1.0, 2.0], pause = [0.0, 5.0] }
[[traffic.publish]]
hosts = ["g-0"]
attributes = { topic = "x" }
interval = 10.0
[[traffic.subscribe]]
hosts = ["g"]
patterns = [{ topic = "x|y" }]
"""


def problems(text: str) -> dict[str, tuple[int | None, str]]:
    with pytest.raises(ScenarioError) as info:
        loads(text)
    return {p.key: (p.line, p.message) for p in info.value.problems}


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    sc = load(path)
    assert sc.name == path.stem
    assert sc.host_names()
    assert sc.duration > 0


def test_good_scenario_fields_and_defaults() -> None:
    sc = loads(GOOD)
    assert sc.world == (100.0, 50.0)
    assert sc.radio.range == 10.0 and sc.radio.loss == 0.0
    assert sc.host_names() == ["g-0", "g-1", "g-2"]
    assert sc.groups[0].mobility.speed == (1.0, 2.0)
    assert sc.publish[0].stop == 100.0  # defaults to the duration
    assert sc.resolve(["g"]) == ["g-0", "g-1", "g-2"]
    assert sc.resolve(["g-2", "g-0"]) == ["g-0", "g-2"]


def test_every_problem_is_listed_with_key_and_line() -> None:
    bad = (
        GOOD.replace("width = 100.0", 'width = -1\ncolour = "red"')
        .replace("speed = [1.0, 2.0]", "speed = [3.0, 2.0]")
        .replace('hosts = ["g-0"]', 'hosts = ["nobody"]')
    )
    found = problems(bad)
    lines = bad.splitlines()
    assert set(found) == {
        "world.width",
        "world.colour",
        "groups[0].mobility.speed",
        "traffic.publish[0].hosts",
    }
    for key, (line, _msg) in found.items():
        assert line is not None, key
        assert key.rsplit(".", 1)[-1] in lines[line - 1], (key, lines[line - 1])
    assert "unknown key" in found["world.colour"][1]
    assert "nobody" in found["traffic.publish[0].hosts"][1]


def test_second_array_table_is_located() -> None:
    text = GOOD + '\n[[groups]]\nname = "h"\ncount = 0\nmobility = { model = "static" }\n'
    found = problems(text)
    line, msg = found["groups[1].count"]
    assert text.splitlines()[line - 1].strip() == "count = 0"
    assert ">= 1" in msg


def test_missing_required_sections() -> None:
    found = problems('name = "x"\n')
    assert {"duration", "world.width", "world.height", "radio.range", "groups"} <= set(found)


def test_syntax_error_names_the_line() -> None:
    found = problems('name = "x"\nduration = = 3\n')
    assert found["(syntax)"][0] == 2


def test_bad_regex_and_unknown_model() -> None:
    text = GOOD.replace('"x|y"', '"(x"').replace('"random_waypoint"', '"teleport"')
    found = problems(text)
    assert "traffic.subscribe[0].patterns[0].topic" in found
    assert "must be one of" in found["groups[0].mobility.model"][1]


def test_carrier_needs_island_groups() -> None:
    text = GOOD + (
        '[[groups]]\nname = "c"\ncount = 1\n'
        'mobility = { model = "carrier", islands = ["g", "zz"], speed = [1.0, 2.0] }\n'
    )
    found = problems(text)
    assert 'model = "island"' in found["groups[1].mobility.islands"][1]


def test_joms_section_is_validated() -> None:
    text = GOOD + (
        '[[traffic.joms.queues]]\nname = "jobs"\nmanager = "ghost"\n'
        'senders = ["g"]\nreceivers = ["g-1"]\n'
    )
    found = problems(text)
    assert "ghost" in found["traffic.joms.queues[0].manager"][1]
    ok = loads(text.replace('"ghost"', '"g-0"'))
    assert ok.uses_joms and ok.joms_queues[0].receivers == ("g-1",)


def test_missing_trace_file_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text(GOOD + '[contacts]\ntrace = "nope.txt"\n')
    with pytest.raises(ScenarioError) as info:
        load(f)
    assert [p.key for p in info.value.problems] == ["contacts.trace"]
