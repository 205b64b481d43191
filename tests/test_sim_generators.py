"""ONE-style traffic: generators (checked statistically), exact ``at`` times, external events."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sim.runner import simulate
from sim.scenario import Scenario, ScenarioError, loads
from sim.traffic import Targets, schedule

HEAD = """
name = "t"
seed = 5
duration = {duration}
[world]
width = 100.0
height = 100.0
[radio]
range = 500.0
[[groups]]
name = "p"
count = 12
mobility = {{ model = "static" }}
[[groups]]
name = "c"
count = 8
mobility = {{ model = "static" }}
"""

GEN = """
[[traffic.generate]]
name = "one"
sources = ["p", "c"]
destinations = ["p", "c"]
interval = [25, 35]
size = [500_000, 1_000_000]
ttl = [100, 200]
attributes = { topic = "bench" }
"""


def scenario(body: str, duration: float = 2_000_000.0) -> Scenario:
    return loads(HEAD.format(duration=duration) + body)


def problems(text: str) -> dict[str, str]:
    with pytest.raises(ScenarioError) as info:
        loads(text)
    return {p.key: f"line {p.line}: {p.message}" for p in info.value.problems}


def ks_uniform(xs: Sequence[float], lo: float, hi: float) -> float:
    """Kolmogorov-Smirnov distance between the sample and the uniform law on [lo, hi]."""
    s = sorted(xs)
    n = len(s)
    d = 0.0
    for i, x in enumerate(s):
        f = min(max((x - lo) / (hi - lo), 0.0), 1.0)
        d = max(d, (i + 1) / n - f, f - i / n)
    return d


def ks_bound(n: int) -> float:
    """The KS critical distance at the 0.1 % level (asymptotic: 1.949 / sqrt(n))."""
    return 1.949 / math.sqrt(n)


def chi2_bound(dof: int) -> float:
    """The chi-square critical value at the 0.1 % level (Wilson-Hilferty, z = 3.09)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + 3.09 * math.sqrt(a)) ** 3


def chi2_uniform(counts: Counter[str], categories: Sequence[str]) -> float:
    n = sum(counts.values())
    e = n / len(categories)
    return sum((counts.get(c, 0) - e) ** 2 / e for c in categories)


def table(out: Path, name: str) -> list[dict]:
    return pq.read_table(out / f"{name}.parquet").to_pylist()


# --------------------------------------------------------------------------- generators


def test_generated_traffic_has_the_requested_distributions() -> None:
    sc = scenario(GEN)
    names = sc.host_names()
    pubs = schedule(sc, names, sc.duration)
    n = len(pubs)
    assert 2_000_000 / 35 < n < 2_000_000 / 25  # about one message per 30 s
    times = [p.time for p in pubs]
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert min(gaps) >= 25 and max(gaps) <= 35
    sizes = [p.size for p in pubs]
    assert min(sizes) >= 500_000 and max(sizes) <= 1_000_000
    assert all(isinstance(s, int) for s in sizes)
    ttls = [p.ttl for p in pubs]
    for xs, lo, hi in ((gaps, 25, 35), (sizes, 500_000, 1_000_000), (ttls, 100, 200)):
        assert ks_uniform(xs, lo, hi) < ks_bound(n), (lo, hi)
    # the test has power: the same gaps are not uniform on a slightly wider range
    assert ks_uniform(gaps, 25, 36) > ks_bound(n)
    assert ks_uniform(sizes, 500_000, 1_100_000) > ks_bound(n)

    sources = Counter(names[p.host] for p in pubs)
    dests = [p.attributes["dest"] for p in pubs]
    assert all(d != names[p.host] for p, d in zip(pubs, dests, strict=True))
    assert chi2_uniform(sources, names) < chi2_bound(len(names) - 1)
    assert chi2_uniform(Counter(dests), names) < chi2_bound(len(names) - 1)
    # given its source, the destination is uniform over the other hosts
    of_first = Counter(d for p, d in zip(pubs, dests, strict=True) if p.host == 0)
    assert chi2_uniform(of_first, names[1:]) < chi2_bound(len(names) - 2)
    assert all(p.attributes["topic"] == "bench" for p in pubs)


def test_each_destination_is_the_only_target_of_its_messages(tmp_path: Path) -> None:
    body = GEN.replace("[25, 35]", "[5, 10]").replace("[500_000, 1_000_000]", "[100, 2000]")
    body = body.replace('destinations = ["p", "c"]', 'destinations = ["c", "0..3"]')
    sc = scenario(body, duration=300.0)
    res = simulate(sc, tmp_path)
    created = {r["msg_id"]: r for r in table(tmp_path, "messages") if r["event"] == "created"}
    targets = table(tmp_path, "targets")
    assert len(created) == res.counters["sim_published"] > 20
    assert sorted(r["msg_id"] for r in targets) == sorted(created)  # one target each
    allowed = set(sc.resolve(["c", "0..3"]))
    assert allowed == {f"c-{i}" for i in range(8)} | {f"p-{i}" for i in range(4)}
    for t in targets:
        assert t["host"] in allowed and t["host"] != t["origin"]
        assert t["topic"] == "bench"
    # and the destination (only it) delivers it: its subscription is its own name
    delivered = [r for r in table(tmp_path, "messages") if r["event"] == "delivered"]
    want = {(t["msg_id"], t["host"]) for t in targets}
    assert delivered and all((r["msg_id"], r["host"]) in want for r in delivered)


def test_one_to_many_mode_targets_every_destination_but_the_source() -> None:
    body = GEN.replace('name = "one"', 'name = "alerts"\nmode = "all"\nattribute = "to"')
    body = body.replace('destinations = ["p", "c"]', 'destinations = ["c"]')
    sc = scenario(body, duration=600.0)
    targets = Targets(sc)
    pubs = schedule(sc, sc.host_names(), sc.duration)
    assert pubs and all(p.attributes == {"topic": "bench", "to": "alerts"} for p in pubs)
    for p in pubs:
        origin = sc.host_names()[p.host]
        got = targets.of({**p.attributes, "origin": origin}, origin)
        assert got == [f"c-{i}" for i in range(8) if f"c-{i}" != origin]


def test_generator_stream_does_not_shift_when_hosts_are_added_elsewhere() -> None:
    body = GEN.replace('sources = ["p", "c"]', 'sources = ["c"]')
    body = body.replace('destinations = ["p", "c"]', 'destinations = ["c"]')
    one = scenario(body, duration=3600.0)
    more = loads(
        HEAD.replace('name = "p"\ncount = 12', 'name = "p"\ncount = 30').format(duration=3600.0)
        + '[[groups]]\nname = "z"\ncount = 4\nmobility = { model = "static" }\n'
        + body
    )

    def view(sc: Scenario) -> list[tuple[float, str, str, int]]:
        names = sc.host_names()
        return [
            (p.time, names[p.host], p.attributes["dest"], p.size)
            for p in schedule(sc, names, sc.duration)
        ]

    assert view(one) == view(more) and len(view(one)) > 100
    other_seed = schedule(one, one.host_names(), one.duration, seed=6)
    assert [p.time for p in other_seed] != [t for t, *_ in view(one)]


def test_bad_generator_entries_are_named() -> None:
    bad = (
        GEN.replace("[25, 35]", "[35, 25]")
        .replace("[500_000, 1_000_000]", '"big"')
        .replace('sources = ["p", "c"]', 'sources = ["p", "40..50"]')
        .replace('name = "one"', 'name = "one"\nmode = "some"\nattribute = "size"')
    )
    found = problems(HEAD.format(duration=100.0) + bad)
    assert set(found) == {
        "traffic.generate[0].interval",
        "traffic.generate[0].size",
        "traffic.generate[0].sources",
        "traffic.generate[0].mode",
        "traffic.generate[0].attribute",
    }
    assert "0 <= first <= last < 20" in found["traffic.generate[0].sources"]
    for dests in ('["p-0"]', '["p-0", "p-0"]'):  # one host, however often it is named
        lonely = GEN.replace('destinations = ["p", "c"]', f"destinations = {dests}")
        found = problems(HEAD.format(duration=100.0) + lonely)
        assert "p-0 has no destination but itself" in found["traffic.generate[0].destinations"]


# --------------------------------------------------------------------------- at


def test_publish_at_exact_times(tmp_path: Path) -> None:
    # 1.742 + (13.301 - 1.742) != 13.301 in floating point: a naive delay misses 13.301
    times = [13.301, 0.1, 1.742, 0.30000000000000004, 0.3, 58.216, 22.697]
    body = (
        '[[traffic.publish]]\nhosts = ["p-1", "c-0"]\nattributes = { topic = "x" }\n'
        f"at = {times}\nsize = 321\n"
        '[[traffic.subscribe]]\nhosts = ["p-0"]\npatterns = { topic = "x" }\n'
    )
    sc = scenario(body, duration=60.0)
    simulate(sc, tmp_path)
    created = [r for r in table(tmp_path, "messages") if r["event"] == "created"]
    got = sorted((r["host"], r["time"]) for r in created)
    assert got == sorted((h, t) for h in ("p-1", "c-0") for t in times)  # bit for bit
    assert {r["bytes"] for r in created} == {321}
    assert sorted(r["created"] for r in table(tmp_path, "targets")) == sorted(times * 2)
    found = problems(
        HEAD.format(duration=60.0)
        + body.replace("size = 321", "interval = 3.0\nsize = 321").replace("58.216", "60.0")
    )
    assert set(found) == {"traffic.publish[0].interval", "traffic.publish[0].at"}
    assert "cannot be combined with at" in found["traffic.publish[0].interval"]


# --------------------------------------------------------------------------- external events

EVENTS = """\
# The ONE external events
1.5 C M1 0 19 1000
12.25 C M2 c-3 p-2 2k
12.25 C M3 p7 3 500 0

30 C M4 19 0 1kiB  # trailing comment
"""


def external(tmp_path: Path, events: str, extra: str = "") -> str:
    f = tmp_path / "events.txt"
    f.write_text(events)
    return HEAD.format(duration=60.0) + (
        f'[[traffic.external]]\nfile = "{f}"\nttl = 40.0\n'
        'attributes = { topic = "ext" }\n' + extra
    )


def test_external_events_are_replayed_exactly(tmp_path: Path) -> None:
    sc = loads(external(tmp_path, EVENTS))
    out = tmp_path / "run"
    simulate(sc, out)
    created = sorted(
        (r["time"], r["host"], r["bytes"])
        for r in table(out, "messages")
        if r["event"] == "created"
    )
    assert created == [
        (1.5, "p-0", 1000),
        (12.25, "c-3", 2000),
        (12.25, "p-7", 500),
        (30.0, "c-7", 1024),
    ]
    targets = sorted((r["created"], r["origin"], r["host"], r["deadline"], r["topic"])
                     for r in table(out, "targets"))  # fmt: skip
    assert targets == [
        (1.5, "p-0", "c-7", 41.5, "ext"),
        (12.25, "c-3", "p-2", 52.25, "ext"),
        (12.25, "p-7", "p-3", 52.25, "ext"),
        (30.0, "c-7", "p-0", 70.0, "ext"),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("5 X M9 1 2 100", "'X' is an unknown event kind"),
        ("5 CONN 1 2 up", "'CONN' is a connection (give contacts in [contacts]) event"),
        ("5 DE M1 1 2", "'DE' is a transfer done event"),
        ("5 C M9 1 2", "expected '<time> C <id> <from> <to> <size> [<respsize>]'"),
        ("soon C M9 1 2 100", "time 'soon' is not a number"),
        ("--5 C M9 1 2 100", "time '--5' is not a number"),
        ("1_0 C M9 1 2 100", "time '1_0' is not a number"),  # float() reads 10
        ("٣ C M9 1 2 100", "time '٣' is not a number"),  # float() reads 3
        ("5 C M9 1 2 lots", "size 'lots' is not a byte count"),
        ("5 C M9 1 20 100", "host '20' is not a scenario host nor an index below 20"),
        ("5 C M9 1 p-1 100", "is from and to the same host p-1"),
        # a sign is no part of an index, as in a contact trace (these were host 1)
        ("5 C M9 +1 2 100", "host '+1' is not a scenario host nor an index below 20 (a host"),
        ("5 C M9 q-1 2 100", "host 'q-1' is not a scenario host nor an index below 20"),
        ("5 C M9 2 x+1 100", "host 'x+1' is not a scenario host nor an index below 20"),
        # a byte order mark after the start of the file is named (it was a bad time or host)
        ("\ufeff5 C M9 1 2 100", "byte order mark (U+FEFF) is only allowed at the start"),
        ("5 C M9 1\ufeff 2 100", "byte order mark (U+FEFF) is only allowed at the start"),
        ("5 C M9 1 2 100 50", "response messages (respsize 50) are not simulated"),
    ],
)
def test_bad_external_event_lines_name_the_file_and_line(
    tmp_path: Path, line: str, message: str
) -> None:
    found = problems(external(tmp_path, EVENTS + line + "\n"))
    assert list(found) == ["traffic.external[0].file"]
    assert f"{tmp_path / 'events.txt'}:7: " in found["traffic.external[0].file"]
    assert message in found["traffic.external[0].file"]


def test_external_events_may_start_with_a_utf8_bom_and_use_prefixed_indices(
    tmp_path: Path,
) -> None:
    sc = loads(external(tmp_path, "\ufeff" + EVENTS + "50 C M9 h12 x3 100\n"))
    assert [(c.source, c.destination) for c in sc.external[0].events][-2:] == [
        ("c-7", "p-0"),
        ("c-0", "p-3"),
    ]


def test_missing_events_file(tmp_path: Path) -> None:
    text = external(tmp_path, "").replace("events.txt", "nope.txt")
    assert "cannot read" in problems(text)["traffic.external[0].file"]


def test_unreadable_events_files(tmp_path: Path) -> None:
    binary = external(tmp_path, "").replace("events.txt", "bin.dat")
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe 1 C M1 0 1 100\n")
    assert "not a text file" in problems(binary)["traffic.external[0].file"]
    nul = external(tmp_path, "").replace("events.txt", "ev\\u0000ts.txt")
    assert "cannot read" in problems(nul)["traffic.external[0].file"]


def test_sizes_beyond_the_hosts_max_message_size_are_refused(tmp_path: Path) -> None:
    limit = "[protocol.limits]\nmax_message_size = 10_000\n"
    text = external(tmp_path, EVENTS + "40 C M9 1 2 20k\n").replace(
        "[[groups]]", limit + "[[groups]]", 1
    )
    text += (
        GEN
        + '[[traffic.publish]]\nhosts = ["c"]\nattributes = { a = "b" }\nat = [1.0]\nsize = 10_001\n'
    )
    found = problems(text)
    assert set(found) == {
        "traffic.external[0].file",
        "traffic.generate[0].size",
        "traffic.publish[0].size",
    }
    assert (
        "events.txt:7: 20000 bytes exceed p-1's max_message_size (10000)"
        in found["traffic.external[0].file"]
    )
    assert "10001 bytes exceed c-0's" in found["traffic.publish[0].size"]
    with pytest.raises(ScenarioError) as info:
        loads(text)
    # both groups of the generator's sources would refuse its largest message
    assert [p.message for p in info.value.problems if p.key == "traffic.generate[0].size"] == [
        "1000000 bytes exceed p-0's max_message_size (10000)",
        "1000000 bytes exceed c-0's max_message_size (10000)",
    ]


def test_every_group_and_reason_refusing_external_events_is_reported(tmp_path: Path) -> None:
    # the first message over a max_message_size hid every other refusal of the file
    events = "1 C M1 0 1 20k\n2 C M2 c-1 0 500\n3 C M3 c-2 0 30k\n"
    text = (
        external(tmp_path, events)
        .replace("[[groups]]", "[protocol.limits]\nmax_message_size = 10_000\n[[groups]]", 1)
        .replace('name = "c"\n', 'name = "c"\nprotocol = { limits = { max_ttl = 30.0 } }\n')
    )
    with pytest.raises(ScenarioError) as info:
        loads(text)
    f = tmp_path / "events.txt"
    assert [(p.key, p.message) for p in info.value.problems] == [
        ("traffic.external[0].file", f"{f}:1: 20000 bytes exceed p-0's max_message_size (10000)"),
        ("traffic.external[0].file", f"{f}:3: 30000 bytes exceed c-2's max_message_size (10000)"),
        (
            "traffic.external[0].file",
            f"{f}:3: c-2 would refuse it: time to live 40 s is longer than the maximum, "
            "30 s (limits.max_ttl)",
        ),
    ]


def test_external_event_ids_are_in_the_descriptor(tmp_path: Path) -> None:
    sc = loads(external(tmp_path, EVENTS))
    pubs = schedule(sc, sc.host_names(), sc.duration)
    # M2 and M3 are simultaneous: they go in host order (p-7 before c-3)
    assert [(p.attributes["event_id"], p.attributes["dest"]) for p in pubs] == [
        ("M1", "c-7"),
        ("M3", "p-3"),
        ("M2", "p-2"),
        ("M4", "p-0"),
    ]  # fmt: skip
    found = problems(external(tmp_path, EVENTS, 'attribute = "event_id"\n'))
    assert "holds the file's message id" in found["traffic.external[0].attribute"]


def test_generated_traffic_written_as_external_events_replays_identically(
    tmp_path: Path,
) -> None:
    from sim.external_events import write
    from sim.traffic import as_events

    gen = scenario(GEN, duration=3600.0)
    pubs = schedule(gen, gen.host_names(), gen.duration)
    f = tmp_path / "events.txt"
    assert write(f, as_events(gen, pubs)) == len(pubs) > 100
    replay = loads(
        HEAD.format(duration=3600.0) + f'[[traffic.external]]\nfile = "{f}"\nttl = 150.0\n'
    )
    again = schedule(replay, replay.host_names(), replay.duration)

    def view(ps: list) -> list[tuple[float, int, str, int]]:
        return [(p.time, p.host, p.attributes["dest"], p.size) for p in ps]

    assert view(again) == view(pubs)  # times bit for bit, hosts, destinations, sizes
