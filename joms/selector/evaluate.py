"""Evaluation: a syntax tree compiled once into closures over a message's properties.

Values follow JMS 1.1 §3.8.1.1 with SQL three-valued logic: a condition yields True, False
or None (UNKNOWN); an expression yields a JMS value or None (NULL). Python values map to
JMS types as: ``bool`` -> boolean, ``int`` -> long (outside the long range: unsupported),
``float`` -> double, ``str`` -> String, ``None`` or a missing key -> NULL. Any other value
(bytes, lists, ...) is *unsupported*: present (so ``IS NULL`` is false) but every operation
on it is UNKNOWN.

Choices where Java would throw or the spec is silent:

* division by zero (long or double) is UNKNOWN, not an exception nor an infinity;
* comparing values of different types (other than long with double) is FALSE, as JMS 1.1
  §3.8.1.2 says (so ``NOT s = 1`` is TRUE for a string ``s``), and ``'a' = 1.0`` is valid;
* long arithmetic wraps around at 64 bits and ``/`` truncates toward zero, as in Java;
  long with double promotes the long to double first, as in Java (also for comparisons).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from .lexer import LONG_MAX as _LONG_MAX
from .nodes import (
    And,
    Arithmetic,
    Between,
    Compare,
    Identifier,
    In,
    IsNull,
    Like,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    Type,
    static_type,
)

Properties = Mapping[str, object]
Evaluator = Callable[[Properties], Any]
"""A compiled expression: properties -> JMS value (or True/False/None for a condition)."""


class _Unsupported:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<unsupported value>"


UNSUPPORTED: Any = _Unsupported()
"""Stands for a present property whose Python type has no JMS counterpart."""

_LONG_MIN = -_LONG_MAX - 1
_NUMBERS = (int, float)
_DELIVERY_MODES = {1: "NON_PERSISTENT", 2: "PERSISTENT"}  # javax.jms.DeliveryMode constants


def jms_value(value: object) -> Any:
    """The JMS value a Python property value stands for (None = NULL)."""
    kind = type(value)
    if kind is str or kind is bool or kind is float:
        return value
    if kind is int:
        return value if _LONG_MIN <= value <= _LONG_MAX else UNSUPPORTED  # type: ignore[operator]
    if value is None:
        return None
    if isinstance(value, str):  # str subclasses such as StrEnum
        return str.__str__(value)
    if isinstance(value, int):  # int subclasses such as IntEnum (bool was handled above)
        return jms_value(int(value))
    if isinstance(value, float):
        return float(value)
    return UNSUPPORTED


def compile_condition(node: Node) -> Evaluator:
    """Compile a condition: the result is True, False or None (UNKNOWN)."""
    evaluate = _compile(node)
    if static_type(node) is not Type.ANY:
        return evaluate

    def as_boolean(props: Properties) -> bool | None:
        value = evaluate(props)
        return value if type(value) is bool else None

    return as_boolean


def _compile(node: Node) -> Evaluator:
    return _COMPILERS[type(node)](node)


# -- values -----------------------------------------------------------------------------


def _literal(node: Literal) -> Evaluator:
    value = node.value
    return lambda _props: value


def _identifier(node: Identifier) -> Evaluator:
    name = node.name
    if name == "JMSDeliveryMode":

        def delivery_mode(props: Properties) -> Any:
            value = props.get(name)
            if type(value) is int:
                return _DELIVERY_MODES.get(value, value)
            return jms_value(value)

        return delivery_mode
    return lambda props: jms_value(props.get(name))


# -- arithmetic -------------------------------------------------------------------------


def _wrap(value: int) -> int:
    """Java long overflow: keep the low 64 bits, two's complement."""
    if _LONG_MIN <= value <= _LONG_MAX:
        return value
    return ((value - _LONG_MIN) & 0xFFFF_FFFF_FFFF_FFFF) + _LONG_MIN


def _long_div(a: int, b: int) -> int | None:
    if b == 0:
        return None
    quotient = abs(a) // abs(b)
    return _wrap(-quotient if (a < 0) != (b < 0) else quotient)


def _double_div(a: float, b: float) -> float | None:
    return None if b == 0.0 else a / b


def _arithmetic_op(
    on_longs: Callable[[int, int], int | None], on_doubles: Callable[[float, float], float | None]
) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        ta, tb = type(a), type(b)
        if ta is int and tb is int:
            return on_longs(a, b)
        if ta in _NUMBERS and tb in _NUMBERS:
            return on_doubles(float(a), float(b))
        return None  # NULL, or not a number

    return apply


_ARITHMETIC = {
    "+": _arithmetic_op(lambda a, b: _wrap(a + b), operator.add),
    "-": _arithmetic_op(lambda a, b: _wrap(a - b), operator.sub),
    "*": _arithmetic_op(lambda a, b: _wrap(a * b), operator.mul),
    "/": _arithmetic_op(_long_div, _double_div),
}


def _negate(node: Negate) -> Evaluator:
    operand = _compile(node.operand)

    def negate(props: Properties) -> Any:
        value = operand(props)
        kind = type(value)
        if kind is int:
            return _wrap(-value)
        return -value if kind is float else None

    return negate


def _arithmetic(node: Arithmetic) -> Evaluator:
    first = _compile(node.first)
    rest = [(_ARITHMETIC[op], _compile(operand)) for op, operand in node.rest]

    def arithmetic(props: Properties) -> Any:
        value = first(props)
        for apply, operand in rest:
            value = apply(value, operand(props))
        return value

    return arithmetic


# -- comparisons and predicates ---------------------------------------------------------

_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def compare(op: str, a: Any, b: Any) -> bool | None:
    """``a op b`` in JMS terms: numbers compare after promotion, strings and booleans with
    = and <> only; NULL (or an unsupported value) gives UNKNOWN; values of different types
    compare as false (JMS 1.1 §3.8.1.2)."""
    ta, tb = type(a), type(b)
    if ta in _NUMBERS and tb in _NUMBERS:
        if ta is not tb:  # long vs double: Java promotes the long to double
            a, b = float(a), float(b)
        return bool(_ORDERINGS[op](a, b))
    if ta is tb and (ta is str or ta is bool) and op in ("=", "<>"):
        return bool(a == b) == (op == "=")
    if a is None or b is None or a is UNSUPPORTED or b is UNSUPPORTED:
        return None
    if ta is not tb and not (ta in _NUMBERS and tb in _NUMBERS):
        return False
    return None


def _comparison(node: Compare) -> Evaluator:
    op = node.op
    left, right = _compile(node.left), _compile(node.right)
    return lambda props: compare(op, left(props), right(props))


def _between(node: Between) -> Evaluator:
    operand, low, high = _compile(node.operand), _compile(node.low), _compile(node.high)
    if node.negated:  # a NOT BETWEEN b AND c  ==  a < b OR a > c

        def not_between(props: Properties) -> bool | None:
            value = operand(props)
            return _or3(compare("<", value, low(props)), compare(">", value, high(props)))

        return not_between

    def between(props: Properties) -> bool | None:  # a >= b AND a <= c
        value = operand(props)
        return _and3(compare(">=", value, low(props)), compare("<=", value, high(props)))

    return between


def _string_test(identifier: Identifier, test: Callable[[str], bool], negated: bool) -> Evaluator:
    load = _identifier(identifier)

    def string_test(props: Properties) -> bool | None:
        value = load(props)
        if type(value) is not str:
            if value is None or value is UNSUPPORTED:
                return None
            return negated  # another type: the test is false (JMS 1.1 §3.8.1.2)
        return test(value) != negated

    return string_test


def _in(node: In) -> Evaluator:
    return _string_test(node.identifier, node.values.__contains__, node.negated)


def _like(node: Like) -> Evaluator:
    return _string_test(node.identifier, node.pattern.matches, node.negated)


def _is_null(node: IsNull) -> Evaluator:
    load = _identifier(node.identifier)
    negated = node.negated
    return lambda props: (load(props) is None) != negated


# -- logic ------------------------------------------------------------------------------


def _and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or3(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _not(node: Not) -> Evaluator:
    operand = compile_condition(node.operand)

    def negation(props: Properties) -> bool | None:
        value = operand(props)
        return None if value is None else not value

    return negation


def _junction(operands: tuple[Node, ...], decisive: bool) -> Evaluator:
    """AND (``decisive`` False) or OR (True): the first ``decisive`` operand decides,
    else UNKNOWN if any operand was UNKNOWN, else ``not decisive``."""
    compiled = [compile_condition(o) for o in operands]

    def junction(props: Properties) -> bool | None:
        result: bool | None = not decisive
        for operand in compiled:
            value: bool | None = operand(props)
            if value is decisive:
                return decisive
            if value is None:
                result = None
        return result

    return junction


def _and(node: And) -> Evaluator:
    return _junction(node.operands, False)


def _or(node: Or) -> Evaluator:
    return _junction(node.operands, True)


_COMPILERS: dict[type, Callable[[Any], Evaluator]] = {
    Literal: _literal,
    Identifier: _identifier,
    Negate: _negate,
    Arithmetic: _arithmetic,
    Compare: _comparison,
    Between: _between,
    In: _in,
    Like: _like,
    IsNull: _is_null,
    Not: _not,
    And: _and,
    Or: _or,
}
