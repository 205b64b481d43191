"""Recursive-descent parser: selector text -> syntax tree, with static type checks.

Grammar (JMS 1.1 §3.8.1.1; lowest precedence first, keywords case-insensitive)::

    selector    := or_expr END
    or_expr     := and_expr ( OR and_expr )*
    and_expr    := not_expr ( AND not_expr )*
    not_expr    := NOT not_expr | predicate
    predicate   := sum [ ( = | <> | < | <= | > | >= ) sum
                       | [NOT] BETWEEN sum AND sum
                       | [NOT] IN '(' string ( ',' string )* ')'
                       | [NOT] LIKE string [ ESCAPE string ]
                       | IS [NOT] NULL ]
    sum         := product ( ( + | - ) product )*
    product     := unary ( ( * | / ) unary )*
    unary       := ( + | - ) unary | primary
    primary     := literal | identifier | '(' or_expr ')'

What the spec says about operand kinds is checked here, where the types are known: the
left of IN, LIKE and IS must be an identifier; arithmetic, BETWEEN, ``<`` ``<=`` ``>``
``>=`` take no string or boolean; AND, OR, NOT and the whole selector take conditions
(or an identifier, read as a boolean property); ``=``/``<>`` do not compare two
expressions whose known types differ. Length and nesting depth are bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

from .lexer import LONG_MAX, Kind, Token, error, tokenize
from .like import LikePattern, LikeSyntaxError
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

MAX_LENGTH = 4096
"""Longest selector accepted, in characters."""

MAX_DEPTH = 32
"""Deepest nesting accepted (parentheses, NOT and unary signs each count one level)."""

HEADER_FIELDS = frozenset(
    {
        "JMSDeliveryMode",
        "JMSPriority",
        "JMSMessageID",
        "JMSTimestamp",
        "JMSCorrelationID",
        "JMSType",
    }
)
"""The only JMS header fields a selector may reference (JMS 1.1 §3.8.1.1)."""

_COMPARISONS = frozenset({"=", "<>", "<", "<=", ">", ">="})


def parse_tree(text: str) -> Node:
    """Parse a non-empty selector into its tree; raise InvalidSelectorException."""
    if len(text) > MAX_LENGTH:
        raise error(f"selector longer than {MAX_LENGTH} characters", MAX_LENGTH)
    return _Parser(tokenize(text)).selector()


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    # -- token helpers ------------------------------------------------------------------

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        if token.kind is not Kind.END:
            self.index += 1
        return token

    def at_keyword(self, *words: str) -> bool:
        return self.token.kind is Kind.KEYWORD and self.token.value in words

    def at_op(self, *ops: str) -> bool:
        return self.token.kind is Kind.OP and self.token.value in ops

    def fail(self, expected: str) -> NoReturn:
        raise error(f"expected {expected}, found {self.token.describe()}", self.token.pos)

    def expect_keyword(self, word: str, expected: str) -> None:
        if not self.at_keyword(word):
            self.fail(expected)
        self.advance()

    def expect_op(self, op: str, expected: str) -> None:
        if not self.at_op(op):
            self.fail(expected)
        self.advance()

    def expect_string(self, expected: str) -> Token:
        if self.token.kind is not Kind.STRING:
            self.fail(expected)
        return self.advance()

    @contextmanager
    def nested(self) -> Iterator[None]:
        if self.depth >= MAX_DEPTH:
            raise error(f"selector nested deeper than {MAX_DEPTH} levels", self.token.pos)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    # -- type checks --------------------------------------------------------------------

    @staticmethod
    def require(node: Node, pos: int, allowed: tuple[Type, ...], what: str) -> Node:
        found = static_type(node)
        if found is not Type.ANY and found not in allowed:
            raise error(f"expected {what}, found {found.value}", pos)
        return node

    def condition(self, parse: Callable[[], Node]) -> Node:
        pos = self.token.pos
        return self.require(parse(), pos, (Type.BOOLEAN,), "a condition")

    def numeric(self, parse: Callable[[], Node]) -> Node:
        pos = self.token.pos
        return self.require(parse(), pos, (Type.NUMERIC,), "a numeric expression")

    # -- grammar ------------------------------------------------------------------------

    def selector(self) -> Node:
        node = self.condition(self.or_expr)
        if self.token.kind is not Kind.END:
            self.fail("AND, OR or end of selector")
        return node

    def or_expr(self) -> Node:
        return self.logical("OR", self.and_expr, Or)

    def and_expr(self) -> Node:
        return self.logical("AND", self.not_expr, And)

    def logical(
        self, keyword: str, operand: Callable[[], Node], make: Callable[[tuple[Node, ...]], Node]
    ) -> Node:
        pos = self.token.pos
        first = operand()
        if not self.at_keyword(keyword):
            return first
        operands = [self.require(first, pos, (Type.BOOLEAN,), f"a condition before {keyword}")]
        while self.at_keyword(keyword):
            self.advance()
            operands.append(self.condition(operand))
        return make(tuple(operands))

    def not_expr(self) -> Node:
        if not self.at_keyword("NOT"):
            return self.predicate()
        self.advance()
        with self.nested():
            return Not(self.condition(self.not_expr))

    def predicate(self) -> Node:
        start = self.token.pos
        left = self.sum()
        token = self.token
        if token.kind is Kind.OP and token.value in _COMPARISONS:
            self.advance()
            right = self.sum()
            return self.comparison(str(token.value), left, right, token.pos)
        if self.at_keyword("IS"):
            self.advance()
            negated = self.at_keyword("NOT")
            if negated:
                self.advance()
            self.expect_keyword("NULL", "NULL or NOT NULL after IS")
            return IsNull(self.identifier(left, start, "IS NULL"), negated)
        negated = self.at_keyword("NOT")
        if negated:
            self.advance()
            if not self.at_keyword("BETWEEN", "LIKE", "IN"):
                self.fail("BETWEEN, LIKE or IN after NOT")
        if self.at_keyword("BETWEEN"):
            self.advance()
            operand = self.require(left, start, (Type.NUMERIC,), "a numeric expression")
            low = self.numeric(self.sum)
            self.expect_keyword("AND", "AND between the bounds of BETWEEN")
            return Between(operand, low, self.numeric(self.sum), negated)
        if self.at_keyword("IN"):
            self.advance()
            return In(self.identifier(left, start, "IN"), self.string_list(), negated)
        if self.at_keyword("LIKE"):
            self.advance()
            return Like(self.identifier(left, start, "LIKE"), self.like_pattern(), negated)
        return left

    def comparison(self, op: str, left: Node, right: Node, pos: int) -> Compare:
        types = (static_type(left), static_type(right))
        if op not in ("=", "<>"):
            for found in types:
                if found in (Type.STRING, Type.BOOLEAN):
                    raise error(
                        f"'{op}' cannot compare {found.value} "
                        "(strings and booleans only support = and <>)",
                        pos,
                    )
        # '=' and '<>' between known different types are valid and FALSE (JMS 1.1 §3.8.1.2)
        return Compare(op, left, right)

    def identifier(self, node: Node, pos: int, operator: str) -> Identifier:
        if not isinstance(node, Identifier):
            raise error(f"{operator} applies to an identifier only", pos)
        return node

    def string_list(self) -> frozenset[str]:
        self.expect_op("(", "'(' after IN")
        values = [self.expect_string("a string literal in the IN list").value]
        while self.at_op(","):
            self.advance()
            values.append(self.expect_string("a string literal in the IN list").value)
        self.expect_op(")", "',' or ')' in the IN list")
        return frozenset(str(v) for v in values)

    def like_pattern(self) -> LikePattern:
        token = self.expect_string("a string literal pattern after LIKE")
        source = str(token.value)
        escape = None
        if self.at_keyword("ESCAPE"):
            self.advance()
            escape_token = self.expect_string("a string literal after ESCAPE")
            escape = str(escape_token.value)
            if len(escape) != 1:
                raise error("ESCAPE must be a single character", escape_token.pos)
        try:
            return LikePattern.parse(source, escape)
        except LikeSyntaxError as exc:
            offset = exc.offset
            pos = token.pos + 1 + offset + source[:offset].count("'")
            raise error(f"bad LIKE pattern: {exc}", pos) from None

    def sum(self) -> Node:
        return self.arithmetic(self.product, ("+", "-"))

    def product(self) -> Node:
        return self.arithmetic(self.unary, ("*", "/"))

    def arithmetic(self, operand: Callable[[], Node], ops: tuple[str, ...]) -> Node:
        pos = self.token.pos
        first = operand()
        if not self.at_op(*ops):
            return first
        self.require(first, pos, (Type.NUMERIC,), "a numeric expression")
        rest = []
        while self.at_op(*ops):
            op = str(self.advance().value)
            rest.append((op, self.numeric(operand)))
        return Arithmetic(first, tuple(rest))

    def unary(self) -> Node:
        if not self.at_op("+", "-"):
            return self.primary()
        sign = self.advance().value
        token = self.token
        if token.kind in (Kind.INTEGER, Kind.FLOAT):  # a signed literal, e.g. -957 or -1.5
            self.advance()
            value = token.value
            assert isinstance(value, int | float)
            return Literal(-value if sign == "-" else self.in_range(token))
        with self.nested():
            operand = self.numeric(self.unary)
        return Negate(operand) if sign == "-" else operand

    @staticmethod
    def in_range(token: Token) -> int | float:
        value = token.value
        assert isinstance(value, int | float)
        if token.kind is Kind.INTEGER and value > LONG_MAX:
            raise error("integer literal out of the range of a Java long", token.pos)
        return value

    def primary(self) -> Node:
        token = self.token
        if token.kind in (Kind.INTEGER, Kind.FLOAT):
            self.advance()
            return Literal(self.in_range(token))
        if token.kind is Kind.STRING:
            self.advance()
            return Literal(str(token.value))
        if token.kind is Kind.IDENT:
            self.advance()
            return Identifier(self.check_name(str(token.value), token.pos))
        if self.at_keyword("TRUE", "FALSE"):
            self.advance()
            return Literal(token.value == "TRUE")
        if self.at_keyword("NULL"):
            raise error("NULL can only be tested with IS NULL or IS NOT NULL", token.pos)
        if self.at_op("("):
            self.advance()
            with self.nested():
                node = self.or_expr()
            self.expect_op(")", "')'")
            return node
        self.fail("an identifier, a literal or '('")

    @staticmethod
    def check_name(name: str, pos: int) -> str:
        if (
            name.startswith("JMS")
            and name not in HEADER_FIELDS
            and not name.startswith(("JMSX", "JMS_"))
        ):
            allowed = ", ".join(sorted(HEADER_FIELDS))
            raise error(
                f"header field {name} cannot be used in a selector (allowed: {allowed})", pos
            )
        return name
