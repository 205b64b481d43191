"""Hostile scenario files: whatever the text, the loader raises only ScenarioError.

(The wire decoder, the STOMP parser and the selector parser are fuzzed in
test_core_wire.py, test_stomp_frame.py and test_selector_fuzz.py; longer coverage-guided
runs are bench/fuzz_wire.py and bench/fuzz_stomp.py, smoke-tested here for a second.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.scenario import ScenarioError, loads

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [(p.read_text(), p) for p in sorted((ROOT / "scenarios").glob("*.toml"))]

_scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(v), repr(v))
    if isinstance(v, str):
        return '"' + v.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f'"{k.encode("unicode_escape").decode()}" = {_toml_value(x)}'
                           for k, x in v.items()) + "}"  # fmt: skip


def _load(text: str, source: Path) -> None:
    try:
        loads(text, source)
    except ScenarioError as exc:
        assert exc.problems  # every refusal says what is wrong
        assert str(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(EXAMPLES), st.data())
def test_mutated_example_scenarios_raise_only_scenario_error(
    example: tuple[str, Path], data: st.DataObject
) -> None:
    text, source = example
    lines = text.splitlines()
    keyed = [i for i, x in enumerate(lines) if "=" in x and not x.lstrip().startswith("#")]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.sampled_from(keyed))
        key = lines[i].split("=", 1)[0]
        lines[i] = f"{key}= {_toml_value(data.draw(_values))}"
    _load("\n".join(lines), source)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(EXAMPLES), st.integers(0, 10_000), st.binary(max_size=20))
def test_cut_and_spliced_scenarios_raise_only_scenario_error(
    example: tuple[str, Path], cut: int, junk: bytes
) -> None:
    text, source = example
    raw = text.encode()
    cut %= len(raw) + 1
    _load((raw[:cut] + junk + raw[cut:]).decode("utf-8", errors="replace"), source)


@pytest.mark.parametrize("harness", ["fuzz_wire", "fuzz_stomp"])
def test_the_bench_fuzz_harnesses_run_and_find_nothing(harness: str, tmp_path: Path) -> None:
    """A one-second run of the fallback loop keeps the longer harnesses from rotting."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{harness}.py"), "--no-atheris",
         "--seconds", "1", "--crash-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no finding" in r.stdout and " 0 inputs" not in r.stdout
    assert list(tmp_path.iterdir()) == []  # no failing input written


def test_the_examples_load() -> None:
    assert EXAMPLES
    for text, source in EXAMPLES:
        loads(text, source)
