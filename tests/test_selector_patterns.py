"""Selector.network_patterns: DoDWAN patterns that are a necessary condition of a selector."""

from __future__ import annotations

import string

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from joms import selector
from joms.selector.like import LikePattern
from joms.selector.patterns import like_regex, re2_escape

MAPPED = {"a": "p.a", "b": "p.b", "JMSType": "type"}


def attribute(name: str) -> str | None:
    return MAPPED.get(name)


def patterns(text: str, **limits: int) -> list[dict[str, str]] | None:
    return selector.parse(text).network_patterns(attribute, **limits)


def descriptor(props: dict[str, object]) -> dict[str, str]:
    """What the network sees: mapped string properties under their attributes."""
    return {MAPPED[k]: v for k, v in props.items() if k in MAPPED and isinstance(v, str)}


def network_accepts(found: list[dict[str, str]] | None, props: dict[str, object]) -> bool:
    if found is None:
        return True
    desc = descriptor(props)
    return any(
        all(attr in desc and re2.fullmatch(rx, desc[attr]) for attr, rx in spec.items())
        for spec in found
    )


# -- examples ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a = 'x'", [{"p.a": "x"}]),
        ("'x' = a", [{"p.a": "x"}]),
        ("JMSType = 'order'", [{"type": "order"}]),
        ("a IN ('x', 'y')", [{"p.a": "(?:x|y)"}]),
        ("a LIKE 'x%'", [{"p.a": "(?s)x.*"}]),
        ("a LIKE 'x_y'", [{"p.a": "(?s)x.y"}]),
        ("a LIKE '%'", [{"p.a": "(?s).*"}]),
        ("a LIKE 'exact'", [{"p.a": "exact"}]),
        ("a LIKE '\\_%' ESCAPE '\\'", [{"p.a": "(?s)\\_.*"}]),
        ("a LIKE '100!%' ESCAPE '!'", [{"p.a": "100\\%"}]),
        ("a = 'x' AND b = 'y'", [{"p.a": "x", "p.b": "y"}]),
        ("a = 'x' OR b = 'y'", [{"p.a": "x"}, {"p.b": "y"}]),
        ("a = 'x' OR a = 'y' OR a IN ('z')", [{"p.a": "(?:x|y|z)"}]),
        ("(a = 'x' OR a = 'y') AND b = 'z'", [{"p.a": "(?:x|y)", "p.b": "z"}]),
        (
            "a = 'x' AND (b = 'y' OR b LIKE 'z%')",
            [{"p.a": "x", "p.b": "y"}, {"p.a": "x", "p.b": "(?s)z.*"}],
        ),
        ("a = 'x' OR (a = 'x' AND b = 'y')", [{"p.a": "x"}]),  # absorbed
        ("(a = 'x' AND b = 'y') OR a = 'x'", [{"p.a": "x"}]),
        ("a IN ('x', 'y', 'z') AND a IN ('y', 'z', 'w')", [{"p.a": "(?:y|z)"}]),
        ("a IN ('xa', 'ya', 'xb') AND a LIKE 'x%'", [{"p.a": "(?:xa|xb)"}]),
        ("a LIKE 'x%' AND a LIKE '%yz'", [{"p.a": "(?s).*yz"}]),  # most literal characters
        ("a = 'x' AND JMSPriority > 4", [{"p.a": "x"}]),
        ("a = 'x' AND c = 'unmapped'", [{"p.a": "x"}]),
        ("a = 'x' AND NOT b = 'y'", [{"p.a": "x"}]),
        ("a = 'x' AND b <> 'y'", [{"p.a": "x"}]),
        ("a = 'x' AND b NOT IN ('y')", [{"p.a": "x"}]),
        ("a = 'x' AND b NOT LIKE 'y%'", [{"p.a": "x"}]),
        ("a = 'x' AND b IS NOT NULL", [{"p.a": "x"}]),
        ("a = 'x' AND TRUE", [{"p.a": "x"}]),
        ("a = 'x' OR FALSE", [{"p.a": "x"}]),
        ("a = 'x.y*'", [{"p.a": "x\\.y\\*"}]),
        ("a = 'it''s'", [{"p.a": "it\\'s"}]),
    ],
)
def test_extracted_patterns(text: str, expected: list[dict[str, str]]) -> None:
    assert patterns(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "JMSPriority > 4",
        "c = 'unmapped'",
        "NOT a = 'x'",
        "NOT (a = 'x' AND b = 'y')",
        "a <> 'x'",
        "a = 'x' OR b > 1",
        "a = 'x' OR c = 'y'",
        "a IS NULL",
        "a = b",
        "flag",
        "TRUE",
        "a = 'x' OR NOT a = 'x'",
    ],
)
def test_nothing_useful_gives_none(text: str) -> None:
    assert patterns(text) is None


@pytest.mark.parametrize(
    "text", ["FALSE", "a = 'x' AND a = 'y'", "a IN ('x') AND a LIKE 'y%'", "a = 'x' AND FALSE"]
)
def test_unsatisfiable_selector_gives_no_pattern(text: str) -> None:
    assert patterns(text) == []


def test_too_many_disjuncts_gives_none() -> None:
    many = " OR ".join(f"(a = '{i}' AND b = '{i}')" for i in range(17))
    assert patterns(many) is None
    assert len(patterns(many, max_disjuncts=17) or []) == 17
    assert len(patterns(" OR ".join(f"(a = '{i}' AND b = '{i}')" for i in range(16))) or []) == 16


def test_same_attribute_alternatives_merge_instead_of_counting() -> None:
    many = " OR ".join(f"a = '{i}'" for i in range(40))
    assert patterns(many) == [{"p.a": "(?:" + "|".join(sorted(str(i) for i in range(40))) + ")"}]
    many = " OR ".join(f"a = '{i}'" for i in range(100))
    assert patterns(many) is None  # the alternation is over max_regex_length
    assert len(patterns(many, max_regex_length=1000) or []) == 1


def test_and_factor_that_would_overflow_is_dropped() -> None:
    four = "(a = '1' OR b = '1' OR a = '2' AND b = '2' OR a = '3' AND b = '3')"
    text = f"JMSType = 't' AND {four} AND {four}"  # 4 x 4 = 16 disjuncts > 4
    found = patterns(text, max_disjuncts=4)
    assert found is not None and len(found) == 4
    assert all(spec["type"] == "t" for spec in found)


def test_long_expressions_and_many_attributes_are_dropped() -> None:
    long_value = "v" * 300
    assert patterns(f"a = '{long_value}' AND b = 'y'") == [{"p.b": "y"}]
    assert patterns(f"a = '{long_value}'") is None
    assert patterns(f"a = '{long_value}'", max_regex_length=400) == [{"p.a": long_value}]
    assert patterns("a = 'x' AND b = 'y' AND JMSType = 't'", max_attributes=2) == [
        {"p.a": "x", "p.b": "y"}
    ]


def test_unencodable_strings_are_left_to_local_evaluation() -> None:
    assert patterns("a = '\udc80' AND b = 'y'") == [{"p.b": "y"}]


def test_attribute_callback_is_consulted_per_property() -> None:
    seen: list[str] = []

    def spy(name: str) -> str | None:
        seen.append(name)
        return None

    assert selector.parse("a = 'x' AND (b IN ('y') OR c LIKE 'z%')").network_patterns(spy) is None
    assert seen[:2] == ["a", "b"]  # once b is unmapped the OR is TRUE: c needs no look-up


# -- escaping ---------------------------------------------------------------------------

AWKWARD = [
    string.punctuation,
    "".join(chr(i) for i in range(32)) + "\x7f",
    "tab\there\nnew line",
    "unicode é ✓ 𝄞 \u200b \u2028",
    "back\\slash \\Q \\E \\x{41} $1",
    "(?i)X",
    "",
]


@pytest.mark.parametrize("value", AWKWARD)
def test_re2_escape_matches_exactly_the_value(value: str) -> None:
    rx = re2_escape(value)
    assert re2.fullmatch(rx, value)
    assert not re2.fullmatch(rx, value + "x")
    if value:
        assert not re2.fullmatch(rx, value[:-1])
        assert not re2.fullmatch(rx, value.upper() + "!") or value.upper() + "!" == value


@pytest.mark.parametrize("value", AWKWARD)
def test_value_sets_and_like_patterns_are_valid_re2(value: str) -> None:
    quoted = value.replace("'", "''")
    for text in (f"a = '{quoted}'", f"a IN ('{quoted}', 'other')", f"a LIKE '%{quoted}_'"):
        found = patterns(text)
        assert found is not None
        assert re2.fullmatch(found[0]["p.a"], value if "LIKE" not in text else value + "\n")


def test_like_regex_dot_matches_newlines() -> None:
    rx = like_regex(LikePattern.parse("a_b%"))
    assert rx == "(?s)a.b.*"
    assert re2.fullmatch(rx, "a\nb\n\n")


# -- properties ---------------------------------------------------------------------------

AWKWARD_CHARS = "ab%_!'.*+?()[]{}|^$\\\n\t \x00\u00e9\u2028"


def quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def like_source(elements: list[str], escape: bool) -> str:
    """A quoted LIKE pattern: "%"/"_" elements are wildcards, ("lit", c) literal characters."""
    out = []
    for element in elements:
        if element in ("%", "_"):
            out.append(element)
        else:
            ch = element[-1]
            out.append(("!" + ch) if escape and ch in "%_!" else ("x" if ch in "%_" else ch))
    return quote("".join(out)) + (" ESCAPE '!'" if escape else "")


like_elements = st.lists(
    st.one_of(st.sampled_from(["%", "_"]), st.sampled_from(AWKWARD_CHARS).map(lambda c: "lit" + c)),
    max_size=6,
)
awkward_strings = st.text(alphabet=AWKWARD_CHARS, max_size=6)


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(["=", "IN", "LIKE"]),
    literals=st.lists(awkward_strings, min_size=1, max_size=3),
    elements=like_elements,
    escape=st.booleans(),
    value=awkward_strings,
)
def test_single_string_tests_are_translated_exactly(
    kind: str, literals: list[str], elements: list[str], escape: bool, value: str
) -> None:
    """For one string test the pattern is not just necessary but exact, whatever the characters."""
    if kind == "=":
        text = f"a = {quote(literals[0])}"
    elif kind == "IN":
        text = f"a IN ({', '.join(map(quote, literals))})"
    else:
        text = f"a LIKE {like_source(elements, escape)}"
    found = patterns(text, max_regex_length=10_000)
    assert found is not None and len(found) == 1 and list(found[0]) == ["p.a"]
    rx = found[0]["p.a"]
    for candidate in (value, *literals):
        wanted = selector.parse(text).matches({"a": candidate})
        assert bool(re2.fullmatch(rx, candidate)) == wanted, (text, rx, candidate)


# Necessity on combinations: selectors over a small universe of messages, each checked
# against every message of the universe, so that satisfiable selectors always get tested.

STRINGS = ["", "a", "b", "ab", "a%", "_\n"]
UNIVERSE = [
    {"a": a, "b": b, "c": c, "JMSType": t, "n": 3, "flag": True}
    for a in [None, 1, *STRINGS]
    for b in [None, True, *STRINGS]
    for c in [None, "a"]
    for t in [None, "a", "b"]
]


@st.composite
def string_atom(draw: st.DrawFn, name: str) -> str:
    value = quote(draw(st.sampled_from(STRINGS)))
    negation = "NOT " if draw(st.integers(0, 3)) == 3 else ""
    roll = draw(st.integers(0, 9))
    if roll < 3:
        return f"{name} = {value}" if roll < 2 else f"{value} = {name}"
    if roll < 6:
        values = draw(st.lists(st.sampled_from(STRINGS), min_size=1, max_size=3))
        return f"{name} {negation}IN ({', '.join(map(quote, values))})"
    if roll < 9:
        elements = draw(
            st.lists(st.sampled_from(["%", "_", "lita", "litb", "lit%", "lit\n"]), max_size=3)
        )
        return f"{name} {negation}LIKE {like_source(elements, draw(st.booleans()))}"
    return draw(st.sampled_from([f"{name} <> {value}", f"{name} IS NULL", f"{name} IS NOT NULL"]))


@st.composite
def selectors(draw: st.DrawFn, depth: int = 0) -> str:
    """Mostly string tests on mapped properties, combined by AND, OR and sometimes NOT."""
    roll = draw(st.integers(0, 9))
    if depth >= 3 or roll < 4:
        kind = draw(st.integers(0, 9))
        if kind < 8:
            return draw(string_atom(draw(st.sampled_from(["a", "b", "JMSType", "c"]))))
        return draw(
            st.sampled_from(["n > 2", "n < 2", "flag", "TRUE", "FALSE", "a = b", "n / 0 = 1"])
        )
    if roll == 9:
        return f"NOT ({draw(selectors(depth + 1))})"
    operands = draw(st.lists(selectors(depth + 1), min_size=2, max_size=3))
    return (" AND " if roll < 7 else " OR ").join(f"({x})" for x in operands)


LIMITS = [{}, {}, {}, {"max_disjuncts": 2}, {"max_regex_length": 12}, {"max_attributes": 1}]


@settings(max_examples=300, deadline=None)
@given(text=selectors(), limits=st.sampled_from(LIMITS))
def test_patterns_are_a_necessary_condition(text: str, limits: dict[str, int]) -> None:
    sel = selector.parse(text)
    found = sel.network_patterns(attribute, **limits)
    if found is not None:
        assert len(found) <= limits.get("max_disjuncts", 16)
        for spec in found:
            assert spec and len(spec) <= limits.get("max_attributes", 16)
            for rx in spec.values():
                re2.compile(rx)
                assert len(rx) <= limits.get("max_regex_length", 256)
    for props in UNIVERSE:
        if sel.matches(props):
            assert network_accepts(found, props), (text, props, found)
