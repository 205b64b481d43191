"""Hostile and random input for joms.selector: only InvalidSelectorException, in bounded time."""

from __future__ import annotations

import math
import time
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joms import selector
from joms.errors import InvalidSelectorException
from joms.selector.like import LikePattern, LikeSyntaxError

TIME_LIMIT = 1.0  # seconds for one parse or one match; generous for a loaded machine

TOKENS = [
    *"abcxyz", "JMSPriority", "JMSType", "JMSDestination", "$x", "_y", "é",
    "NULL", "TRUE", "false", "NOT", "and", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE",
    "=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "(", ")", ",", "!=", "==", "!",
    "'x'", "'it''s'", "''", "'%_'", "'\\'", "'", "\"",
    "0", "1", "-1", "42L", "0x1F", "017", "08", "1.5", ".5", "7.", "1e3", "1e", "1e400", "2f",
    "9223372036854775807", "9223372036854775808", "0.0", "NaN",
    " ", "\t", "\n", "\v", "\x00", "\u00a0", "#", ".", ";",
]  # fmt: skip


def parse_quickly(text: str) -> selector.Selector | None:
    start = time.perf_counter()
    try:
        return selector.parse(text)
    except InvalidSelectorException as exc:
        assert str(exc)
        assert exc.position is None or 0 <= exc.position <= len(text)
        return None
    finally:
        assert time.perf_counter() - start < TIME_LIMIT, text[:80]


property_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=5),
    st.lists(st.integers(), max_size=2),
)
messages = st.dictionaries(
    st.sampled_from(["a", "b", "c", "x", "y", "z", "JMSPriority", "JMSType", "$x", "_y", "é"]),
    property_values,
)


def check_matching(sel: selector.Selector, props: dict[str, object]) -> None:
    start = time.perf_counter()
    assert sel.matches(props) in (True, False)
    assert time.perf_counter() - start < TIME_LIMIT
    negated = parse_quickly(f"NOT ({sel.text})") if sel.tree is not None else None
    if negated is not None:
        assert not (sel.matches(props) and negated.matches(props)), sel.text


@settings(max_examples=500, deadline=None)
@given(text=st.text(max_size=300))
def test_random_text_only_raises_invalid_selector(text: str) -> None:
    parse_quickly(text)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(st.sampled_from(TOKENS), max_size=40),
    separator=st.sampled_from([" ", ""]),
    props=messages,
)
def test_token_soup_parses_or_fails_cleanly_and_matches_without_raising(
    words: list[str], separator: str, props: dict[str, object]
) -> None:
    sel = parse_quickly(separator.join(words))
    if sel is not None:
        check_matching(sel, props)


@settings(max_examples=100, deadline=None)
@given(
    opening=st.lists(st.sampled_from(["(", "NOT ", "-", "+", "( NOT ", "(-"]), max_size=3000),
    middle=st.sampled_from(["a", "1", "a = 1", "'x'", ""]),
)
def test_deep_prefixes_never_escape_as_recursion_error(opening: list[str], middle: str) -> None:
    text = "".join(opening) + middle + ")" * sum(p.count("(") for p in opening)
    parse_quickly(text[: selector.MAX_LENGTH + 10])


# A grammar-driven generator reaches deeper into the parser than token soup does.

NUMERIC_LITERALS = ["0", "1", "-1", "42L", "0x1F", "017", "1.5", ".5", "7.", "1e3", "-57.9E2", "2f"]
IDENTIFIERS = ["a", "b", "x", "JMSPriority", "JMSTimestamp", "$x", "_y", "é"]


@st.composite
def arithmetic(draw: st.DrawFn, depth: int = 0) -> str:
    roll = draw(st.integers(0, 9))
    if depth >= 3 or roll < 5:
        return draw(st.sampled_from(NUMERIC_LITERALS + IDENTIFIERS))
    if roll < 8:
        op = draw(st.sampled_from(["+", "-", "*", "/"]))
        return f"{draw(arithmetic(depth + 1))} {op} {draw(arithmetic(depth + 1))}"
    return f"{draw(st.sampled_from(['-', '+', '']))}({draw(arithmetic(depth + 1))})"


@st.composite
def conditions(draw: st.DrawFn, depth: int = 0) -> str:
    roll = draw(st.integers(0, 12))
    ident = draw(st.sampled_from(IDENTIFIERS))
    neg = draw(st.sampled_from(["", "NOT "]))
    if depth >= 3 or roll < 7:
        return draw(
            st.sampled_from(
                [
                    f"{draw(arithmetic())} {draw(st.sampled_from(['=', '<>', '<', '<=', '>', '>=']))} "
                    f"{draw(arithmetic())}",
                    f"{ident} {draw(st.sampled_from(['=', '<>']))} 'x'",
                    f"{draw(arithmetic())} {neg}BETWEEN {draw(arithmetic())} AND {draw(arithmetic())}",
                    f"{ident} {neg}IN ('x', 'it''s', '')",
                    f"{ident} {neg}LIKE '{draw(st.text(alphabet='ab%_!', max_size=5))}' ESCAPE '!'",
                    f"{ident} {neg}LIKE '%{draw(st.text(alphabet='ab_', max_size=3))}'",
                    f"{ident} IS {neg}NULL",
                    ident,
                    draw(st.sampled_from(["TRUE", "FALSE"])),
                ]
            )
        )
    if roll < 11:
        op = " AND " if roll < 9 else " OR "
        return op.join(f"({draw(conditions(depth + 1))})" for _ in range(draw(st.integers(2, 3))))
    return f"NOT ({draw(conditions(depth + 1))})"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=conditions(), props=messages, cut=st.integers(0, 200), drop=st.integers(0, 5))
def test_grammar_generated_and_mutated_selectors(
    text: str, props: dict[str, object], cut: int, drop: int
) -> None:
    for candidate in (text, text[:cut] + text[cut + drop :]):
        sel = parse_quickly(candidate)
        if candidate == text:
            assert sel is not None or "ESCAPE" in text  # a random LIKE may end with '!'
        if sel is not None:
            check_matching(sel, props)


@pytest.mark.parametrize(
    "text",
    [
        "(" * 5000,
        ")" * 5000,
        "NOT " * 1024,
        "-" * 4096,
        "a = " + "'" * 4000,
        "a IN (" + "'x', " * 800 + "'y')",
        "a LIKE '" + "%_" * 2000 + "'",
        "a" * 4096 + " = 1",
        "1" * 4000 + " = a",
        "a = 1 " + "AND b = 2 " * 400,
        "a + " * 1000 + "1 = 1",
        "0x" + "F" * 4000 + " = a",
        "1." + "0" * 4000 + "1 = a",
        "1e" + "9" * 4000 + " = a",
    ],
)
def test_hostile_selectors(text: str) -> None:
    sel = parse_quickly(text)
    if sel is not None:
        check_matching(sel, {"a": "x" * 10_000, "b": 2})


# -- LIKE against a reference implementation ---------------------------------------------


def reference_like(pattern: str, escape: str | None, value: str) -> bool:
    """Textbook dynamic programming over (pattern element, value position)."""
    elements: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == escape:
            elements.append(("lit", pattern[i + 1]))
            i += 2
        else:
            ch = pattern[i]
            elements.append(("any" if ch == "%" else "one" if ch == "_" else "lit", ch))
            i += 1

    @cache
    def match(e: int, v: int) -> bool:
        if e == len(elements):
            return v == len(value)
        kind, ch = elements[e]
        if kind == "any":
            return match(e + 1, v) or (v < len(value) and match(e, v + 1))
        if v == len(value):
            return False
        return (kind == "one" or value[v] == ch) and match(e + 1, v + 1)

    return match(0, 0)


@settings(max_examples=1500, deadline=None)
@given(
    pattern=st.text(alphabet="ab%_!", max_size=8),
    value=st.text(alphabet="ab%_!\n", max_size=8),
    escape=st.sampled_from([None, "!", "%", "_", "a"]),
)
def test_like_agrees_with_reference(pattern: str, value: str, escape: str | None) -> None:
    try:
        like = LikePattern.parse(pattern, escape)
    except LikeSyntaxError:
        i = pattern.index(escape) if escape else -1
        assert escape is not None and i >= 0  # only a bad escape sequence is an error
        return
    assert like.matches(value) == reference_like(pattern, escape, value), (pattern, value)


# -- semantic identities -----------------------------------------------------------------

NUMBERS = st.one_of(st.none(), st.integers(-3, 3), st.floats(-3, 3), st.just(math.nan))
number_props = st.fixed_dictionaries({"x": NUMBERS, "lo": NUMBERS, "hi": NUMBERS})


def truth(text: str, props: dict[str, object]) -> bool | None:
    if selector.parse(text).matches(props):
        return True
    return False if selector.parse(f"NOT ({text})").matches(props) else None


@settings(max_examples=400, deadline=None)
@given(props=number_props)
def test_between_is_its_spec_expansion(props: dict[str, object]) -> None:
    assert truth("x BETWEEN lo AND hi", props) == truth("x >= lo AND x <= hi", props)
    assert truth("x NOT BETWEEN lo AND hi", props) == truth("x < lo OR x > hi", props)


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.none(), st.sampled_from(["a", "b", "c"]), st.integers(0, 1)))
def test_in_is_a_disjunction_of_equalities(value: object) -> None:
    props = {"s": value}
    assert truth("s IN ('a', 'b')", props) == truth("s = 'a' OR s = 'b'", props)
    assert truth("s NOT IN ('a', 'b')", props) == truth("NOT (s = 'a' OR s = 'b')", props)


TRUTHS = st.sampled_from([True, False, None])


@settings(max_examples=200, deadline=None)
@given(p=TRUTHS, q=TRUTHS, r=TRUTHS)
def test_de_morgan_and_distribution_hold_in_three_valued_logic(
    p: bool | None, q: bool | None, r: bool | None
) -> None:
    props = {name: v for name, v in (("p", p), ("q", q), ("r", r)) if v is not None}
    assert truth("NOT (p AND q)", props) == truth("NOT p OR NOT q", props)
    assert truth("NOT (p OR q)", props) == truth("NOT p AND NOT q", props)
    assert truth("p AND (q OR r)", props) == truth("(p AND q) OR (p AND r)", props)
    assert truth("p OR q AND r", props) == truth("p OR (q AND r)", props)
