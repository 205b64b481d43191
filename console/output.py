"""What the console prints: arriving messages as one readable line, notices and errors.

Printing is thread-safe and looks ``sys.stdout`` up at each call, so lines written by the
background arrival threads go through prompt_toolkit's ``patch_stdout`` proxy (above the
prompt, without corrupting the line being typed) in interactive mode.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from joms.api import BytesMessage, MapMessage, Message, StreamMessage, TextMessage, Topic

LABEL = "label"
"""The message property that carries ``pub -id``/``send -id``."""


class Printer:
    """Thread-safe line printer: results and arrivals to stdout, errors to stderr."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def line(self, text: str = "") -> None:
        with self._lock:
            print(text, file=sys.stdout, flush=True)

    def error(self, text: str) -> None:
        with self._lock:
            print(f"error: {text}", file=sys.stderr, flush=True)

    def notice(self, text: str) -> None:
        """Something that happened by itself (connection lost, reconnected...)."""
        with self._lock:
            print(f"! {text}", file=sys.stdout, flush=True)


def body_text(msg: Message) -> str:
    if isinstance(msg, TextMessage):
        return msg.text or ""
    if isinstance(msg, MapMessage):
        return json.dumps(msg.map, default=repr, sort_keys=True)
    if isinstance(msg, StreamMessage):
        return json.dumps(msg.items, default=repr)
    if isinstance(msg, BytesMessage):
        try:
            return msg.data.decode("utf-8")
        except UnicodeDecodeError:
            return f"<{len(msg.data)} bytes>"
    return ""


def _show(value: Any) -> str:
    text = str(value)
    return text if text and not any(c.isspace() for c in text) else json.dumps(text)


def describe(msg: Message, subscription: int | None = None) -> str:
    """One line (more if the text has several): where it came from, its id, properties, body.

    ``[1] topic ChatRoom1 id firstMSG language=English: Hello``
    """
    dest = msg.destination
    where = (
        f"topic {dest.name}"
        if isinstance(dest, Topic)
        else f"queue {dest.name}"
        if dest is not None
        else "?"
    )
    label = msg.get_property(LABEL)
    ident = label if label is not None else msg.message_id or "?"
    props = " ".join(f"{k}={_show(v)}" for k, v in sorted(msg.properties.items()) if k != LABEL)
    head = f"[{subscription}] " if subscription is not None else ""
    flags = " (redelivered)" if msg.redelivered else ""
    lines = body_text(msg).split("\n")
    first = f"{head}{where} id {_show(ident)}{' ' + props if props else ''}{flags}: {lines[0]}"
    return "\n".join([first, *("    " + rest for rest in lines[1:])])
