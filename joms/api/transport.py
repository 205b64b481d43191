"""A small blocking STOMP 1.2 client on the JOMS frame codec: one socket, one reader thread.

Owns the connection life cycle (CONNECT/CONNECTED, heart-beat sending, DISCONNECT), request
receipts (``request()`` waits for the RECEIPT or raises the ERROR as a
:class:`~joms.errors.JMSException`), and hands MESSAGE frames to a callback. We use our own
codec rather than stomp.py so that every request can be made synchronous with a receipt and
a server ERROR surfaces at the call that caused it, which is what JMS callers expect.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlparse

from ..errors import (
    IllegalStateException,
    JMSException,
    JMSSecurityException,
    RequestTimeoutException,
)
from ..stomp.frame import Frame, FrameParser, ProtocolError, encode

DEFAULT_PORT = 61613


def parse_url(url: str) -> tuple[str, int]:
    """``stomp://HOST:PORT`` (or ``HOST:PORT``) -> (host, port)."""
    if "://" not in url:
        url = "stomp://" + url
    try:
        u = urlparse(url)
        host, port = u.hostname or "127.0.0.1", u.port or DEFAULT_PORT
    except ValueError as exc:  # urllib's wording: "Port could not be cast ...", "Invalid IPv6 URL"
        raise JMSException(f"bad STOMP URL {url!r}: {exc}") from None
    if u.scheme not in ("stomp", "tcp"):
        raise JMSException(f"unsupported URL scheme {u.scheme!r}: use stomp://HOST:PORT")
    return host, port


class StompTransport:
    """Blocking STOMP client; MESSAGE frames go to ``on_message`` on the reader thread."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        on_message: Callable[[Frame], None],
        on_error: Callable[[JMSException], None] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.timeout = timeout
        self._on_message = on_message
        self._on_error = on_error
        self._lock = threading.Lock()
        self._waiters: dict[str, tuple[threading.Event, list[Frame]]] = {}
        self._ids = itertools.count(1)
        self._failure: JMSException | None = None
        self._closed = False
        self._connected = threading.Event()
        self._connected_frame: Frame | None = None
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise JMSException(f"cannot connect to STOMP {host}:{port}: {exc}") from None
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = threading.Thread(
            target=self._read_loop, name="joms-stomp-reader", daemon=True
        )

    # ------------------------------------------------------------------ lifecycle
    def connect(self, headers: dict[str, str]) -> Frame:
        self._reader.start()
        self._write(Frame("CONNECT", {"accept-version": "1.2", "host": "joms", **headers}))
        if not self._connected.wait(self.timeout):
            self.close()
            raise JMSException("no CONNECTED answer from the STOMP server")
        if self._failure is not None:
            raise self._failure
        assert self._connected_frame is not None
        return self._connected_frame

    def close(self) -> None:
        if self._closed:
            return
        if self._failure is None:
            with contextlib.suppress(JMSException):
                self.request(Frame("DISCONNECT"), timeout=2.0)
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    @property
    def failed(self) -> JMSException | None:
        return self._failure

    def closed_error(self) -> IllegalStateException:
        """What a call made after the connection failed raises: not the failure itself,
        which belongs to the call (or the exception listener) it was reported to."""
        return IllegalStateException(f"connection closed: {self._failure}")

    # ------------------------------------------------------------------ requests
    def _write(self, frame: Frame) -> None:
        if self._failure is not None:
            raise self.closed_error()
        if self._closed:
            raise IllegalStateException("the connection is closed")
        data = encode(frame)
        with self._lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise self._fail(JMSException(f"connection lost: {exc}")) from None

    def send(self, frame: Frame) -> None:
        """Send without waiting."""
        self._write(frame)

    def request(self, frame: Frame, timeout: float | None = None) -> Frame | None:
        """Send with a receipt and wait for it (returned); raise the server's ERROR."""
        rid = f"r{next(self._ids)}"
        frame.headers["receipt"] = rid
        ev = threading.Event()
        box: list[Frame] = []
        self._waiters[rid] = (ev, box)
        try:
            self._write(frame)
            if not ev.wait(self.timeout if timeout is None else timeout):
                if self._failure is not None:
                    raise self._failure
                raise RequestTimeoutException(
                    f"no receipt for {frame.command} from the STOMP server"
                )
            if self._failure is not None and not box:
                raise self._failure
            return box[0] if box else None
        finally:
            self._waiters.pop(rid, None)

    # ------------------------------------------------------------------ reading
    def _fail(self, exc: JMSException) -> JMSException:
        if self._failure is None:
            self._failure = exc
            for ev, _ in list(self._waiters.values()):
                ev.set()
            self._connected.set()
            if self._on_error is not None and not self._closed:
                with contextlib.suppress(Exception):
                    self._on_error(exc)
        return self._failure

    def _read_loop(self) -> None:
        parser = FrameParser()
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError as exc:
                if not self._closed:
                    self._fail(JMSException(f"connection lost: {exc}"))
                return
            if not data:
                if not self._closed:
                    self._fail(JMSException("the STOMP server closed the connection"))
                return
            try:
                frames = parser.feed(data)
            except ProtocolError as exc:
                self._fail(JMSException(f"bad frame from the server: {exc}"))
                return
            for f in frames:
                self._dispatch(f)

    def _dispatch(self, f: Frame) -> None:
        if f.command == "MESSAGE":
            self._on_message(f)
        elif f.command == "RECEIPT":
            w = self._waiters.get(f.headers.get("receipt-id", ""))
            if w is not None:
                w[1].append(f)
                w[0].set()
        elif f.command == "CONNECTED":
            self._connected_frame = f
            self._connected.set()
        elif f.command == "ERROR":
            text = f.headers.get("message") or f.body.decode("utf-8", "replace")
            named = _exception_class(f.headers.get("joms-exception", ""))
            if named is not None:
                self._fail(named(text))
                return
            cls = JMSSecurityException if "login" in text else JMSException
            self._fail(_classify(text, cls))


def _exception_class(name: str) -> type[JMSException] | None:
    """The JMS exception class a server's ``joms-exception`` header names (None: unknown)."""
    from .. import errors

    cls = getattr(errors, name, None) if name in errors.__all__ else None
    if isinstance(cls, type) and issubclass(cls, JMSException):
        return cls
    return None


def _classify(text: str, default: type[JMSException]) -> JMSException:
    from .. import errors

    table: list[tuple[str, type[JMSException]]] = [
        ("invalid selector", errors.InvalidSelectorException),
        ("client id", errors.InvalidClientIDException),
        ("unknown destination", errors.InvalidDestinationException),
        ("queue name", errors.InvalidDestinationException),
        ("temporary queue", errors.InvalidDestinationException),
        ("property", errors.MessageFormatException),
        ("already in progress", errors.TransactionInProgressException),
        ("already active", errors.IllegalStateException),
        ("refused by this JOMS", errors.IllegalStateException),
    ]
    for needle, cls in table:
        if needle in text:
            return cls(text)
    return default(text)
