"""Topic wildcards (joms.service.wildcards) and their regex form."""

from __future__ import annotations

import pytest

from joms.service.wildcards import check_wildcard, is_wildcard, topic_matches, topic_regex


@pytest.mark.parametrize(
    ("pattern", "topic", "hit"),
    [
        ("news.>", "news.sport", True),
        ("news.>", "news.sport.uk", True),
        ("news.>", "news", True),  # zero or more segments, as in ActiveMQ
        ("news.>", "newsx", False),
        (">", "a.b", True),
        ("news.*", "news.sport", True),
        ("news.*", "news.sport.uk", False),
        ("*.uk", "sport.uk", True),
        ("*.uk", "uk", False),
        ("news.#", "news.a.b", True),  # Artemis spelling
        ("a.b", "a.b", True),
        ("a.b", "a.bc", False),
        ("a.*", "ab.c", False),
        ("n.*", "n.x@h", False),
    ],
)
def test_matches(pattern: str, topic: str, hit: bool) -> None:
    assert topic_matches(pattern, topic) is hit


def test_literal_dots_are_escaped() -> None:
    assert topic_regex("a.b") == "a\\.b"
    assert not topic_matches("a.*", "aXb")


def test_wildcard_checks() -> None:
    assert is_wildcard("a.>") and is_wildcard("*") and not is_wildcard("a.b*")
    for bad in ("a.>.b", "a..*", ".>"):
        with pytest.raises(ValueError):
            check_wildcard(bad)
    check_wildcard("a.*.c.>")
