"""Contact traces: both formats parse, bad lines are named, replay reproduces contacts exactly."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sim.mobility.trace import TraceError, load_trace, map_hosts
from sim.runner import simulate
from sim.scenario import ContactTrace, ScenarioError, load, loads

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

BASE = """
name = "replay"
duration = 100.0
[world]
width = 10.0
height = 10.0
[radio]
range = 1.0
[[groups]]
name = "n"
count = 4
mobility = { model = "static" }
"""


def test_one_and_csv_formats_parse_the_same(tmp_path: Path) -> None:
    one = tmp_path / "t.txt"
    one.write_text("# comment\n0 CONN 0 1 up\n\n5.5 CONN 2 1 up\n7 CONN 0 1 down\n")
    csvf = tmp_path / "t.csv"
    csvf.write_text("time,a,b,up\n0,0,1,up\n5.5,2,1,1\n7,0,1,false\n")
    a = load_trace(one, "one")
    b = load_trace(csvf, "csv")
    assert a == b
    assert [(e.time, e.a, e.b, e.up) for e in a] == [
        (0.0, "0", "1", True),
        (5.5, "2", "1", True),
        (7.0, "0", "1", False),
    ]


@pytest.mark.parametrize(
    ("text", "fmt", "expect"),
    [
        ("0 CONN 0 1 up\nx CONN 0 1 down\n", "one", ":2: time"),
        ("0 CONN 0 1 sideways\n", "one", ":1: state"),
        ("0 LINK 0 1 up\n", "one", ":1: expected"),
        ("0,0,1\n", "csv", ":1: expected 4 columns"),
        ("3 CONN 2 2 up\n", "one", "itself"),
    ],
)
def test_bad_trace_lines_are_named(tmp_path: Path, text: str, fmt: str, expect: str) -> None:
    f = tmp_path / "bad"
    f.write_text(text)
    with pytest.raises(TraceError, match=expect):
        load_trace(f, fmt)


def test_trace_hosts_map_by_name_or_index(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("1 CONN n-2 3 up\n")
    assert map_hosts(load_trace(f, "one"), ["n-0", "n-1", "n-2", "n-3"]) == [(1.0, 2, 3, True)]
    f.write_text("1 CONN 0 9 up\n")
    with pytest.raises(TraceError, match="'9'"):
        map_hosts(load_trace(f, "one"), ["n-0", "n-1"])


def test_replay_reproduces_the_trace_contacts_exactly(tmp_path: Path) -> None:
    sc = load(SCENARIOS / "trace.toml")
    out = tmp_path / "out"
    simulate(sc, out, until=1800.0)
    rows = pq.read_table(out / "contacts.parquet").to_pylist()
    names = sc.host_names()
    expected = []
    for e in load_trace(sc.contacts.path, sc.contacts.format):  # type: ignore[union-attr]
        if e.time >= 1800.0:
            break
        a, b = sorted((names[int(e.a)], names[int(e.b)]))
        expected.append((e.time, a, b, e.up))
    assert [(r["time"], r["a"], r["b"], r["up"]) for r in rows] == expected


def test_contacts_option_replaces_mobility(tmp_path: Path) -> None:
    f = tmp_path / "c.csv"
    f.write_text("time,a,b,up\n1,n-0,n-1,up\n2,n-1,n-3,up\n50,n-0,n-1,down\n")
    sc = loads(BASE)
    simulate(sc, tmp_path / "o", contacts=ContactTrace(f, "csv"))
    rows = pq.read_table(tmp_path / "o" / "contacts.parquet").to_pylist()
    assert [(r["time"], r["a"], r["b"], r["up"]) for r in rows] == [
        (1.0, "n-0", "n-1", True),
        (2.0, "n-1", "n-3", True),
        (50.0, "n-0", "n-1", False),
    ]


@pytest.mark.parametrize("fmt", ["one", "csv"])
def test_a_host_named_two_ways_is_not_in_contact_with_itself(tmp_path: Path, fmt: str) -> None:
    # "0" and "n-0" are one host: the contacts table used to get n-0 - n-0 rows
    f = tmp_path / "t"
    rows = [("1", "n-1", "n-2", "up"), ("10", "0", "n-0", "up")]
    line = "{} CONN {} {} {}" if fmt == "one" else "{},{},{},{}"
    f.write_text("".join(line.format(*r) + "\n" for r in rows))
    with pytest.raises(TraceError, match=rf"^{f}:2: .*itself") as info:
        map_hosts(load_trace(f, fmt), ["n-0", "n-1", "n-2"], f)
    assert "'0'" in str(info.value) and "'n-0'" in str(info.value)


def test_an_unknown_trace_host_is_named_with_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("# two hosts\n1 CONN 0 1 up\n10 CONN 0 99 up\n")
    with pytest.raises(TraceError, match=rf"^{f}:3: trace host '99'"):
        map_hosts(load_trace(f, "one"), ["n-0", "n-1"], f)


def test_a_corrupt_gzip_trace_says_so(tmp_path: Path) -> None:
    # gzip.BadGzipFile is an OSError: it gave "cannot read: None"
    f = tmp_path / "fake.one.txt.gz"
    f.write_bytes(b"0 CONN 0 1 up\n")
    with pytest.raises(TraceError, match="not a readable gzip file") as info:
        load_trace(f, "one")
    assert "None" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("t.csv", "time,a,b,up\n1,0,1,up\n5,0,1,down\n"),
        ("t.txt", "1 CONN 0 1 up\n5 CONN 0 1 down\n"),
    ],
)
def test_a_trace_may_start_with_a_utf8_bom(tmp_path: Path, name: str, text: str) -> None:
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    plain = load_trace(f, "csv" if name.endswith("csv") else "one")
    f.write_text("\ufeff" + text, encoding="utf-8")
    assert load_trace(f, "csv" if name.endswith("csv") else "one") == plain
    assert len(plain) == 2


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("t.txt", "1 CONN 0 1 up\n\ufeff5 CONN 0 1 down\n", 2),
        ("t.txt", "1 CONN 0 1 up\n5 CONN 0\ufeff 1 down\n", 2),
        ("t.txt", "\ufeff1 CONN 0 1 up\n\ufeff5 CONN 0 1 down\n", 2),  # a second one
        ("t.txt", "# comment\n\ufeff\n1 CONN 0 1 up\n", 2),  # alone on its line
        ("t.csv", "time,a,b,up\n1,0,1,up\n\ufeff5,0,1,down\n", 3),
        ("t.csv", "\ufeff# header next\n\ufefftime,a,b,up\n1,0,1,up\n", 2),
        ("t.csv.gz", "time,a,b,up\n1,0,1,up\n\ufeff5,0,1,down\n", 3),
    ],
)
def test_a_utf8_bom_after_the_start_of_a_trace_is_an_error(
    tmp_path: Path, name: str, text: str, line: int
) -> None:
    # strip_comment dropped a BOM at the start of every line: a file pasted together from
    # two files (or a line edited by a Windows tool) passed as if the mark were not there
    import gzip

    f = tmp_path / name
    data = text.encode()
    f.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    fmt = "csv" if ".csv" in name else "one"
    with pytest.raises(TraceError) as info:
        load_trace(f, fmt)
    assert str(info.value) == (
        f"{f}:{line}: byte order mark (U+FEFF) is only allowed at the start of the file"
    )
    # in a comment it is no field: nothing to refuse
    c = tmp_path / "comment.txt"
    c.write_bytes(b"1 CONN 0 1 up # \xef\xbb\xbf\n")
    assert len(load_trace(c, "one")) == 1


def test_a_gzipped_trace_may_start_with_a_utf8_bom(tmp_path: Path) -> None:
    import gzip

    f = tmp_path / "t.one.txt.gz"
    f.write_bytes(gzip.compress("\ufeff1 CONN 0 1 up\n5 CONN 0 1 down\n".encode()))
    assert [(e.time, e.a, e.b, e.up) for e in load_trace(f, "one")] == [
        (1.0, "0", "1", True),
        (5.0, "0", "1", False),
    ]


@pytest.mark.parametrize("host", ["+1", "-1", "+0"])
def test_a_trace_host_number_has_no_sign(tmp_path: Path, host: str) -> None:
    # as in external-events files (test_sim_generators): +1 is no host 1 in either
    f = tmp_path / "t.txt"
    f.write_text(f"1 CONN 0 2 up\n2 CONN {host} 2 up\n")
    with pytest.raises(TraceError) as info:
        map_hosts(load_trace(f, "one"), ["n-0", "n-1", "n-2"], f)
    assert str(info.value) == (
        f"{f}:2: trace host {host!r} is not a scenario host nor an index below 3 "
        "(a host number has no sign)"
    )


def _gzipped_trace() -> bytes:
    import gzip

    return gzip.compress(("0 CONN 0 1 up\n10 CONN 1 2 up\n50 CONN 0 1 down\n" * 200).encode())


def _corrupt(data: bytes) -> bytes:
    """Two bytes flipped in the middle of the deflate data."""
    out = bytearray(data)
    out[len(data) // 2] ^= 0xFF
    out[len(data) // 2 + 1] ^= 0x55
    return bytes(out)


def _bad_crc(data: bytes) -> bytes:
    out = bytearray(data)
    out[-6] ^= 0xFF
    return bytes(out)


@pytest.mark.parametrize(
    "damage",
    [_corrupt, _bad_crc, lambda d: d[: len(d) // 2]],
    ids=["corrupt-deflate", "bad-crc", "truncated"],
)
def test_a_damaged_gzip_trace_is_a_trace_error(tmp_path: Path, damage: object) -> None:
    # a corrupt deflate stream raised zlib.error ("invalid distance too far back"), a traceback
    f = tmp_path / "t.txt.gz"
    f.write_bytes(damage(_gzipped_trace()))  # type: ignore[operator]
    with pytest.raises(TraceError, match=rf"^{f}: not a readable gzip file") as info:
        load_trace(f, "one")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "content", "expect"),
    [
        ("t.txt.gz", _corrupt(_gzipped_trace()), "not a readable gzip file"),
        ("t.txt.gz", _gzipped_trace()[:40], "not a readable gzip file"),
        ("t.txt", b"0 CONN 0 1 up\n5 CONN 0 1 sideways\n", r"t\.txt:2: state 'sideways'"),
        ("t.txt", b"0 CONN 0 1 up extra\n", r"t\.txt:1: expected"),
        ("t.txt", b"0 CONN 0 9 up\n", r"t\.txt:1: trace host '9' is not a scenario host"),
        ("t.csv", b"when,a,b,up\n0,0,1,up\n", r"t\.csv:1: CSV header"),
        ("t.txt", b"0 CONN 0 n-0 up\n", "itself"),
        ("t.txt", "0 CONN 0 1 up # caf\xe9\n".encode("latin-1"), "not a text file"),
    ],
    ids=[
        "corrupt-gz",
        "truncated-gz",
        "bad-state",
        "extra-field",
        "unknown-host",
        "bad-header",
        "self-contact",
        "latin1",
    ],
)
def test_validation_reads_the_trace_as_the_run_does(
    tmp_path: Path, name: str, content: bytes, expect: str
) -> None:
    """``dodwan-sim validate`` said OK for traces the run then refused (corrupt, truncated,
    malformed, naming unknown hosts): the scenario's validation now reads the trace."""
    (tmp_path / name).write_bytes(content)
    text = BASE + f'[contacts]\ntrace = "{name}"\n'
    with pytest.raises(ScenarioError) as info:
        loads(text, source=tmp_path / "s.toml")
    (problem,) = info.value.problems
    assert problem.key == "contacts.trace"
    assert re.search(expect, problem.message), problem.message


def test_validation_accepts_a_good_trace_by_name_or_index(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("1 CONN n-2 3 up\n2 CONN 0 1 up\n")
    sc = loads(BASE + '[contacts]\ntrace = "t.txt"\n', source=tmp_path / "s.toml")
    assert sc.contacts is not None and sc.contacts.path == tmp_path / "t.txt"


def test_validate_command_reports_a_broken_trace(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sim.cli import main

    (tmp_path / "t.txt.gz").write_bytes(_corrupt(_gzipped_trace()))
    f = tmp_path / "s.toml"
    f.write_text(BASE + '[contacts]\ntrace = "t.txt.gz"\n')
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 1 and "OK" not in res.output, res.output
    assert "contacts.trace" in res.output and "not a readable gzip file" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("time", ["1_0", "٣", "３", "1_0.5", "1e1_0", "0x10"])
@pytest.mark.parametrize("fmt", ["one", "csv"])
def test_a_trace_time_is_written_with_ascii_digits(tmp_path: Path, fmt: str, time: str) -> None:
    """``float`` reads ``1_0`` as 10 and other scripts' digits (``٣`` is 3): the
    external-events reader refused them, the trace reader took them; both use one check."""
    f = tmp_path / "t"
    line = f"{time} CONN 0 1 up\n" if fmt == "one" else f"time,a,b,up\n{time},0,1,up\n"
    f.write_text(f"0 CONN 0 1 up\n{line}" if fmt == "one" else line, encoding="utf-8")
    where = 2
    with pytest.raises(TraceError, match=rf"^{f}:{where}: time '{time}' is not a number"):
        load_trace(f, fmt)


@pytest.mark.parametrize(
    ("time", "value"), [("+5", 5.0), ("1e1", 10.0), ("5.", 5.0), (".5", 0.5), ("-0", 0.0)]
)
def test_trace_times_take_a_plus_sign_and_an_exponent_like_events_files(
    tmp_path: Path, time: str, value: float
) -> None:
    """What The ONE (Java's Double.parseDouble) and the external-events reader read."""
    f = tmp_path / "t.txt"
    f.write_text(f"{time} CONN 0 1 up\n")
    assert [e.time for e in load_trace(f, "one")] == [value]


def test_traces_and_events_files_share_one_number_check() -> None:
    from dodwan.units import is_plain_number
    from sim import contact_format, external_events

    assert contact_format.is_plain_number is is_plain_number
    assert external_events.is_plain_number is is_plain_number
