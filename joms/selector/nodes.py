"""The syntax tree of a parsed selector: immutable nodes, plus their static types.

Chains of the same operator (``a OR b OR c``, ``x + y - z``) are kept as one n-ary node,
so the depth of a tree is the nesting depth of the selector, which the parser bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .like import LikePattern


class Type(Enum):
    """What the parser knows about an expression's type before any message is seen."""

    NUMERIC = "a number"
    STRING = "a string"
    BOOLEAN = "a boolean"
    ANY = "a property"
    """An identifier: its type is that of the property in each message."""


@dataclass(frozen=True, slots=True)
class Literal:
    """A string, integer (Java long), float (Java double) or boolean constant."""

    value: str | int | float | bool


@dataclass(frozen=True, slots=True)
class Identifier:
    """A reference to a header field or property; NULL when the message lacks it."""

    name: str


@dataclass(frozen=True, slots=True)
class Negate:
    """Unary ``-`` (``+`` is checked by the parser and dropped)."""

    operand: Node


@dataclass(frozen=True, slots=True)
class Arithmetic:
    """``first op1 x1 op2 x2 ...`` for one precedence level (``+ -`` or ``* /``), left to right."""

    first: Node
    rest: tuple[tuple[str, Node], ...]


@dataclass(frozen=True, slots=True)
class Compare:
    """``left op right`` with op one of ``= <> < <= > >=``."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Between:
    """``operand [NOT] BETWEEN low AND high``."""

    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    """``identifier [NOT] IN ('a', 'b', ...)``."""

    identifier: Identifier
    values: frozenset[str]
    negated: bool


@dataclass(frozen=True, slots=True)
class Like:
    """``identifier [NOT] LIKE 'pattern' [ESCAPE 'c']``."""

    identifier: Identifier
    pattern: LikePattern
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    """``identifier IS [NOT] NULL``."""

    identifier: Identifier
    negated: bool


@dataclass(frozen=True, slots=True)
class Not:
    """``NOT operand``."""

    operand: Node


@dataclass(frozen=True, slots=True)
class And:
    """``a AND b AND ...``."""

    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    """``a OR b OR ...``."""

    operands: tuple[Node, ...]


Node = (
    Literal
    | Identifier
    | Negate
    | Arithmetic
    | Compare
    | Between
    | In
    | Like
    | IsNull
    | Not
    | And
    | Or
)


def static_type(node: Node) -> Type:
    """The type of ``node`` as far as it is known without a message."""
    if isinstance(node, Literal):
        value = node.value
        if isinstance(value, bool):
            return Type.BOOLEAN
        return Type.STRING if isinstance(value, str) else Type.NUMERIC
    if isinstance(node, Identifier):
        return Type.ANY
    if isinstance(node, Negate | Arithmetic):
        return Type.NUMERIC
    return Type.BOOLEAN
