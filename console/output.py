"""What the console prints: arriving messages as one readable line, notices and errors.

Printing is thread-safe and looks ``sys.stdout`` up at each call, so lines written by the
background arrival threads go through prompt_toolkit's ``patch_stdout`` proxy (above the
prompt, without corrupting the line being typed) in interactive mode.

Bodies, labels, properties, destination names and host ids come from peers: what is printed
goes through :mod:`dodwan.textsafe` (controls, bidi and invisible characters escaped), each
field on its own (a name cannot fake a line) and every printed line again (an error message
may quote a peer's string too).
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from dodwan.textsafe import safe, safe_text
from joms.api import BytesMessage, MapMessage, Message, StreamMessage, TextMessage, Topic

LABEL = "label"
"""The message property that carries ``pub -id``/``send -id``."""


class Printer:
    """Thread-safe line printer: results and arrivals to stdout, errors to stderr."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def line(self, text: str = "") -> None:
        with self._lock:
            print(safe_text(text), file=sys.stdout, flush=True)

    def error(self, text: str) -> None:
        with self._lock:
            print(f"error: {safe_text(text)}", file=sys.stderr, flush=True)

    def notice(self, text: str) -> None:
        """Something that happened by itself (connection lost, reconnected...)."""
        with self._lock:
            print(f"! {safe_text(text)}", file=sys.stdout, flush=True)


def body_text(msg: Message) -> str:
    """The body as text, as the peer sent it (:func:`describe` escapes it for a terminal)."""
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
    """One word: as is (escaped) when it is one, else JSON-quoted (which escapes it too)."""
    text = str(value)
    return safe(text) if text and not any(c.isspace() for c in text) else json.dumps(text)


def describe(msg: Message, subscription: int | None = None) -> str:
    """One line (more if the text has several): where it came from, its id, properties, body.

    ``[1] topic ChatRoom1 id firstMSG language=English: Hello``
    """
    dest = msg.destination
    where = (
        f"topic {safe(dest.name)}"
        if isinstance(dest, Topic)
        else f"queue {safe(dest.name)}"
        if dest is not None
        else "?"
    )
    label = msg.get_property(LABEL)
    ident = label if label is not None else msg.message_id or "?"
    props = " ".join(
        f"{safe(k)}={_show(v)}"
        for k, v in sorted(msg.properties.items())
        if k != LABEL and not k.startswith("JMSX")  # (provider-set: JMSXDeliveryCount)
    )
    head = f"[{subscription}] " if subscription is not None else ""
    flags = " (redelivered)" if msg.redelivered else ""
    lines = safe_text(body_text(msg)).split("\n")
    first = f"{head}{where} id {_show(ident)}{' ' + props if props else ''}{flags}: {lines[0]}"
    return "\n".join([first, *("    " + rest for rest in lines[1:])])
