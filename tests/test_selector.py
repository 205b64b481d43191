"""Conformance of joms.selector with the JMS 1.1 message selector language (§3.8.1)."""

from __future__ import annotations

import pickle
import sys
import time

import pytest

import joms
from joms import selector
from joms.errors import InvalidSelectorException, JMSException

T, F, U = True, False, None  # SQL truth values; U is UNKNOWN


def matches(text: str, **props: object) -> bool:
    return selector.parse(text).matches(props)


def truth(condition: str, **props: object) -> bool | None:
    """The three-valued result of ``condition``: TRUE matches, FALSE matches under NOT."""
    if matches(condition, **props):
        return T
    return F if matches(f"NOT ({condition})", **props) else U


def rejects(text: str) -> InvalidSelectorException:
    with pytest.raises(InvalidSelectorException) as info:
        selector.parse(text)
    return info.value


# -- API --------------------------------------------------------------------------------


def test_public_api_example() -> None:
    sel = selector.parse("language IN ('English','French') AND JMSPriority > 4")
    assert sel.text == "language IN ('English','French') AND JMSPriority > 4"
    assert sel.matches({"language": "English", "JMSPriority": 7}) is True
    assert sel.matches({"language": "English", "JMSPriority": 4}) is False
    assert sel.matches({"language": "German", "JMSPriority": 7}) is False
    assert sel.matches({}) is False


@pytest.mark.parametrize("text", [None, "", "   ", " \t\r\n\f"])
def test_no_selector_matches_everything(text: str | None) -> None:
    sel = selector.parse(text)
    assert sel.text == (text or "")
    assert sel.matches({}) and sel.matches({"a": 1})
    assert sel.network_patterns(lambda name: name) is None


def test_non_string_selector_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        selector.parse(b"a = 1")  # type: ignore[arg-type]


def test_selectors_compare_by_text() -> None:
    assert selector.parse("a = 1") == selector.parse("a = 1")
    assert selector.parse("a = 1") != selector.parse("a=1")
    assert len({selector.parse("a = 1"), selector.parse("a = 1")}) == 1
    assert repr(selector.parse("a = 1")) == "Selector('a = 1')"


def test_properties_may_be_any_mapping() -> None:
    from types import MappingProxyType

    assert selector.parse("a = 1").matches(MappingProxyType({"a": 1}))


EXCEPTIONS = [
    "IllegalStateException",
    "InvalidClientIDException",
    "InvalidDestinationException",
    "InvalidSelectorException",
    "JMSSecurityException",
    "MessageEOFException",
    "MessageFormatException",
    "MessageNotReadableException",
    "MessageNotWriteableException",
    "ResourceAllocationException",
    "TransactionInProgressException",
    "TransactionRolledBackException",
]


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_exception_hierarchy(name: str) -> None:
    cls = getattr(joms, name)
    assert issubclass(cls, JMSException) and issubclass(JMSException, Exception)
    exc = cls("went wrong", "E42")
    assert str(exc) == "went wrong" and exc.reason == "went wrong" and exc.error_code == "E42"
    assert cls("no code").error_code is None
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is cls and str(copy) == "went wrong" and copy.error_code == "E42"


def test_invalid_selector_exception_carries_position() -> None:
    exc = rejects("a = = 1")
    assert exc.position == 4
    assert pickle.loads(pickle.dumps(exc)).position == 4


# -- literals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'literal'", "literal"),
        ("'literal''s'", "literal's"),
        ("''''", "'"),
        ("''", ""),
        ("'héllo wörld ✓ 𝄞'", "héllo wörld ✓ 𝄞"),
        ("'a\\nb'", "a\\nb"),  # no backslash escapes in SQL strings
        ("'line\nbreak'", "line\nbreak"),
    ],
)
def test_string_literals(text: str, value: str) -> None:
    assert matches(f"s = {text}", s=value)
    assert not matches(f"s = {text}", s=value + "x")


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("57", 57),
        ("-957", -957),
        ("+62", 62),
        ("0", 0),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("42L", 42),
        ("42l", 42),
        ("0x1F", 31),
        ("0X1f", 31),
        ("017", 15),
        ("00", 0),
        ("0x7FFFFFFFFFFFFFFF", 2**63 - 1),
    ],
)
def test_exact_numeric_literals(literal: str, value: int) -> None:
    assert matches(f"n = {literal}", n=value)
    assert not matches(f"n = {literal}", n=value - 1)


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("7E3", 7000.0),
        ("7e3", 7000.0),
        ("-57.9E2", -5790.0),
        ("7.", 7.0),
        ("-95.7", -95.7),
        ("+6.2", 6.2),
        (".5", 0.5),
        ("1e-3", 0.001),
        ("1E+3", 1000.0),
        ("1.e2", 100.0),
        ("2d", 2.0),
        ("2.5D", 2.5),
        ("1.5f", 1.5),
        ("0.1f", 0.10000000149011612),  # a Java float, widened to double
        ("08.5", 8.5),
        ("1.7976931348623157E308", 1.7976931348623157e308),
        ("4.9E-324", 5e-324),
    ],
)
def test_approximate_numeric_literals(literal: str, value: float) -> None:
    assert matches(f"x = {literal}", x=value)


@pytest.mark.parametrize("literal", ["TRUE", "true", "True", "tRuE"])
def test_boolean_literals_are_case_insensitive(literal: str) -> None:
    assert matches(f"b = {literal}", b=True)
    assert not matches(f"b = {literal}", b=False)
    assert matches(literal)
    assert not matches(literal.replace("r", "").replace("R", "").replace("u", "als"))  # false


def test_boolean_constants_as_selectors() -> None:
    assert matches("TRUE") and not matches("FALSE") and matches("NOT FALSE")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n = 9223372036854775808", "out of the range of a Java long"),
        ("n = 0x8000000000000000", "out of the range of a Java long"),
        ("n = 99999999999999999999", "out of the range of a Java long"),
        ("x = 1e400", "out of range"),
        ("x = 1e39f", "out of range"),
        ("x = 1e-400", "too small"),
        ("n = 08", "octal"),
        ("n = 0x", "hexadecimal"),
        ("x = 1e", "exponent"),
        ("x = 1e+", "exponent"),
        ("n = 123abc", "malformed number"),
        ("n = 1L2", "malformed number"),
        ("x = 1.2.3", "malformed number"),
    ],
)
def test_bad_numeric_literals(text: str, message: str) -> None:
    exc = rejects(text)
    assert message in str(exc) and exc.position == 4


def test_long_min_is_only_valid_negated() -> None:
    assert matches("n = -9223372036854775808", n=-(2**63))
    for text in ("n = -(9223372036854775808)", "n = +9223372036854775808"):
        assert "out of the range of a Java long" in str(rejects(text))


# -- identifiers ------------------------------------------------------------------------


def test_identifiers_are_case_sensitive() -> None:
    assert matches("Color = 'red'", Color="red")
    assert not matches("color = 'red'", Color="red")


@pytest.mark.parametrize("name", ["_x", "$price", "a1", "naïve", "日本", "x_y$z", "ĳ", "α2β"])
def test_java_identifiers(name: str) -> None:
    assert matches(f"{name} = 1", **{name: 1})


@pytest.mark.parametrize("text", ["1abc = 1", "a.b = 1", "#x = 1", "@x = 1", "a\\b = 1"])
def test_invalid_identifiers(text: str) -> None:
    rejects(text)


RESERVED = ["NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"]


@pytest.mark.parametrize("word", RESERVED + [w.lower() for w in RESERVED] + ["Escape", "Null"])
def test_reserved_words_are_not_identifiers(word: str) -> None:
    forms = [f"{word} IS NULL", f"{word} LIKE 'x'", f"a = 1 AND {word} IN ('x')"]
    if word.upper() not in ("TRUE", "FALSE"):  # TRUE = 'x' is a valid (false) comparison
        forms += [f"{word} = 'x'", f"a = 1 AND {word} = 2"]
    for text in forms:
        exc = rejects(text)
        assert exc.position is not None


def test_words_containing_reserved_words_are_identifiers() -> None:
    assert matches("NULLS = 1 AND Origin = 2 AND isx = 3 AND notes = 4 AND ANDY = 5",
                   NULLS=1, Origin=2, isx=3, notes=4, ANDY=5)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value", "literal"),
    [
        ("JMSPriority", 7, "7"),
        ("JMSTimestamp", 1_700_000_000_000, "1700000000000"),
        ("JMSMessageID", "ID:42", "'ID:42'"),
        ("JMSCorrelationID", "corr", "'corr'"),
        ("JMSType", "order", "'order'"),
        ("JMSDeliveryMode", "PERSISTENT", "'PERSISTENT'"),
        ("JMSDeliveryMode", "NON_PERSISTENT", "'NON_PERSISTENT'"),
        ("JMSXGroupID", "g1", "'g1'"),
        ("JMS_acme_flag", "on", "'on'"),
    ],
)
def test_header_fields_and_jms_properties(name: str, value: object, literal: str) -> None:
    assert matches(f"{name} = {literal}", **{name: value})
    assert truth(f"{name} = {literal}") is U  # absent (or None) header value is NULL
    assert matches(f"{name} IS NULL", **{name: None})


def test_delivery_mode_accepts_the_javax_jms_constants() -> None:
    assert matches("JMSDeliveryMode = 'PERSISTENT'", JMSDeliveryMode=2)
    assert matches("JMSDeliveryMode = 'NON_PERSISTENT'", JMSDeliveryMode=1)
    assert not matches("JMSDeliveryMode = 'PERSISTENT'", JMSDeliveryMode=1)


@pytest.mark.parametrize(
    "name",
    ["JMSDestination", "JMSReplyTo", "JMSExpiration", "JMSRedelivered", "JMSDeliveryTime", "JMSx"],
)
def test_other_header_fields_are_rejected(name: str) -> None:
    exc = rejects(f"a = 1 AND {name} IS NULL")
    assert name in str(exc) and exc.position == 10


def test_java_whitespace_only() -> None:
    assert matches("a\t=\n1\r\nAND\fb = 2", a=1, b=2)
    for space in ("\v", "\u00a0", "\u2003"):
        assert "unexpected character" in str(rejects(f"a{space}= 1"))


# -- comparisons ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "expected"),
    [("=", (F, T, F)), ("<>", (T, F, T)), ("<", (T, F, F)), ("<=", (T, T, F)),
     (">", (F, F, T)), (">=", (F, T, T))],
)  # fmt: skip
def test_numeric_comparisons(op: str, expected: tuple[bool, bool, bool]) -> None:
    for value, want in zip((1, 2, 3), expected, strict=True):
        assert truth(f"n {op} 2", n=value) is want
        assert truth(f"x {op} 2.0", x=float(value)) is want
        assert truth(f"n {op} 2.0", n=value) is want  # long promoted to double
        assert truth(f"x {op} 2", x=float(value)) is want


def test_numeric_promotion() -> None:
    assert matches("1 = 1.0") and matches("n = 1.0", n=1) and matches("x = 1", x=1.0)
    assert matches("n > 0.5", n=1) and matches("n < 1.5", n=1)
    # Java compares long with double after converting the long to double:
    assert matches("n = 9007199254740992.0", n=2**53 + 1)
    assert not matches("n = 9007199254740992", n=2**53 + 1)


def test_strings_and_booleans_compare_with_equality_only() -> None:
    assert matches("s = 'abc'", s="abc") and matches("s <> 'abd'", s="abc")
    assert matches("b = TRUE", b=True) and matches("b <> FALSE", b=True)
    assert matches("s = t", s="x", t="x") and matches("b = c", b=False, c=False)
    for op in ("<", "<=", ">", ">="):
        assert truth(f"s {op} t", s="a", t="b") is U  # properties: known only at run time
        assert truth(f"b {op} c", b=False, c=True) is U
        assert "only support = and <>" in str(rejects(f"s {op} 'a'"))
        assert "only support = and <>" in str(rejects(f"TRUE {op} b"))


@pytest.mark.parametrize(
    ("a", "b"),
    [(1, "1"), ("1", 1), (True, 1), (1, True), ("true", True), (1.0, "1.0"), (0, False)],
)
def test_comparing_different_types_is_false(a: object, b: object) -> None:
    # JMS 1.1 §3.8.1.2: "comparison of values of different types is false"
    assert truth("a = b", a=a, b=b) is F
    assert truth("a <> b", a=a, b=b) is F
    assert truth("NOT a = b", a=a, b=b) is T


def test_int_property_against_string_literal_is_false() -> None:
    assert truth("NumberOfOrders > 1", NumberOfOrders="2") is F
    assert truth("n = '1'", n=1) is F
    assert truth("s = 1", s="1") is F


def test_mismatched_types_under_not_select_the_message() -> None:
    # the case: string properties A and B
    assert matches("NOT A = 17 OR B = 5.6", A="x", B="y")


@pytest.mark.parametrize("text", ["1 = 'a'", "'a' <> 1", "TRUE = 1", "'x' = FALSE", "(a = 1) = 2",
                                  "'hello' = 19.0"])  # fmt: skip
def test_comparing_literals_of_different_types_is_valid_and_false(text: str) -> None:
    assert truth(text, a=1) is F


def test_comparison_with_null_is_unknown() -> None:
    for op in ("=", "<>", "<", "<=", ">", ">="):
        assert truth(f"n {op} 1") is U
        assert truth(f"1 {op} n", n=None) is U
        assert truth(f"n {op} m", n=1) is U


def test_nan_compares_like_java() -> None:
    nan = float("nan")
    assert truth("x = x", x=nan) is F
    assert truth("x <> x", x=nan) is T
    assert truth("x < 1", x=nan) is F and truth("x >= 1", x=nan) is F


def test_boolean_property_as_condition() -> None:
    assert matches("flag", flag=True) and not matches("flag", flag=False)
    assert truth("flag") is U
    assert truth("flag", flag="yes") is U and truth("flag", flag=1) is U
    assert matches("NOT flag", flag=False)


# -- arithmetic -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "2 + 3 * 4 = 14",
        "(2 + 3) * 4 = 20",
        "10 - 2 - 3 = 5",
        "100 / 10 / 5 = 2",
        "2 * 3 / 4 = 1",
        "-2 * 3 + 4 = -2",
        "- -5 = 5",
        "-(2 + 3) = -5",
        "+(2) = 2",
        "7 / 2 = 3",
        "-7 / 2 = -3",
        "7 / -2 = -3",
        "-7 / -2 = 3",
        "7 / 2.0 = 3.5",
        "7.0 / 2 = 3.5",
        "1 + 0.5 = 1.5",
        "3 * 0.5 = 1.5",
        "0.1 + 0.2 <> 0.3",
        "9223372036854775807 + 1 = -9223372036854775808",
        "-9223372036854775808 - 1 = 9223372036854775807",
        "-9223372036854775808 / -1 = -9223372036854775808",
        "- -9223372036854775808 = -9223372036854775808",
        "4611686018427387904 * 2 = -9223372036854775808",
        "1.7976931348623157E308 * 10 > 1.7976931348623157E308",
        "a * 2 + b = 11",
        "-a = -4",
        "a - -b = 7",
    ],
)
def test_arithmetic(text: str) -> None:
    assert truth(text, a=4, b=3) is T


@pytest.mark.parametrize(
    "text",
    ["a / 0 = 0", "a / 0 <> 0", "a / 0.0 > 0", "x / 0 < 0", "x / 0.0 = x / 0.0", "0.0 / z = 1"],
)
def test_division_by_zero_is_unknown(text: str) -> None:
    assert truth(text, a=1, x=2.5, z=0) is U


def test_arithmetic_on_null_or_non_numbers_is_unknown() -> None:
    assert truth("n + 1 = 1") is U
    assert truth("-n = 1") is U
    assert truth("s + 1 = 2", s="1") is U
    assert truth("b + 1 = 2", b=True) is U
    assert truth("-s = -1", s="1") is U
    assert truth("n * m = 0", n=0) is U


@pytest.mark.parametrize("text", ["'a' + 1 = 2", "a = -'x'", "TRUE * 2 = 2", "a + 1", "'abc'", "5"])
def test_arithmetic_type_errors_are_rejected(text: str) -> None:
    assert "expected" in str(rejects(text))


# -- BETWEEN ----------------------------------------------------------------------------


@pytest.mark.parametrize(("age", "inside"), [(14, F), (15, T), (17, T), (19, T), (20, F)])
def test_between(age: int, inside: bool) -> None:
    assert truth("age BETWEEN 15 AND 19", age=age) is inside
    assert truth("age NOT BETWEEN 15 AND 19", age=age) is (not inside)
    assert truth("age BETWEEN 14.5 AND 19.5", age=age + 0.25) is inside
    assert truth("age BETWEEN 15 AND 18.5", age=age) is (inside and age != 19)


def test_between_with_expressions_and_precedence() -> None:
    assert matches("a + 1 BETWEEN b * 2 AND b * 3 AND c = 1", a=6, b=3, c=1)
    assert not matches("a + 1 BETWEEN b * 2 AND b * 3 AND c = 1", a=6, b=3, c=2)


def test_between_with_null() -> None:
    assert truth("x BETWEEN 1 AND 5") is U
    assert truth("x NOT BETWEEN 1 AND 5") is U
    assert truth("5 BETWEEN x AND 10") is U  # NULL <= 5 is unknown, 5 <= 10 true
    assert truth("50 BETWEEN x AND 10") is F  # unknown AND false
    assert truth("50 NOT BETWEEN x AND 10") is T  # 50 < NULL OR 50 > 10
    assert truth("5 NOT BETWEEN x AND 10") is U
    assert truth("x BETWEEN 1 AND 5", x="3") is F  # not a number: both comparisons false


@pytest.mark.parametrize(
    "text", ["s BETWEEN 'a' AND 'z'", "'m' BETWEEN a AND b", "b BETWEEN TRUE AND 2"]
)
def test_between_rejects_non_numeric_literals(text: str) -> None:
    assert "numeric" in str(rejects(text))


# -- IN ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("country", "inside"), [("UK", T), ("US", T), ("France", T), ("Peru", F)])
def test_in(country: str, inside: bool) -> None:
    assert truth("Country IN ('UK', 'US', 'France')", Country=country) is inside
    assert truth("Country NOT IN ('UK', 'US', 'France')", Country=country) is (not inside)


def test_in_with_null_or_non_string() -> None:
    assert truth("Country IN ('UK')") is U
    assert truth("Country NOT IN ('UK')") is U
    assert truth("Country IN ('1')", Country=1) is F  # different types: false
    assert truth("Country NOT IN ('1')", Country=1) is T
    assert matches("c IN ('a', 'a', 'it''s')", c="it's")


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("c IN ()", "a string literal in the IN list, found ')'", 6),
        ("c IN (1, 2)", "a string literal in the IN list, found integer 1", 6),
        ("c IN ('a',)", "a string literal in the IN list, found ')'", 10),
        ("c IN ('a' 'b')", "',' or ')' in the IN list", 10),
        ("c IN 'a'", "'(' after IN", 5),
        ("'a' IN ('a')", "IN applies to an identifier only", 0),
        ("c + 1 IN ('a')", "IN applies to an identifier only", 0),
        ("c IN (NULL)", "a string literal in the IN list", 6),
    ],
)
def test_in_syntax_errors(text: str, message: str, position: int) -> None:
    exc = rejects(text)
    assert message in str(exc) and exc.position == position


# -- LIKE -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "expected"),
    [
        ("phone LIKE '12%3'", "123", T),
        ("phone LIKE '12%3'", "12993", T),
        ("phone LIKE '12%3'", "1234", F),
        ("word LIKE 'l_se'", "lose", T),
        ("word LIKE 'l_se'", "loose", F),
        ("underscored LIKE '\\_%' ESCAPE '\\'", "_foo", T),
        ("underscored LIKE '\\_%' ESCAPE '\\'", "bar", F),
        ("underscored LIKE '\\_%' ESCAPE '\\'", "_", T),
        ("underscored LIKE '\\_%' ESCAPE '\\'", "x_foo", F),
        ("phone NOT LIKE '12%3'", "123", F),
        ("phone NOT LIKE '12%3'", "1234", T),
        ("word NOT LIKE 'l_se'", "loose", T),
        ("underscored NOT LIKE '\\_%' ESCAPE '\\'", "bar", T),
        ("s LIKE '%'", "", T),
        ("s LIKE ''", "", T),
        ("s LIKE ''", "a", F),
        ("s LIKE '_'", "", F),
        ("s LIKE '%%%'", "anything", T),
        ("s LIKE '%a%'", "banana", T),
        ("s LIKE '%a%b%a'", "xaxbxa", T),
        ("s LIKE '%a%b%a'", "xaxbx", F),
        ("s LIKE 'a%a'", "a", F),
        ("s LIKE 'a%a'", "aa", T),
        ("s LIKE '_%_'", "ab", T),
        ("s LIKE '_%_'", "a", F),
        ("s LIKE 'a_c'", "a\nc", T),
        ("s LIKE 'a%c'", "a\n\nc", T),
        ("s LIKE 'a.c'", "abc", F),
        ("s LIKE 'a.c'", "a.c", T),
        ("s LIKE '(x)+[y]*'", "(x)+[y]*", T),
        ("s LIKE '\\d'", "\\d", T),
        ("s LIKE '100!%' ESCAPE '!'", "100%", T),
        ("s LIKE '100!%' ESCAPE '!'", "1000", F),
        ("s LIKE '!!%' ESCAPE '!'", "!x", T),
        ("s LIKE 'a__b' ESCAPE '_'", "a_b", T),  # escape may be a wildcard character
        ("s LIKE '%%' ESCAPE '%'", "%", T),
        ("s LIKE 'it''s%'", "it's here", T),
        ("s LIKE 'ÉT_'", "ÉTÉ", T),
        ("s LIKE '_'", "𝄞", T),  # one code point
        ("s LIKE 'ab'", "AB", F),  # case-sensitive
    ],
)
def test_like(text: str, value: str, expected: bool) -> None:
    names = ("phone", "word", "underscored", "s")
    assert truth(text, **dict.fromkeys(names, value)) is expected


def test_like_with_null_is_unknown_and_with_non_string_false() -> None:
    assert truth("s LIKE '%'") is U
    assert truth("s NOT LIKE 'a%'") is U
    assert truth("s LIKE '1%'", s=1) is F


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("s LIKE 'a!b' ESCAPE '!'", "must be followed by '%', '_' or itself", 9),
        ("s LIKE 'ab!' ESCAPE '!'", "must be followed by '%', '_' or itself", 10),
        ("s LIKE 'it''s!' ESCAPE '!'", "must be followed by '%', '_' or itself", 13),
        ("s LIKE 'a' ESCAPE ''", "ESCAPE must be a single character", 18),
        ("s LIKE 'a' ESCAPE 'ab'", "ESCAPE must be a single character", 18),
        ("s LIKE 'a' ESCAPE", "a string literal after ESCAPE", 17),
        ("s LIKE 5", "a string literal pattern after LIKE", 7),
        ("s LIKE t", "a string literal pattern after LIKE", 7),
        ("'abc' LIKE 'a%'", "LIKE applies to an identifier only", 0),
        ("s ESCAPE '!'", "AND, OR or end of selector, found reserved word ESCAPE", 2),
    ],
)
def test_like_syntax_errors(text: str, message: str, position: int) -> None:
    exc = rejects(text)
    assert message in str(exc) and exc.position == position


def test_like_cannot_be_made_to_backtrack() -> None:
    hostile = [
        ("%a%a%a%a%a%a%a%a%a%a%b", "a" * 200_000),
        ("%" + "_" * 500 + "b", "a" * 200_000),
        ("%a_a_a_a_a_a_a_a_b%", "a" * 100_000),
        ("%" + "%".join("a" * 300) + "%b", "a" * 20_000),
    ]
    for pattern, value in hostile:
        sel = selector.parse(f"s LIKE '{pattern}'")
        start = time.perf_counter()
        assert not sel.matches({"s": value})
        assert time.perf_counter() - start < 2.0, pattern[:30]


# -- IS NULL ----------------------------------------------------------------------------


def test_is_null() -> None:
    assert truth("x IS NULL") is T
    assert truth("x IS NULL", x=None) is T
    assert truth("x IS NULL", x=0) is F
    assert truth("x IS NULL", x="") is F
    assert truth("x IS NULL", x=False) is F
    assert truth("x IS NOT NULL") is F
    assert truth("x is not null", x="v") is T


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x IS NOTNULL", "NULL or NOT NULL after IS"),
        ("x IS", "NULL or NOT NULL after IS"),
        ("x IS 1", "NULL or NOT NULL after IS"),
        ("x NOT IS NULL", "BETWEEN, LIKE or IN after NOT"),
        ("'a' IS NULL", "IS NULL applies to an identifier only"),
        ("x + 1 IS NULL", "IS NULL applies to an identifier only"),
        ("x = NULL", "IS NULL or IS NOT NULL"),
    ],
)
def test_is_null_syntax_errors(text: str, message: str) -> None:
    assert message in str(rejects(text))


@pytest.mark.parametrize("value", [b"bytes", [1], {"a": 1}, 2**70, -(2**63) - 1, object()])
def test_unsupported_python_values_are_unknown_but_not_null(value: object) -> None:
    assert truth("v = 'x'", v=value) is U
    assert truth("v = 1", v=value) is U
    assert truth("v + 1 > 0", v=value) is U
    assert truth("v IN ('x')", v=value) is U
    assert truth("v LIKE '%'", v=value) is U
    assert truth("v", v=value) is U
    assert truth("v IS NOT NULL", v=value) is T


def test_enum_values_count_as_their_base_type() -> None:
    import enum

    class Level(enum.IntEnum):
        HIGH = 9

    class Colour(str, enum.Enum):  # noqa: UP042 -- str() of this kind is "Colour.RED"
        RED = "red"

    assert matches("p = 9", p=Level.HIGH) and matches("c = 'red'", c=Colour.RED)


# -- three-valued logic -----------------------------------------------------------------

VALUES = {T: "t", F: "f", U: "u"}  # properties t=True, f=False, u missing
LOGIC_PROPS = {"t": True, "f": False}

AND_TABLE = {
    (T, T): T, (T, F): F, (T, U): U,
    (F, T): F, (F, F): F, (F, U): F,
    (U, T): U, (U, F): F, (U, U): U,
}  # fmt: skip
OR_TABLE = {
    (T, T): T, (T, F): T, (T, U): T,
    (F, T): T, (F, F): F, (F, U): U,
    (U, T): T, (U, F): U, (U, U): U,
}  # fmt: skip


@pytest.mark.parametrize(("a", "b"), list(AND_TABLE))
def test_and_truth_table(a: bool | None, b: bool | None) -> None:
    assert truth(f"{VALUES[a]} AND {VALUES[b]}", **LOGIC_PROPS) is AND_TABLE[a, b]


@pytest.mark.parametrize(("a", "b"), list(OR_TABLE))
def test_or_truth_table(a: bool | None, b: bool | None) -> None:
    assert truth(f"{VALUES[a]} OR {VALUES[b]}", **LOGIC_PROPS) is OR_TABLE[a, b]


@pytest.mark.parametrize(("a", "expected"), [(T, F), (F, T), (U, U)])
def test_not_truth_table(a: bool | None, expected: bool | None) -> None:
    assert truth(f"NOT {VALUES[a]}", **LOGIC_PROPS) is expected
    assert matches(f"NOT {VALUES[a]}", **LOGIC_PROPS) is (expected is T)


def test_unknown_from_comparisons_propagates() -> None:
    # missing property => NULL => the comparison is UNKNOWN, not FALSE
    assert not matches("NOT (missing = 1)")
    assert matches("missing = 1 OR TRUE")
    assert not matches("missing = 1 OR FALSE")
    assert not matches("NOT (missing = 1 AND TRUE)")
    assert matches("NOT (missing = 1 AND FALSE)")


def test_logic_operands_must_be_conditions() -> None:
    for text in ("1 AND a", "a OR 'x'", "NOT 5", "a AND b + 1", "NOT 'x' = 'y' AND 3"):
        assert "expected a condition" in str(rejects(text))


# -- precedence -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NOT t AND f", F),  # (NOT t) AND f
        ("NOT (t AND f)", T),
        ("f AND f OR t", T),  # (f AND f) OR t
        ("f AND (f OR t)", F),
        ("t OR t AND f", T),  # t OR (t AND f)
        ("(t OR t) AND f", F),
        ("NOT f OR f", T),
        ("NOT NOT t", T),
        ("NOT n = 1 AND t", F),  # NOT (n = 1)
        ("n + 1 = 2 AND t", T),
        ("n = 1 OR n = 2 AND n = 3", T),
        ("(n = 1 OR n = 2) AND n = 3", F),
        ("n BETWEEN 0 AND 2 AND t", T),
        ("n NOT BETWEEN 0 AND 2 OR t", T),
        ("t = TRUE", T),
        ("(n = 1) = t", T),
        ("(n = 2) <> f", F),
    ],
)
def test_precedence(text: str, expected: bool | None) -> None:
    assert truth(text, t=True, f=False, n=1) is expected


def test_comparisons_do_not_chain() -> None:
    exc = rejects("a = b = c")
    assert "AND, OR or end of selector, found '='" in str(exc) and exc.position == 6


# -- syntax errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("a = 'unterminated", "unterminated string literal", 4),
        ("a = 'it''s", "unterminated string literal", 4),
        ("a != 1", "unknown operator '!=' (use <> for 'not equal')", 2),
        ("a == 1", "unknown operator '=='", 2),
        ("a => 1", "expected an identifier, a literal or '(', found '>'", 3),
        ("a =< 1", "expected an identifier, a literal or '(', found '<'", 3),
        ('a = "x"', "unexpected character '\"' (string literals use single quotes)", 4),
        ("a = 1 # x", "unexpected character '#'", 6),
        ("a = 1 && b = 2", "unexpected character '&'", 6),
        ("a = 1 b = 2", "expected AND, OR or end of selector, found identifier b", 6),
        ("a = 1)", "expected AND, OR or end of selector, found ')'", 5),
        ("a = 1 'x'", "found string 'x'", 6),
        ("(a = 1", "expected ')', found end of selector", 6),
        ("a = (1 + 2", "expected ')'", 10),
        ("()", "expected an identifier, a literal or '(', found ')'", 1),
        ("a =", "found end of selector", 3),
        ("a AND", "found end of selector", 5),
        ("AND a", "found reserved word AND", 0),
        ("a = 1 AND OR b", "found reserved word OR", 10),
        ("a BETWEEN 1", "AND between the bounds of BETWEEN", 11),
        ("a BETWEEN 1 OR 2", "AND between the bounds of BETWEEN, found reserved word OR", 12),
        ("a NOT = 1", "BETWEEN, LIKE or IN after NOT", 6),
        ("a NOT", "BETWEEN, LIKE or IN after NOT", 5),
        ("a = 1,", "found ','", 5),
        ("a.b = 1", "unexpected character '.'", 1),
        ("\u0000", "unexpected character U+0000", 0),
    ],
)
def test_syntax_errors_name_position_and_expectation(
    text: str, message: str, position: int
) -> None:
    exc = rejects(text)
    assert message in str(exc), str(exc)
    assert exc.position == position
    assert f"at position {position}" in str(exc)


# -- limits -----------------------------------------------------------------------------


def test_selector_length_is_bounded() -> None:
    longest = "a = '" + "x" * (selector.MAX_LENGTH - 6) + "'"
    assert len(longest) == selector.MAX_LENGTH
    assert selector.parse(longest).matches({"a": "x" * (selector.MAX_LENGTH - 6)})
    assert "longer than" in str(rejects(longest + " "))


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "(" * n + "a" + ")" * n,
        lambda n: "NOT " * n + "a",
        lambda n: "- " * n + "a = 1",
        lambda n: "(NOT " * n + "a" + ")" * n,
        lambda n: "a = " + "(" * n + "1" + ")" * n,
    ],
)
def test_nesting_depth_is_bounded(make) -> None:  # type: ignore[no-untyped-def]
    depth = selector.MAX_DEPTH
    selector.parse(make(depth // 2)).matches({"a": True})
    assert "nested deeper" in str(rejects(make(depth + 1)))
    rejects(make(2000))  # too deep, and too long too for some shapes


def test_deep_nesting_never_raises_recursion_error_even_from_a_deep_stack() -> None:
    text = "(" * selector.MAX_DEPTH + "a" + ")" * selector.MAX_DEPTH

    def at_depth(n: int) -> object:
        if n > 0:
            return at_depth(n - 1)
        try:
            return selector.parse(text)
        except InvalidSelectorException as exc:
            return exc

    free = sys.getrecursionlimit() - len(__import__("inspect").stack())
    for margin in (30, 60, 100, 200, 400):
        result = at_depth(free - margin)
        assert isinstance(result, selector.Selector | InvalidSelectorException)


def test_long_flat_chains_are_fine() -> None:
    ors = " OR ".join(f"a = {i}" for i in range(300))
    assert len(ors) < selector.MAX_LENGTH
    assert selector.parse(ors).matches({"a": 299})
    sums = "+".join("1" for _ in range(2000)) + " = 2000"
    assert selector.parse(sums).matches({})
    ands = " AND ".join(["t"] * 600)
    assert selector.parse(ands).matches({"t": True})
