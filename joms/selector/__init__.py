"""JMS 1.1 message selectors (§3.8.1): parse once, match many messages, filter in the network.

>>> sel = parse("language IN ('English','French') AND JMSPriority > 4")
>>> sel.matches({"language": "English", "JMSPriority": 7})
True

Modules: ``lexer`` (tokens), ``parser`` (syntax tree and static checks), ``like`` (LIKE
patterns), ``evaluate`` (three-valued evaluation), ``patterns`` (DoDWAN patterns derived
from a selector). The language, its semantics and limits are described in
``docs/selectors.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import InvalidSelectorException
from .evaluate import Evaluator, compile_condition
from .nodes import Node
from .parser import HEADER_FIELDS, MAX_DEPTH, MAX_LENGTH, parse_tree
from .patterns import AttributeOf, network_patterns

__all__ = ["HEADER_FIELDS", "MAX_DEPTH", "MAX_LENGTH", "Selector", "parse"]


class Selector:
    """A parsed message selector. Immutable; build it with :func:`parse`."""

    __slots__ = ("_evaluate", "text", "tree")

    def __init__(self, text: str, tree: Node | None) -> None:
        self.text = text
        """The selector as written ("" for no selector)."""
        self.tree = tree
        """The syntax tree, or None when the selector matches every message."""
        self._evaluate: Evaluator | None = None if tree is None else compile_condition(tree)

    def matches(self, properties: Mapping[str, object]) -> bool:
        """True when the selector evaluates to TRUE (not FALSE, not UNKNOWN) for a message.

        ``properties`` holds the message's properties and header fields under their JMS
        names (``JMSPriority``, ``JMSType``, ...); a missing name is NULL.
        """
        return self._evaluate is None or self._evaluate(properties) is True

    def network_patterns(
        self,
        attribute: AttributeOf,
        *,
        max_disjuncts: int = 16,
        max_regex_length: int = 256,
        max_attributes: int = 16,
    ) -> list[dict[str, str]] | None:
        """DoDWAN patterns (an OR of attribute -> RE2 full-match dicts) that every message
        this selector matches also matches; None when nothing narrower than "everything"
        can be said, ``[]`` when no message can ever match.

        ``attribute(name)`` gives the descriptor attribute carrying property ``name`` as
        its plain string value, or None when the property is not in descriptors. The
        limits match DoDWAN's defaults; going over one drops a constraint (never wrong,
        only less selective).
        """
        if self.tree is None:
            return None
        return network_patterns(
            self.tree,
            attribute,
            max_disjuncts=max_disjuncts,
            max_regex_length=max_regex_length,
            max_attributes=max_attributes,
        )

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selector) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def parse(text: str | None) -> Selector:
    """Parse a selector; None, "" or only whitespace give one that matches everything.

    Raises :class:`joms.InvalidSelectorException` (with ``position`` set) on bad syntax,
    and ``TypeError`` when ``text`` is not a string.
    """
    if text is None:
        return Selector("", None)
    if not isinstance(text, str):
        raise TypeError(f"a selector is a str, not {type(text).__name__}")
    if not text.strip(" \t\f\n\r"):
        return Selector(text, None)
    try:
        return Selector(text, parse_tree(text))
    except RecursionError:  # MAX_DEPTH keeps clear of this unless the caller is deep already
        raise InvalidSelectorException("selector nested too deeply for the call stack") from None
