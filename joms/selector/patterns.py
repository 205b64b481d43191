"""Network filter extraction: what DoDWAN patterns can check of a selector, ahead of delivery.

A DoDWAN pattern maps descriptor attributes to RE2 expressions that must all fully match
(an AND); a list of patterns is an OR. From a selector we derive a list of patterns that is
a *necessary* condition: every message the selector matches is matched by some pattern.
Messages that match no pattern need not travel to this host; the selector itself is still
evaluated locally on whatever arrives.

Only string tests on properties that ``attribute`` maps to a descriptor attribute are
used: ``p = 'x'``, ``p IN (...)`` and ``p LIKE '...'``, combined by AND and OR. Anything
else (numbers, NOT, IS NULL, ``<>``, unmapped properties) counts as TRUE, which only makes
the condition weaker, never wrong. The same holds for every limit: a factor of an AND that
would make too many disjuncts, an OR with too many disjuncts, an expression longer than
the pattern limit, or an attribute over the per-pattern limit is dropped (becomes TRUE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .like import ANY_ONE, LikePattern
from .nodes import And, Compare, Identifier, In, Like, Literal, Node, Or

AttributeOf = Callable[[str], str | None]
"""Property name -> descriptor attribute carrying its string value, or None."""


@dataclass(frozen=True, slots=True)
class _Constraint:
    """What one attribute's value must satisfy: a finite set, or LIKE patterns (all)."""

    values: frozenset[str] | None = None
    """Allowed values; None when not a finite set. (LIKEs are folded into a set.)"""
    likes: tuple[LikePattern, ...] = ()
    """Patterns the value must all match, when ``values`` is None."""

    def allows(self, value: str) -> bool:
        if self.values is not None:
            return value in self.values
        return all(like.matches(value) for like in self.likes)

    def implies(self, other: _Constraint) -> bool:
        """True when every value this allows, ``other`` allows too (a sufficient test)."""
        if self == other:
            return True
        if self.values is not None:
            return all(other.allows(v) for v in self.values)
        return other.values is None and set(other.likes) <= set(self.likes)

    def conjoin(self, other: _Constraint) -> _Constraint | None:
        """Both constraints at once; None when no value can satisfy them."""
        if self.values is None and other.values is None:
            likes = self.likes + tuple(p for p in other.likes if p not in self.likes)
            return _Constraint(likes=likes)
        if self.values is not None and other.values is not None:
            values = self.values & other.values
        else:
            finite, patterns = (self, other) if self.values is not None else (other, self)
            values = frozenset(v for v in finite.values or () if patterns.allows(v))
        return _Constraint(values) if values else None


Conjunction = dict[str, _Constraint]
"""Attribute -> constraint, all of which must hold; ``{}`` is TRUE."""

Disjunction = list[Conjunction]
"""At least one conjunction must hold; ``[]`` is FALSE, ``[{}]`` is TRUE."""


def _conjoin(a: Conjunction, b: Conjunction) -> Conjunction | None:
    out = dict(a)
    for attr, constraint in b.items():
        if attr in out:
            both = out[attr].conjoin(constraint)
            if both is None:
                return None
            out[attr] = both
        else:
            out[attr] = constraint
    return out


def _implies(a: Conjunction, b: Conjunction) -> bool:
    """True when ``a`` is at least as strict as ``b`` (``a OR b`` is just ``b``)."""
    return all(attr in a and a[attr].implies(c) for attr, c in b.items())


def _merge(a: Conjunction, b: Conjunction) -> Conjunction | None:
    """``a OR b`` as one conjunction when they differ only in one attribute's value set."""
    if a.keys() != b.keys():
        return None
    differing = [attr for attr in a if a[attr] != b[attr]]
    if len(differing) != 1:
        return None
    attr = differing[0]
    va, vb = a[attr].values, b[attr].values
    if va is None or vb is None:
        return None
    return {**a, attr: _Constraint(va | vb)}


def _add(disjunction: Disjunction, conjunction: Conjunction) -> None:
    """Add ``conjunction`` to ``disjunction`` in place, absorbing and merging where possible."""
    for i, existing in enumerate(disjunction):
        if _implies(conjunction, existing):
            return
        merged = _merge(existing, conjunction)
        if merged is not None:
            disjunction[i] = merged
            return
    disjunction[:] = [e for e in disjunction if not _implies(e, conjunction)]
    disjunction.append(conjunction)


class _Extractor:
    def __init__(self, attribute: AttributeOf, max_disjuncts: int) -> None:
        self.attribute = attribute
        self.max_disjuncts = max_disjuncts

    def disjunction(self, node: Node) -> Disjunction:
        if isinstance(node, Or):
            return self.any_of(node.operands)
        if isinstance(node, And):
            return self.all_of(node.operands)
        if isinstance(node, Compare) and node.op == "=":
            for ident, lit in ((node.left, node.right), (node.right, node.left)):
                if isinstance(ident, Identifier) and isinstance(lit, Literal):
                    value = lit.value
                    if isinstance(value, str):
                        return self.atom(ident, _Constraint(frozenset({value})))
        if isinstance(node, In) and not node.negated:
            return self.atom(node.identifier, _Constraint(node.values))
        if isinstance(node, Like) and not node.negated:
            literal = node.pattern.literal
            if literal is not None:
                return self.atom(node.identifier, _Constraint(frozenset({literal})))
            return self.atom(node.identifier, _Constraint(likes=(node.pattern,)))
        if isinstance(node, Literal) and node.value is False:
            return []
        return [{}]  # anything else: no constraint

    def atom(self, identifier: Identifier, constraint: _Constraint) -> Disjunction:
        attr = self.attribute(identifier.name)
        return [{}] if attr is None else [{attr: constraint}]

    def any_of(self, operands: tuple[Node, ...]) -> Disjunction:
        result: Disjunction = []
        for operand in operands:
            for conjunction in self.disjunction(operand):
                if not conjunction:
                    return [{}]
                _add(result, conjunction)
                if len(result) > self.max_disjuncts:
                    return [{}]
        return result

    def all_of(self, operands: tuple[Node, ...]) -> Disjunction:
        result: Disjunction = [{}]
        for operand in operands:
            factor = self.disjunction(operand)
            if factor == [{}]:
                continue
            product = self.product(result, factor)
            if product is None:
                continue  # too many disjuncts: leave this factor to local evaluation
            if not product:
                return []
            result = product
        return result

    def product(self, a: Disjunction, b: Disjunction) -> Disjunction | None:
        out: Disjunction = []
        for x in a:
            for y in b:
                both = _conjoin(x, y)
                if both is not None:
                    _add(out, both)
                    if len(out) > self.max_disjuncts:
                        return None
        return out


def re2_escape(text: str) -> str:
    """``text`` as an RE2 expression matching exactly it."""
    out = []
    for ch in text:
        if not ch.isascii() or ch.isalnum() or ch == " ":
            out.append(ch)
        elif ch.isprintable():
            out.append("\\" + ch)  # RE2: an escaped punctuation character is itself
        else:
            out.append(f"\\x{{{ord(ch):02x}}}")
    return "".join(out)


def like_regex(pattern: LikePattern) -> str:
    """An RE2 expression (full match) equivalent to a LIKE pattern; ``.`` matches newlines."""
    segments = (
        "".join("." if e is ANY_ONE else re2_escape(e) for e in segment)
        for segment in pattern.segments
    )
    return "(?s)" + ".*".join(segments)


def _regex(constraint: _Constraint) -> str:
    if constraint.values is not None:
        escaped = sorted(re2_escape(v) for v in constraint.values)
        return escaped[0] if len(escaped) == 1 else "(?:" + "|".join(escaped) + ")"
    # RE2 has no intersection: keep the most specific pattern (most literal characters).
    best = max(constraint.likes, key=lambda p: sum(e is not ANY_ONE for s in p.segments for e in s))
    return like_regex(best)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no descriptor can carry them either
        return False
    return True


def network_patterns(
    tree: Node,
    attribute: AttributeOf,
    *,
    max_disjuncts: int = 16,
    max_regex_length: int = 256,
    max_attributes: int = 16,
) -> list[dict[str, str]] | None:
    """Patterns (OR of AND) necessary for ``tree`` to match; None when that is everything.

    ``[]`` means no message can match the selector at all.
    """
    patterns: list[dict[str, str]] = []
    for conjunction in _Extractor(attribute, max_disjuncts).disjunction(tree):
        spec: dict[str, str] = {}
        for attr in sorted(conjunction):
            regex = _regex(conjunction[attr])
            if len(regex) <= max_regex_length and _encodable(regex):
                spec[attr] = regex
                if len(spec) == max_attributes:
                    break
        if not spec:
            return None
        if spec not in patterns:
            patterns.append(spec)
    return patterns
