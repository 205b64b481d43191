"""Tokenizer for JMS message selectors: Java-style identifiers, literals and operators.

Owns the lexical rules of JMS 1.1 §3.8.1.1: Java whitespace, Java identifiers (with the
reserved words recognised case-insensitively), string literals in single quotes with ``''``
for a quote, Java integer literals (decimal, hex, octal, optional ``L``) in the range of a
Java ``long``, and Java floating-point literals (optional ``f``/``d`` suffix) in the range
of a Java ``double``. Lexical errors raise :class:`InvalidSelectorException` naming the
offset.
"""

from __future__ import annotations

import math
import struct
import unicodedata
from dataclasses import dataclass
from enum import Enum

from ..errors import InvalidSelectorException

KEYWORDS = frozenset(
    {"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"}
)
"""Reserved words (matched case-insensitively); none of them can be an identifier."""

LONG_MAX = (1 << 63) - 1

_WHITESPACE = frozenset(" \t\f\n\r")  # Java: space, tab, form feed, line terminators
_TWO_CHAR_OPS = frozenset({"<>", "<=", ">="})
_ONE_CHAR_OPS = frozenset("=<>+-*/(),")
_BAD_OPS = {"!=": "use <> for 'not equal'", "==": "use = for 'equal'"}
_START_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_PART_CATEGORIES = _START_CATEGORIES | {"Nd", "Mn", "Mc", "Cf"}


class Kind(Enum):
    """Token kinds."""

    IDENT = "identifier"
    KEYWORD = "keyword"
    STRING = "string"
    INTEGER = "integer"
    FLOAT = "number"
    OP = "operator"
    END = "end of selector"


@dataclass(frozen=True, slots=True)
class Token:
    """One token of a selector."""

    kind: Kind
    """What the token is."""
    value: object
    """Identifier name, upper-case keyword, operator text, string content or number."""
    pos: int
    """0-based offset of the token's first character in the selector."""
    text: str = ""
    """The token's source text (for error messages)."""

    def describe(self) -> str:
        """How error messages name this token."""
        if self.kind is Kind.END:
            return "end of selector"
        if self.kind is Kind.KEYWORD:
            literal = self.value in ("TRUE", "FALSE", "NULL")
            return str(self.value) if literal else f"reserved word {self.value}"
        if self.kind is Kind.OP:
            return f"'{self.value}'"
        shown = self.text if len(self.text) <= 30 else self.text[:27] + "..."
        return f"{self.kind.value} {shown}"


def is_identifier_start(ch: str) -> bool:
    """Java ``Character.isJavaIdentifierStart``: letters, currency symbols, ``_`` and kin."""
    return unicodedata.category(ch) in _START_CATEGORIES


def is_identifier_part(ch: str) -> bool:
    """Java ``Character.isJavaIdentifierPart`` (including the identifier-ignorable controls)."""
    if unicodedata.category(ch) in _PART_CATEGORIES:
        return True
    code = ord(ch)
    return code <= 0x08 or 0x0E <= code <= 0x1B or 0x7F <= code <= 0x9F


def error(message: str, pos: int) -> InvalidSelectorException:
    """An InvalidSelectorException whose message ends with the position."""
    return InvalidSelectorException(f"{message} at position {pos}", position=pos)


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, ending with a :attr:`Kind.END` token."""
    tokens: list[Token] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append(Token(Kind.END, None, n))
            return tokens
        ch = text[i]
        if ch == "'":
            token, i = _string(text, i)
        elif (ch.isascii() and ch.isdigit()) or (ch == "." and text[i + 1 : i + 2].isdigit()):
            token, i = _number(text, i)
        elif is_identifier_start(ch):
            j = i + 1
            while j < n and is_identifier_part(text[j]):
                j += 1
            word = text[i:j]
            upper = word.upper()
            if word.isascii() and upper in KEYWORDS:
                token = Token(Kind.KEYWORD, upper, i, word)
            else:
                token = Token(Kind.IDENT, word, i, word)
            i = j
        elif text[i : i + 2] in _BAD_OPS:
            op = text[i : i + 2]
            raise error(f"unknown operator '{op}' ({_BAD_OPS[op]})", i)
        elif text[i : i + 2] in _TWO_CHAR_OPS:
            token = Token(Kind.OP, text[i : i + 2], i, text[i : i + 2])
            i += 2
        elif ch in _ONE_CHAR_OPS:
            token = Token(Kind.OP, ch, i, ch)
            i += 1
        else:
            shown = repr(ch) if ch.isprintable() else f"U+{ord(ch):04X}"
            hint = " (string literals use single quotes)" if ch == '"' else ""
            raise error(f"unexpected character {shown}{hint}", i)
        tokens.append(token)


def _string(text: str, start: int) -> tuple[Token, int]:
    parts = []
    i = start + 1
    while True:
        end = text.find("'", i)
        if end < 0:
            raise error("unterminated string literal (no closing quote)", start)
        parts.append(text[i:end])
        if text[end + 1 : end + 2] == "'":  # '' is an escaped quote
            parts.append("'")
            i = end + 2
            continue
        return Token(Kind.STRING, "".join(parts), start, text[start : end + 1]), end + 1


def _digits(text: str, i: int, allowed: str) -> int:
    while i < len(text) and text[i] in allowed:
        i += 1
    return i


def _number(text: str, start: int) -> tuple[Token, int]:
    n = len(text)
    if text[start : start + 2] in ("0x", "0X"):
        i = _digits(text, start + 2, "0123456789abcdefABCDEF")
        if i == start + 2:
            raise error("malformed hexadecimal literal (expected hex digits after 0x)", start)
        value = int(text[start + 2 : i], 16)
        is_float = False
    else:
        i = _digits(text, start, "0123456789")
        is_float = False
        if i < n and text[i] == ".":
            is_float = True
            i = _digits(text, i + 1, "0123456789")
        if i < n and text[i] in "eE":
            is_float = True
            j = i + 1
            if j < n and text[j] in "+-":
                j += 1
            k = _digits(text, j, "0123456789")
            if k == j:
                raise error("malformed number (expected digits in the exponent)", start)
            i = k
        body = text[start:i]
        if i < n and text[i] in "fFdD":
            token = _float(body, text[i] in "fF", start, text[start : i + 1])
            return _check_end(text, i + 1, token)
        if is_float:
            return _check_end(text, i, _float(body, False, start, body))
        if len(body) > 1 and body[0] == "0":
            if any(c in "89" for c in body):
                raise error(f"malformed octal literal {body!r}", start)
            value = int(body, 8)
        else:
            value = int(body)
    if i < n and text[i] in "lL":
        i += 1
    # 2**63 is only valid right after a unary minus; the parser checks that.
    if value > LONG_MAX + 1 or (value == LONG_MAX + 1 and text[start] == "0"):
        raise error("integer literal out of the range of a Java long", start)
    return _check_end(text, i, Token(Kind.INTEGER, value, start, text[start:i]))


def _float(body: str, single: bool, start: int, source: str) -> Token:
    value = float(body)
    if single:
        try:
            value = struct.unpack("<f", struct.pack("<f", value))[0]
        except OverflowError:
            value = math.inf
    if math.isinf(value):
        raise error("floating-point literal out of range", start)
    if value == 0.0 and any(c in "123456789" for c in body.lower().partition("e")[0]):
        raise error("floating-point literal too small (rounds to zero)", start)
    return Token(Kind.FLOAT, value, start, source)


def _check_end(text: str, i: int, token: Token) -> tuple[Token, int]:
    if i < len(text) and (is_identifier_part(text[i]) or text[i] == "."):
        raise error(f"malformed number {text[token.pos : i + 1]!r}", token.pos)
    return token, i
