"""Topic wildcards as ActiveMQ and Artemis users write them, as DoDWAN regex profiles.

Topic names are ``.``-separated segments. In a subscription, a segment ``*`` matches one
segment and a last segment ``>`` (ActiveMQ; Artemis writes ``#``) matches zero or more,
as in ActiveMQ: ``news.*`` matches ``news.sport`` but neither ``news.sport.uk`` nor
``news``; ``news.>`` matches all three. A subscription to a wildcard topic becomes one RE2 full-match
expression on ``destination_id``, so the network filters it like any other topic.
Messages cannot be sent to a wildcard topic.
"""

from __future__ import annotations

import re
from functools import lru_cache

_ONE = "[^.@]+"


def is_wildcard(topic: str) -> bool:
    return any(seg in ("*", ">", "#") for seg in topic.split("."))


def check_wildcard(topic: str) -> None:
    """ValueError if ``>``/``#`` is not the last segment or a segment is empty."""
    segs = topic.split(".")
    if any(not s for s in segs):
        raise ValueError(f"topic {topic!r} has an empty segment")
    for i, s in enumerate(segs):
        if s in (">", "#") and i != len(segs) - 1:
            raise ValueError(f"'{s}' must be the last segment of a wildcard topic ({topic!r})")


def topic_regex(topic: str) -> str:
    """The RE2 full-match expression for a topic name, wildcards expanded."""
    segs = topic.split(".")
    tail = ""
    if segs[-1] in (">", "#"):
        segs.pop()
        tail = f"(?:\\.{_ONE})*" if segs else f"{_ONE}(?:\\.{_ONE})*"
    body = "\\.".join(_ONE if seg == "*" else re.escape(seg) for seg in segs)
    return body + tail


@lru_cache(maxsize=1024)
def _compiled(topic: str) -> re.Pattern[str]:
    return re.compile(topic_regex(topic))


def topic_matches(pattern: str, topic: str) -> bool:
    """Whether ``topic`` (a real topic name) is covered by subscription topic ``pattern``."""
    if pattern == topic:
        return True
    if not is_wildcard(pattern):
        return False
    return _compiled(pattern).fullmatch(topic) is not None
