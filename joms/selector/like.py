"""LIKE patterns: parsing (``%``, ``_``, ESCAPE) and a matcher with no backtracking blow-up.

A pattern is cut at its ``%`` wildcards into fixed-length *segments* (literal characters and
``_``). A value matches when the first segment matches its start, the last segment its end,
and the middle segments occur in order in between; taking the leftmost occurrence of each
middle segment is always right because segments have a fixed length. The cost is at most
(value length x pattern length), whatever the pattern: no regular expression with ``.*``
ever runs against the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ANY_ONE = None
"""Element standing for ``_`` (any single character)."""

Element = str | None
"""A pattern element: one literal character, or :data:`ANY_ONE`."""


class LikeSyntaxError(ValueError):
    """A LIKE pattern or escape character is malformed; ``offset`` is within the pattern."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


class _Segment:
    """A run of pattern elements between two ``%``: fixed length, literal or with ``_``."""

    __slots__ = ("length", "literal", "regex")

    def __init__(self, elements: tuple[Element, ...]) -> None:
        self.length = len(elements)
        self.literal: str | None = None
        self.regex: re.Pattern[str] | None = None
        if ANY_ONE in elements:
            # Only literals and '.', no quantifier: a search costs len(value) x len(segment).
            body = "".join("." if e is ANY_ONE else re.escape(e) for e in elements)
            self.regex = re.compile(body, re.DOTALL)
        else:
            self.literal = "".join(e for e in elements if e is not None)

    def match_at(self, value: str, i: int) -> bool:
        if self.literal is not None:
            return value.startswith(self.literal, i)
        assert self.regex is not None
        return self.regex.match(value, i) is not None

    def find(self, value: str, start: int, end: int) -> int:
        """Leftmost index where the segment fits entirely in ``value[start:end]``, or -1."""
        if self.literal is not None:
            return value.find(self.literal, start, end)
        assert self.regex is not None
        found = self.regex.search(value, start, end)
        return -1 if found is None else found.start()


@dataclass(frozen=True, slots=True)
class LikePattern:
    """A parsed LIKE pattern: segments of elements separated by ``%``."""

    source: str
    """The pattern as written (without quotes)."""
    escape: str | None
    """The ESCAPE character, if any."""
    segments: tuple[tuple[Element, ...], ...]
    """Elements between ``%`` wildcards; one segment means the pattern has no ``%``."""
    _compiled: tuple[_Segment, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", tuple(_Segment(s) for s in self.segments))

    @classmethod
    def parse(cls, source: str, escape: str | None = None) -> LikePattern:
        """Parse ``source``; raise :class:`LikeSyntaxError` on a bad escape sequence."""
        if escape is not None and len(escape) != 1:
            raise LikeSyntaxError(f"ESCAPE must be a single character, not {escape!r}")
        segments: list[tuple[Element, ...]] = []
        current: list[Element] = []
        after_percent = False
        i = 0
        while i < len(source):
            ch = source[i]
            if ch == escape:
                nxt = source[i + 1 : i + 2]
                if nxt not in ("%", "_", escape):
                    raise LikeSyntaxError(
                        f"escape character {escape!r} must be followed by '%', '_' or itself",
                        i,
                    )
                current.append(nxt)
                after_percent = False
                i += 2
            elif ch == "%":
                if not after_percent:  # a run of % is one wildcard
                    segments.append(tuple(current))
                    current = []
                after_percent = True
                i += 1
            else:
                current.append(ANY_ONE if ch == "_" else ch)
                after_percent = False
                i += 1
        segments.append(tuple(current))
        return cls(source, escape, tuple(segments))

    @property
    def literal(self) -> str | None:
        """The only string the pattern matches, when it has no wildcard at all."""
        return self._compiled[0].literal if len(self._compiled) == 1 else None

    def matches(self, value: str) -> bool:
        """True when the whole of ``value`` matches the pattern."""
        segs = self._compiled
        first = segs[0]
        if len(segs) == 1:
            return len(value) == first.length and first.match_at(value, 0)
        last = segs[-1]
        end = len(value) - last.length
        if end < first.length or not (first.match_at(value, 0) and last.match_at(value, end)):
            return False
        pos = first.length
        for seg in segs[1:-1]:
            i = seg.find(value, pos, end)
            if i < 0:
                return False
            pos = i + seg.length
        return True
