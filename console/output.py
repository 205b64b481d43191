"""What the console prints: arriving messages as one readable line, notices and errors.

Printing is thread-safe and looks ``sys.stdout`` up at each call, so lines written by the
background arrival threads go through prompt_toolkit's ``patch_stdout`` proxy (above the
prompt, without corrupting the line being typed) in interactive mode.

Bodies, labels, properties, destination names and host ids come from peers: what is printed
goes through :mod:`dodwan.textsafe` (controls, bidi and invisible characters escaped), each
field on its own (a name cannot fake a line) and every printed line again (an error message
may quote a peer's string too).

When the reader of stdout goes away (``joms sub -t T | head -1``) the printer does what a
Unix tool does on EPIPE: it stops quietly. stdout is pointed at ``/dev/null`` (so nothing
more fails, not even the flush at exit: the recipe of the Python docs, "Note on
SIGPIPE"), :attr:`Printer.closed` is set, and :meth:`Printer.line` raises
:class:`OutputClosed` so that the caller stops too (and does not acknowledge a message it
could not print). The console then exits with 141, as a tool killed by SIGPIPE does.
"""

from __future__ import annotations

import errno
import json
import os
import select
import stat
import sys
import threading
from typing import Any

from dodwan.pipes import to_devnull
from dodwan.textsafe import safe, safe_text
from joms.api import BytesMessage, MapMessage, Message, StreamMessage, TextMessage, Topic

LABEL = "label"
"""The message property that carries ``pub -id``/``send -id``."""


class OutputClosed(Exception):
    """stdout's reader went away (EPIPE): stop, quietly."""


def _pipe_reader_gone(stream: Any) -> bool:
    """Whether ``stream`` is a pipe whose reading end is closed (POLLERR on Linux and BSDs)."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR/POLLHUP are always reported
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _broken_pipe(exc: OSError) -> bool:
    return isinstance(exc, BrokenPipeError) or exc.errno in (errno.EPIPE, errno.ECONNRESET)


class Printer:
    """Thread-safe line printer: results and arrivals to stdout, errors to stderr."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.closed = threading.Event()
        """Set once stdout's reader went away: nothing more is printed."""

    def _write(self, stream: Any, text: str) -> bool:
        """Print one line; False when the stream's reader went away (then it is closed)."""
        if self.closed.is_set() and stream is sys.stdout:
            return False
        try:
            print(text, file=stream, flush=True)
        except OSError as exc:
            if not _broken_pipe(exc):
                raise
            to_devnull(stream)
            if stream is sys.stdout:
                self.closed.set()
            return False
        return True

    def reader_gone(self) -> bool:
        """Whether stdout's reader went away, checked without writing: a pipe whose reader
        closed reports POLLERR (a waiting ``sub`` learns it before the next arrival, not
        at it). Sets :attr:`closed` then."""
        if not self.closed.is_set() and _pipe_reader_gone(sys.stdout):
            with self._lock:
                to_devnull(sys.stdout)
                self.closed.set()
        return self.closed.is_set()

    def line(self, text: str = "") -> None:
        """Print a result or an arrival; :class:`OutputClosed` if it could not be."""
        with self._lock:
            if not self._write(sys.stdout, safe_text(text)):
                raise OutputClosed

    def error(self, text: str) -> None:
        with self._lock:
            self._write(sys.stderr, f"error: {safe_text(text)}")

    def notice(self, text: str) -> None:
        """Something that happened by itself (connection lost, reconnected...); called on
        background threads too, so a closed stdout is only recorded (:attr:`closed`)."""
        with self._lock:
            self._write(sys.stdout, f"! {safe_text(text)}")


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
