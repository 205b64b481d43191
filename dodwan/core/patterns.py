"""Selection patterns and interest profiles, matched with RE2 (linear time).

A *pattern* maps attribute names to regular expressions; it matches a descriptor when every
named attribute is present and its value fully matches the expression. A *profile* is a
union (OR) of patterns. Patterns arrive from peers, so they are bounded in number and
length and compiled with RE2, whose matching time is linear in the input: no pattern can
stall the node.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import re2

from .limits import Limits

_OPTIONS: Any = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.never_capture = True
REGEX_MEMORY = 96 * 1024
"""RE2's memory ceiling per compiled expression (its program and the caches matching
builds), which is what holding one costs at worst: measured, a 23-instruction expression
such as ``[ab]*a[ab]{14}`` grew to 88 KB after 200 matches under a 256 KiB ceiling, while
4,096 instructions (``limits.max_regex_program``) still compile under this one. When a
match needs more, RE2 falls back to its slower automaton, still in linear time."""
_OPTIONS.max_mem = REGEX_MEMORY
_LITERAL_MEMORY = 96
"""What an expression without operators costs beyond its text (it is a string compare)."""

PatternSpec = Mapping[str, str]


class PatternError(ValueError):
    """A pattern is malformed or exceeds a limit."""


class RegexError(PatternError):
    """RE2 refused an expression; ``reason`` is RE2's own explanation."""

    def __init__(self, regex: str, reason: str) -> None:
        super().__init__(f"invalid regular expression {regex!r}: {reason}")
        self.regex = regex
        self.reason = reason


COMPILED_KEPT = 256
"""Compiled expressions shared process-wide (hosts of a simulation, or a host's profiles
naming the same expression, compile it once): at most ``COMPILED_KEPT × REGEX_MEMORY``
(24 MiB) held beyond the profiles that use them."""


@lru_cache(maxsize=COMPILED_KEPT)
def compile_regex(regex: str) -> Any:
    """``regex`` compiled by RE2 as every pattern here is: linear-time matching, no capture
    groups, at most ``REGEX_MEMORY`` of program and matching caches; :class:`RegexError`
    when RE2 refuses it."""
    try:
        return re2.compile(regex, _OPTIONS)
    except Exception as exc:  # re2.error carries bytes messages
        msg = exc.args[0] if exc.args else exc
        if isinstance(msg, bytes):
            msg = msg.decode("utf-8", "replace")
        raise RegexError(regex, str(msg)) from None


_SPECIAL = frozenset("\\.+*?()|[]{}^$")
_PUNCTUATION = frozenset(string.punctuation)  # RE2: a backslash before one is the character


@dataclass(frozen=True, slots=True)
class _Equals:
    """An expression without operators (``news``, ``h1\\.r2``): its full match is string
    equality, far cheaper than a call into RE2 (most JOMS and reply-id patterns)."""

    text: str

    def fullmatch(self, value: str) -> bool | None:
        return True if value == self.text else None

    @property
    def programsize(self) -> int:
        """What RE2 would take for it (one instruction per character, and two more)."""
        return len(self.text) + 2


@lru_cache(maxsize=4096)
def _literal(regex: str) -> _Equals | None:
    """The string ``regex`` fully matches, when it is a plain string (special characters
    only escaped with a backslash, as ``re.escape`` writes them); None otherwise."""
    out: list[str] = []
    chars = iter(regex)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, None)
            if nxt is None or nxt not in _PUNCTUATION:
                return None  # \d, \n, \x41, \pL ...: not a plain character
            out.append(nxt)
        elif ch in _SPECIAL:
            return None
        else:
            out.append(ch)
    return _Equals("".join(out))


@dataclass(frozen=True, slots=True)
class Pattern:
    """One selection pattern: attribute name -> compiled expression (sorted by name)."""

    items: tuple[tuple[str, str], ...]
    _compiled: tuple[tuple[str, Any], ...]
    cost: int = field(default=0, compare=False)
    """RE2 instructions of its compiled expressions (what it costs to match)."""
    memory: int = field(default=0, compare=False)
    """Bytes holding it may take at worst (``REGEX_MEMORY`` per RE2 expression)."""

    @classmethod
    def from_spec(cls, spec: PatternSpec, limits: Limits | None = None) -> Pattern:
        """Validate and compile ``spec``; raises :class:`PatternError` or ``TypeError``."""
        lim = limits or Limits()
        if not isinstance(spec, Mapping):
            raise TypeError(
                f"a pattern is a mapping of attribute -> regex, not {type(spec).__name__}"
            )
        if not spec:
            raise PatternError("a pattern needs at least one attribute")
        if len(spec) > lim.max_pattern_attributes:
            raise PatternError(
                f"a pattern may constrain at most {lim.max_pattern_attributes} attributes"
            )
        items = []
        for name, regex in spec.items():
            if not isinstance(name, str) or not isinstance(regex, str):
                raise TypeError("pattern attribute names and expressions must be str")
            if not name or len(name) > lim.max_attribute_name:
                raise PatternError(f"bad attribute name {name!r}")
            if len(regex) > lim.max_regex_length:
                raise PatternError(
                    f"expression for {name!r} is longer than {lim.max_regex_length} characters"
                )
            items.append((name, regex))
        items.sort()
        checks = [(name, _literal(regex) or compile_regex(regex)) for name, regex in items]
        cost = memory = 0
        for name, rx in checks:
            literal = isinstance(rx, _Equals)
            memory += len(name) + (len(rx.text) + _LITERAL_MEMORY if literal else REGEX_MEMORY)
            size = rx.programsize
            if size > lim.max_regex_program:
                raise PatternError(
                    f"expression for {name!r} is too complex: {size} RE2 instructions, more "
                    f"than limits.max_regex_program ({lim.max_regex_program})"
                )
            cost += size
        # plain strings first: most descriptors are turned away by a string comparison
        checks.sort(key=lambda check: not isinstance(check[1], _Equals))
        return cls(tuple(items), tuple(checks), cost, memory)

    def matches(self, descriptor: Mapping[str, str]) -> bool:
        """True when every constrained attribute is present and fully matches."""
        for name, rx in self._compiled:
            value = descriptor.get(name)
            if value is None or rx.fullmatch(value) is None:
                return False
        return True

    def plain_constraint(self) -> tuple[str, str] | None:
        """Its first constraint in attribute order that is a plain string, as (name,
        text): a message lacking that value cannot match (None: every one is a regex)."""
        if self._compiled:
            name, check = self._compiled[0]  # plain strings come first, in name order
            if isinstance(check, _Equals):
                return name, check.text
        return None

    def spec(self) -> dict[str, str]:
        """The pattern as a plain dict."""
        return dict(self.items)


class Profile:
    """An interest profile: an OR of patterns, with a content-derived version tag."""

    __slots__ = ("patterns", "version")

    def __init__(self, patterns: Iterable[Pattern] = ()) -> None:
        unique = sorted(set(patterns), key=lambda p: p.items)
        self.patterns: tuple[Pattern, ...] = tuple(unique)
        digest = hashlib.blake2b(repr([p.items for p in unique]).encode(), digest_size=4)
        self.version: int = int.from_bytes(digest.digest(), "big")

    @classmethod
    def from_patterns(
        cls, specs: PatternSpec | Sequence[PatternSpec], limits: Limits | None = None
    ) -> Profile:
        """Build from one mapping or a sequence of mappings (an OR)."""
        lim = limits or Limits()
        spec_list = [specs] if isinstance(specs, Mapping) else list(specs)
        if len(spec_list) > lim.max_patterns:
            raise PatternError(f"a profile holds at most {lim.max_patterns} patterns")
        patterns, cost = [], 0
        for spec in spec_list:  # stop compiling as soon as the profile is too costly
            p = Pattern.from_spec(spec, lim)
            cost += p.cost
            if cost > lim.max_profile_program:
                raise PatternError(
                    f"the profile's expressions are too complex: more than "
                    f"limits.max_profile_program ({lim.max_profile_program}) RE2 instructions"
                )
            patterns.append(p)
        return cls(patterns)

    @property
    def cost(self) -> int:
        """RE2 instructions of all its expressions (see :attr:`Pattern.cost`)."""
        return sum(p.cost for p in self.patterns)

    @property
    def memory(self) -> int:
        """Bytes holding it may take at worst (see :attr:`Pattern.memory`)."""
        return sum(p.memory for p in self.patterns)

    def matches(self, descriptor: Mapping[str, str]) -> bool:
        """True when some pattern matches."""
        return any(p.matches(descriptor) for p in self.patterns)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and other.patterns == self.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)

    def specs(self) -> list[dict[str, str]]:
        """The patterns as plain dicts."""
        return [p.spec() for p in self.patterns]


class ProfileIndex:
    """Profiles under keys (hosts, local subscriptions), indexed by the plain value each of
    their patterns requires: which of them may match a descriptor, without matching it
    against every one.

    A pattern's first constraint in attribute order that is a plain string (see
    :meth:`Pattern.plain_constraint`, e.g. JOMS's ``destination_id`` or a host's ``dest``)
    can only match a descriptor holding that value, so a profile whose patterns all have one
    is looked at only when the descriptor holds one of its values; the others are looked at
    every time."""

    __slots__ = ("always", "by_name", "order", "profiles")

    def __init__(self, profiles: Iterable[tuple[str, Profile]]) -> None:
        self.profiles: dict[str, Profile] = dict(profiles)
        self.by_name: dict[str, dict[str, list[str]]] = {}
        """Attribute name -> value -> keys of the profiles with that constraint."""
        self.always: list[str] = []
        """Keys of the profiles every descriptor is looked at against."""
        self.order = {k: i for i, k in enumerate(self.profiles)}
        """Position of each key: candidates keep the order the profiles were given in."""
        for key, prof in self.profiles.items():
            plain = [p.plain_constraint() for p in prof.patterns]
            if None in plain:
                self.always.append(key)
                continue
            for name, text in dict.fromkeys(c for c in plain if c is not None):
                self.by_name.setdefault(name, {}).setdefault(text, []).append(key)

    def candidates(self, descriptor: Mapping[str, str]) -> list[str]:
        """Keys of the profiles that may match ``descriptor``, each once, in their order."""
        found = self.always
        merged = False
        for name, by_value in self.by_name.items():
            value = descriptor.get(name)
            if value is not None:
                keys = by_value.get(value)
                if keys is not None:
                    merged = bool(found)
                    found = found + keys if merged else keys
        if merged:  # several lists: one key may be in more than one
            found = sorted(set(found), key=self.order.__getitem__)
        return found

    def matching(self, descriptor: Mapping[str, str]) -> list[str]:
        """Keys of the profiles that match ``descriptor``, in their order: what matching
        every profile would give."""
        profiles = self.profiles
        return [k for k in self.candidates(descriptor) if profiles[k].matches(descriptor)]


def normalise_specs(specs: object) -> list[dict[str, str]]:
    """Accept one mapping or a sequence of mappings from a local caller; raise TypeError."""
    if isinstance(specs, Mapping):
        return [dict(specs)]
    if isinstance(specs, Sequence) and not isinstance(specs, str | bytes):
        out = []
        for s in specs:
            if not isinstance(s, Mapping):
                raise TypeError("each pattern must be a mapping of attribute -> regex")
            out.append(dict(s))
        if not out:
            raise ValueError("at least one pattern is needed")
        return out
    raise TypeError("patterns must be a mapping or a sequence of mappings")
