"""The ``-ssl KEY=REGEX`` selection patterns of ``sub``/``receive`` and how they reach JOMS.

A DoDWAN selection pattern says a message property must match a regular expression (RE2,
full match), as in the paper: ``language=English|French``. The STOMP gateway takes JMS
selectors only, so each pattern becomes, when it can, an equivalent selector clause that
the service pushes into the network as a DoDWAN pattern:

* an alternation of literals (``English|French``)  ->  ``language IN ('English','French')``
  (one literal -> ``language = 'English'``);
* literals with ``.*`` and ``.`` (``Chat.*``)  ->  ``language LIKE 'Chat%' ESCAPE '\\' AND
  language NOT LIKE '%<LF>%'`` (OR of such for several alternatives): RE2's ``.`` matches
  any character but a line feed, LIKE's ``_`` and ``%`` match line feeds too, so the
  second conjunct (a literal line feed in the string) keeps the clause exact;
* anything else (classes, groups, repetitions, a literal line feed next to ``.``/``.*``,
  a KEY that is not a selector identifier or names a JMS header): no clause; the pattern
  is only checked here.

Whatever the translation, on a topic every pattern is also checked in the console on each
arrival (RE2 full match on the property's string form), so the semantics are exactly
DoDWAN's. On a queue only patterns with a clause are accepted (a message taken from a queue
and then dropped would be lost): see ``commands._only_server_side``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dodwan.core.patterns import RegexError, compile_regex
from joms.selector.lexer import KEYWORDS
from joms.service import model as mdl

_META = set(".^$*+?()[]{}|\\")
_ANY = object()  # '.*'
_ONE = object()  # '.'


class PatternError(ValueError):
    """A ``KEY=REGEX`` that cannot be used."""


@dataclass(frozen=True)
class PropertyPattern:
    """One ``KEY=REGEX``: the regex, compiled, and its selector clause (None if none)."""

    key: str
    regex: str
    compiled: Any
    clause: str | None

    def matches(self, value: str | None) -> bool:
        return value is not None and self.compiled.fullmatch(value) is not None


def parse_patterns(items: list[str]) -> list[PropertyPattern]:
    """``["language=English|French", ...]`` -> patterns; raise PatternError on a bad one."""
    out = []
    for item in items:
        key, sep, regex = item.partition("=")
        if not sep or not key:
            raise PatternError(f"bad pattern {item!r}: expected KEY=REGEX")
        try:
            compiled = compile_regex(regex)
        except RegexError as exc:
            raise PatternError(
                f"bad regular expression {regex!r} for {key}: {exc.reason}"
            ) from None
        out.append(PropertyPattern(key, regex, compiled, selector_clause(key, regex)))
    return out


def parse_properties(items: list[str]) -> dict[str, str]:
    """``["language=English", ...]`` (``pub -ssl``) -> string properties."""
    props: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PatternError(f"bad property {item!r}: expected KEY=VALUE")
        try:
            mdl.check_property_name(key)
        except Exception as exc:
            raise PatternError(str(exc)) from None
        props[key] = value
    return props


def _is_identifier(key: str) -> bool:
    """``key`` names the property itself in a selector: an identifier, not a keyword, and
    not a ``JMS…`` name (in a selector those are the message's headers, ``JMSType``...),
    bar the client-set ``JMSX`` properties."""
    return (
        key.isascii()
        and (key[0].isalpha() or key[0] in "_$")
        and all(c.isalnum() or c in "_$" for c in key)
        and key.upper() not in KEYWORDS
        and (not key.startswith("JMS") or key in mdl.CLIENT_JMSX)
    )


def _alternatives(regex: str) -> list[list[Any]] | None:
    """The regex as alternatives of literal chars, ``_ANY`` and ``_ONE``; None if richer."""
    alts: list[list[Any]] = [[]]
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            if i + 1 < len(regex) and regex[i + 1] in _META:
                alts[-1].append(regex[i + 1])
                i += 2
                continue
            return None
        if c == "|":
            alts.append([])
        elif c == ".":
            if regex[i + 1 : i + 2] == "*":
                alts[-1].append(_ANY)
                i += 1
            else:
                alts[-1].append(_ONE)
        elif c in _META:
            return None
        else:
            alts[-1].append(c)
        i += 1
    return alts


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _like(parts: list[Any]) -> str:
    out = []
    for p in parts:
        if p is _ANY:
            out.append("%")
        elif p is _ONE:
            out.append("_")
        elif p in "%_\\":
            out.append("\\" + p)
        else:
            out.append(p)
    return _quote("".join(out))


def selector_clause(key: str, regex: str) -> str | None:
    """The JMS selector clause equivalent to ``KEY=REGEX`` when there is one."""
    if not _is_identifier(key):
        return None
    alts = _alternatives(regex)
    if alts is None:
        return None
    if all(all(isinstance(p, str) for p in a) for a in alts):
        values = sorted({"".join(a) for a in alts})
        if len(values) == 1:
            return f"{key} = {_quote(values[0])}"
        return f"{key} IN ({','.join(_quote(v) for v in values)})"
    likes = []
    for a in alts:
        if all(isinstance(p, str) for p in a):
            likes.append(f"{key} = {_quote(''.join(a))}")
        elif "\n" in a:
            return None  # RE2 '.' skips line feeds, a literal one does not: no LIKE says both
        else:
            # RE2's '.' (and '.*') never match a line feed, LIKE's '_' and '%' do
            likes.append(f"{key} LIKE {_like(a)} ESCAPE '\\' AND {key} NOT LIKE '%\n%'")
    if len(likes) == 1:
        return likes[0]
    return "(" + " OR ".join(f"({x})" if " AND " in x else x for x in likes) + ")"


def combined_selector(selector: str | None, patterns: list[PropertyPattern]) -> str | None:
    """The selector sent to the gateway: ``-sel`` AND the clauses of the ``-ssl`` patterns."""
    parts = [f"({selector})"] if selector and selector.strip() else []
    parts += [p.clause for p in patterns if p.clause]
    if not parts:
        return None
    if len(parts) == 1 and selector and parts[0] == f"({selector})":
        return selector
    return " AND ".join(parts)


def property_text(message: Any, key: str) -> str | None:
    """A received message's property as the string DoDWAN carries, or None."""
    value = message.get_property(key)
    if value is None:
        return None
    t = message.property_type(key) or "string"
    try:
        return str(mdl.encode_property(value, t))
    except Exception:
        return str(value)


def accepts(patterns: list[PropertyPattern], message: Any) -> bool:
    """Every pattern fully matches its property of ``message``."""
    return all(p.matches(property_text(message, p.key)) for p in patterns)
