"""Scenario format: shipped scenarios load, bad ones list every problem with key and line."""

from __future__ import annotations

import re
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


def test_the_link_mtu_reaches_the_medium_and_is_checked() -> None:
    from sim.runner import Simulation

    assert loads(GOOD).radio.mtu == 1500
    sc = loads(GOOD.replace("range = 10.0", "range = 10.0\nmtu = 576"))
    assert Simulation(sc).medium.frames(1400) == 3
    found = problems(GOOD.replace("range = 10.0", "range = 10.0\nmtu = 60"))
    assert found["radio.mtu"][1] == "must be >= 68, got 60"


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


def test_static_positions_and_island_discs_must_lie_in_the_world() -> None:
    # they passed validation and the run placed hosts at negative coordinates, while the
    # docs say positions are in [0, width] x [0, height] unless a model's area says otherwise
    text = GOOD + (
        '[[groups]]\nname = "isl"\ncount = 5\n'
        'mobility = { model = "island", center = [5.0, 5.0], radius = 10.0 }\n'
        '[[groups]]\nname = "big"\ncount = 1\n'
        'mobility = { model = "island", center = [50.0, 25.0], radius = 30.0 }\n'
        '[[groups]]\nname = "st"\ncount = 3\n'
        'mobility = { model = "static", positions = [[1, 1], [-500.0, 900.0], [100.0, 50.5]] }\n'
    )
    found = problems(text)
    world = "the world ([0, 100.0] x [0, 50.0] m)"
    assert {k: msg for k, (_line, msg) in found.items()} == {
        "groups[1].mobility.center": f"the disc center [5.0, 5.0] ± radius 10.0 reaches "
        f"outside {world}",
        "groups[2].mobility.radius": f"the disc center [50.0, 25.0] ± radius 30.0 is wider "
        f"than {world}",
        "groups[3].mobility.positions": f"2 of 3 positions are outside {world}: "
        "positions[1] = [-500.0, 900.0]",
    }
    lines = text.splitlines()
    for key, written in [("center", "[5.0, 5.0]"), ("radius", "30.0"), ("positions", "-500.0")]:
        (line, _msg), *_ = (v for k, v in found.items() if k.endswith(key))
        assert line is not None and written in lines[line - 1], key
    # a disc touching the edges and positions on them are in; a static group's area
    # replaces the world for its positions (and a walker's area may leave the world)
    sc = loads(
        GOOD + '[[groups]]\nname = "isl"\ncount = 2\n'
        'mobility = { model = "island", center = [10.0, 40.0], radius = 10.0 }\n'
        '[[groups]]\nname = "st"\ncount = 2\n'
        'mobility = { model = "static", positions = [[0, 0], [100.0, 50.0]] }\n'
        '[[groups]]\nname = "out"\ncount = 1\n'
        'mobility = { model = "static", area = [-10, -10, 0, 0], positions = [[-5, -5]] }\n'
        '[[groups]]\nname = "far"\ncount = 1\n'
        'mobility = { model = "random_walk", area = [-1000, -1000, 5000, 5000] }\n'
    )
    assert sc.groups[3].mobility.positions == ((-5.0, -5.0),)
    outside = GOOD + (
        '[[groups]]\nname = "out"\ncount = 1\n'
        'mobility = { model = "static", area = [-10, -10, 0, 0], positions = [[5, 5]] }\n'
    )
    assert problems(outside)["groups[1].mobility.positions"][1] == (
        "a position is outside the group's area [-10.0, -10.0, 0.0, 0.0]: positions[0] = [5.0, 5.0]"
    )


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


# --------------------------------------------------------------------------- protocol keys


def _other(value: object, step: int) -> object:
    """A valid non-default value of a setting (booleans flip, numbers move up a little)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + step
    assert isinstance(value, float)
    return value + 0.125 * step


def _toml_table(values: dict[str, object]) -> str:
    def lit(v: object) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else repr(v)

    return "\n".join(f"{k} = {lit(v)}" for k, v in values.items())


def test_every_protocol_key_reaches_the_simulated_nodes() -> None:
    from dataclasses import fields

    from dodwan.core.config import NodeConfig
    from sim.protocol import DEFAULTS, EXCLUDED, LIMIT_DEFAULTS
    from sim.runner import Simulation

    # generic: every NodeConfig field is either settable or explicitly excluded
    assert set(DEFAULTS) | set(EXCLUDED) == {f.name for f in fields(NodeConfig)}
    base = {k: _other(v, 1) for k, v in DEFAULTS.items()}
    group = {k: _other(v, 2) for k, v in DEFAULTS.items()}
    base_limits = {k: _other(v, 1) for k, v in LIMIT_DEFAULTS.items()}
    text = GOOD.replace("[[groups]]", (
        f"[protocol]\n{_toml_table(base)}\n[protocol.limits]\n{_toml_table(base_limits)}\n"
        "[[groups]]"
    ), 1) + (
        '[[groups]]\nname = "h"\ncount = 2\nmobility = { model = "static" }\n'
        f"[groups.protocol]\n{_toml_table(group)}\n"
        "[groups.protocol.limits]\nmax_fragments = 7\n"
    )  # fmt: skip
    sc = loads(text)
    sim = Simulation(sc)
    by_name = {h.name: h.node.config for h in sim.hosts}
    for k in DEFAULTS:
        assert getattr(by_name["g-0"], k) == base[k], k
        assert getattr(by_name["h-1"], k) == group[k], k
    for k in LIMIT_DEFAULTS:
        assert getattr(by_name["g-2"].limits, k) == base_limits[k], k
        want = 7 if k == "max_fragments" else base_limits[k]  # the group inherits the rest
        assert getattr(by_name["h-0"].limits, k) == want, k
    assert by_name["g-0"].max_datagram == sc.radio.max_datagram
    assert all(h.node._tracing for h in sim.hosts)  # through the recorder's sink


def test_protocol_defaults_are_the_simulators() -> None:
    from sim.runner import Simulation

    cfg = Simulation(loads(GOOD)).hosts[0].node.config
    assert cfg.horizon == 1  # the simulator's historical default, not the core's 2
    assert cfg.cache_capacity == 64 << 20 and cfg.announce_period == 5.0


def test_bad_protocol_values_name_their_key() -> None:
    text = GOOD.replace(
        "[[groups]]",
        '[protocol]\nannounce_jitter = 1.5\nrequest_window = "lots"\ncolour = 1\n'
        "[protocol.limits]\nmax_fragments = 2.5\n[[groups]]",
        1,
    ).replace('name = "g"', 'name = "g"\nprotocol = { compression_level = 40 }')
    found = problems(text)
    lines = text.splitlines()
    assert set(found) == {
        "protocol.announce_jitter",
        "protocol.request_window",
        "protocol.colour",
        "protocol.limits.max_fragments",
        "groups[0].protocol.compression_level",
    }
    assert "announce_jitter must be in [0, 1)" in found["protocol.announce_jitter"][1]
    assert "must be an integer" in found["protocol.request_window"][1]
    assert (
        "compression_level must be between 1 and 22"
        in found["groups[0].protocol.compression_level"][1]
    )
    for key, (line, _msg) in found.items():
        assert line is not None and key.rsplit(".", 1)[-1] in lines[line - 1], key


def test_docs_list_every_protocol_key() -> None:
    from sim.protocol import render_markdown

    doc = (Path(__file__).resolve().parent.parent / "docs" / "scenarios.md").read_text()
    begin = doc.index("<!-- protocol-keys: generated")
    block = doc[doc.index("\n", begin) + 1 : doc.index("<!-- protocol-keys: end -->")]
    assert block == render_markdown(), "regenerate with: python -m sim.protocol"


@pytest.mark.parametrize("counts", [[2_000_000], [60_000, 60_000]])
def test_a_huge_host_count_is_refused_before_anything_is_allocated(counts: list[int]) -> None:
    # A group count of 10^8 (the scenario fuzzer drew one) made the loader build every host
    # name before refusing: tens of gigabytes, and the test process was killed.
    import tracemalloc

    text = (Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.toml").read_text()
    head, _, _ = text.partition("[[groups]]")
    groups = "".join(
        f'[[groups]]\nname = "g{i}"\ncount = {n}\nmobility = {{ model = "random_waypoint", '
        f"speed = [0.5, 2.0] }}\n"
        for i, n in enumerate(counts)
    )
    tracemalloc.start()
    try:
        with pytest.raises(ScenarioError, match=r"count: must be <= 100000|hosts in all groups"):
            loads(head + groups, Path("huge.toml"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024


def test_message_attributes_are_checked_as_publish_checks_them() -> None:
    # a wrong value of "once" used to surface only when the run published the message,
    # as an exception in the middle of the run; a system attribute likewise
    text = GOOD.replace(
        'attributes = { topic = "x" }', 'attributes = { topic = "x", once = "yes", size = "3" }'
    )
    found = problems(text)
    assert '"true" or "false"' in found["traffic.publish[0].attributes.once"][1]
    assert "system attribute" in found["traffic.publish[0].attributes.size"][1]
    ok = loads(
        GOOD.replace('attributes = { topic = "x" }', 'attributes = { topic = "x", once = "true" }')
    )
    assert ok.publish[0].attributes["once"] == "true"
    # patterns are regexes, not values: "once" there is any expression
    assert loads(GOOD.replace('patterns = [{ topic = "x|y" }]', 'patterns = [{ once = "t.*" }]'))


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        # the default ttl (3600 s) over the host's own max_ttl
        ("[protocol.limits]\nmax_ttl = 1800.0\n", "traffic.publish[0].ttl", "max_ttl"),
        # 5000 incompressible bytes need more than 2 fragments
        (
            "[protocol.limits]\nmax_fragments = 2\n",
            "traffic.publish[0].size",
            "more than limits.max_fragments",
        ),
        # attribute names the core refuses
        ('attributes = { "" = "x" }', "traffic.publish[0].attributes", "bad attribute name"),
        (f'attributes = {{ {"a" * 65} = "x" }}', "traffic.publish[0].attributes", "name"),
    ],
)
def test_traffic_a_host_limits_refuse_is_reported_with_key_and_line(
    change: str, key: str, message: str
) -> None:
    # these used to pass validate and stop the run with a ValueError out of SimPy
    text = GOOD.replace("interval = 10.0", "interval = 10.0\nsize = 5000")
    if change.startswith("attributes"):
        text = text.replace('attributes = { topic = "x" }', change)
    else:
        text = text.replace("[[groups]]", change + "[[groups]]", 1)
    found = problems(text)
    assert key in found, found
    line, msg = found[key]
    assert message in msg
    # the key's line, or its entry's when the key is not written (a default)
    assert line is not None
    leaf = key.rsplit(".", 1)[-1]
    written = re.search(rf"^{leaf}\s*=", text, re.M)
    assert (
        text.splitlines()[line - 1] == "[[traffic.publish]]"
        if not written
        else (leaf in text.splitlines()[line - 1])
    )


def test_every_group_and_every_reason_that_refuses_an_entry_is_reported() -> None:
    # only the first group's first refusal was reported: fixing it showed the next one
    groups = (
        '[[groups]]\nname = "b"\ncount = 1\nmobility = { model = "static" }\n'
        "protocol = { limits = { max_ttl = 100.0 } }\n"
        '[[groups]]\nname = "c"\ncount = 1\nmobility = { model = "static" }\n'
        "protocol = { limits = { max_ttl = 50.0, max_fragments = 2, max_attribute_name = 3 } }\n"
        '[[groups]]\nname = "d"\ncount = 1\nmobility = { model = "static" }\n'
        "protocol = { limits = { max_ttl = 200.0, max_message_size = 4000 } }\n"
    )
    text = (
        GOOD.replace("[[traffic.publish]]", groups + "[[traffic.publish]]")
        .replace('hosts = ["g-0"]', 'hosts = ["g-0", "b", "c", "d"]')
        .replace("interval = 10.0", "interval = 10.0\nsize = 5000")
    )
    with pytest.raises(ScenarioError) as info:
        loads(text)
    found = [(p.key, p.message) for p in info.value.problems]
    longer = "time to live 3600 s is longer than the maximum"
    assert found == [
        ("traffic.publish[0].ttl", f"b hosts would refuse it: {longer}, 100 s (limits.max_ttl)"),
        ("traffic.publish[0].attributes", "c hosts would refuse it: bad attribute name 'topic'"),
        ("traffic.publish[0].ttl", f"c hosts would refuse it: {longer}, 50 s (limits.max_ttl)"),
        (
            "traffic.publish[0].size",
            "c hosts would refuse it: payload needs 5 fragments of 1177 bytes, more than "
            "limits.max_fragments (2): raise max_datagram or limits.max_fragments, or use "
            "fewer attributes",
        ),
        ("traffic.publish[0].size", "5000 bytes exceed d-0's max_message_size (4000)"),
        ("traffic.publish[0].ttl", f"d hosts would refuse it: {longer}, 200 s (limits.max_ttl)"),
    ]
    lines = text.splitlines()
    for p in info.value.problems:  # each on its key's line, or its entry's (ttl is not given)
        assert p.line is not None
        assert lines[p.line - 1].startswith(("size", "attributes", "[[traffic.publish]]")), p


@pytest.mark.parametrize(
    "limit", ["max_requests_per_second = -1.0", "max_neighbours = -1", "max_fragments = 0"]
)
def test_negative_or_zero_limits_are_refused(limit: str) -> None:
    text = GOOD.replace("[[groups]]", f"[protocol.limits]\n{limit}\n[[groups]]", 1)
    found = problems(text)
    key = "protocol.limits." + limit.split(" ")[0]
    assert "must be > 0" in found[key][1]


def test_docs_have_a_heading_for_every_table() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "scenarios.md").read_text()
    headings = [ln for ln in doc.splitlines() if ln.startswith("#")]
    for table in ("world", "radio", "map", "protocol", "contacts", "traffic"):
        assert any(f"`[{table}]`" in h for h in headings), table


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        ("duration = 1e300", "duration", "must be <= 315360000"),
        ("duration = 315360001.0", "duration", "must be <= 315360000"),
        ("mobility_step = 1e-300", "mobility_step", "must be >= 1e-06"),
        ("mobility_step = 1e-7", "mobility_step", "must be >= 1e-06"),
        ("cache_sample_period = 1e-300", "cache_sample_period", "must be >= 1e-06"),
    ],
)
def test_durations_and_steps_have_sane_bounds(line: str, key: str, message: str) -> None:
    """duration = 1e300 validated (and printed a 300-digit time); a step of 1e-300 adds
    nothing to the clock, so the run would never end."""
    name = line.split(" =", 1)[0]
    text = GOOD.replace("duration = 100.0", "duration = 100.0" if name != "duration" else line)
    if name != "duration":
        text = text.replace("seed = 3\n", f"seed = 3\n{line}\n")
    found = problems(text)
    assert list(found) == [key] and message in found[key][1], found


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        # list values were checked for type and length only: inf crashed the run (after it
        # had cleared --out), nan ran to exit 0 with wrong contacts
        (("speed = [1.0, 2.0]", "speed = [1.0, inf]"), "groups[0].mobility.speed", "finite"),
        (("pause = [0.0, 5.0]", "pause = [nan, 5.0]"), "groups[0].mobility.pause", "finite"),
        # validated, then filled the memory without moving the clock
        (("interval = 10.0", "interval = 1e-12"), "traffic.publish[0].interval", ">= 0.001"),
        (("[[groups]]", "[protocol]\nannounce_period = 1e-9\n[[groups]]"),
         "protocol.announce_period", ">= 0.01"),
    ],
)  # fmt: skip
def test_non_finite_lists_and_absurd_rates_are_refused(
    edit: tuple[str, str], key: str, message: str
) -> None:
    assert edit[0] in GOOD
    found = problems(GOOD.replace(edit[0], edit[1], 1))
    assert list(found) == [key] and message in found[key][1], found


def test_the_longest_duration_and_shortest_steps_are_accepted() -> None:
    from sim.scenario import MAX_DURATION, MIN_STEP

    assert MAX_DURATION == 10 * 365 * 86400.0 and MIN_STEP == 1e-6
    extra = f"mobility_step = {MIN_STEP!r}\ncache_sample_period = {MIN_STEP!r}\n"
    text = GOOD.replace("duration = 100.0", f"duration = {MAX_DURATION!r}\n{extra}")
    sc = loads(text)
    assert (sc.duration, sc.mobility_step, sc.cache_sample_period) == (
        MAX_DURATION,
        MIN_STEP,
        MIN_STEP,
    )
    # and a step still moves the clock at the end of the longest run
    assert MAX_DURATION + MIN_STEP > MAX_DURATION
