"""Sans-IO STOMP 1.2 frame codec: an incremental parser fed bytes, and a serializer.

Owns the STOMP 1.2 wire grammar: command line, ``name:value`` headers (first occurrence
wins, escapes ``\\r \\n \\c \\\\`` except in CONNECT/CONNECTED frames), bodies delimited
either by ``content-length`` (binary-safe) or by the first NUL octet, and EOL heart-beats
between frames. Everything that arrives from a peer is bounded by :class:`FrameLimits`; any
violation raises :class:`ProtocolError` with a message fit for an ERROR frame, carrying
the frames completed before the invalid one (``frames``). No other exception escapes
:meth:`FrameParser.feed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

CLIENT_COMMANDS = frozenset(
    {
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    }
)
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
COMMANDS = CLIENT_COMMANDS | SERVER_COMMANDS
_RAW_HEADER_COMMANDS = frozenset({"CONNECT", "CONNECTED"})  # no escaping (STOMP 1.2 spec)

_UNESCAPE = {b"r": "\r", b"n": "\n", b"c": ":", b"\\": "\\"}
_UNESCAPE_11 = {k: v for k, v in _UNESCAPE.items() if k != b"r"}  # STOMP 1.1 has no \r
_ESCAPE_TABLE = str.maketrans({"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"})
_ESCAPE_TABLE_11 = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"})
"""STOMP 1.1 escapes (1.1 defines no ``\\r``); STOMP 1.0 has no escaping at all."""


class ProtocolError(Exception):
    """A peer sent bytes that are not a valid STOMP 1.2 frame (or exceed a limit)."""

    def __init__(self, message: str, frames: Iterable[Frame] = ()) -> None:
        super().__init__(message)
        self.frames = list(frames)
        """The valid frames the same :meth:`FrameParser.feed` completed before the invalid
        one, in order: the peer sent them, and they are to be handled first."""


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Bounds on what one peer may make the parser hold."""

    max_command_line: int = 64
    """Bytes in the command line."""
    max_header_line: int = 16 * 1024
    """Bytes in one header line."""
    max_headers: int = 128
    """Header lines in one frame."""
    max_body: int = 16 * 1024 * 1024
    """Bytes in one body."""


@dataclass(slots=True)
class Frame:
    """One STOMP frame: command, headers (first occurrence wins) and body bytes."""

    command: str
    """Upper-case command, e.g. ``SEND``."""
    headers: dict[str, str] = field(default_factory=dict)
    """Header name -> value, unescaped."""
    body: bytes = b""
    """Raw body bytes."""

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)


def encode(frame: Frame, *, content_length: bool = True, version: str = "1.2") -> bytes:
    """Serialise a frame; adds ``content-length`` for non-empty bodies unless told not to.

    ``version``: the STOMP version agreed with the peer — 1.2 escapes ``\\ \\r \\n :``
    in headers, 1.1 the same but ``\\r``, 1.0 nothing (a header a 1.0 peer could not read
    back — one with a line break, or ``:`` in its name — is a ValueError)."""
    if frame.command not in COMMANDS:
        raise ValueError(f"unknown STOMP command {frame.command!r}")
    raw = frame.command in _RAW_HEADER_COMMANDS or version == "1.0"
    table = _ESCAPE_TABLE_11 if version == "1.1" else _ESCAPE_TABLE
    if not raw:
        # the common case in one pass (MESSAGE, RECEIPT, SEND...): str headers, no NUL
        try:
            parts = [frame.command]
            for n, v in frame.headers.items():
                # (translate costs ten times these tests; most headers need no escape)
                if ":" in n or "\\" in n or "\n" in n or "\r" in n:
                    n = n.translate(table)
                if ":" in v or "\\" in v or "\n" in v or "\r" in v:
                    v = v.translate(table)
                parts.append(n + ":" + v)
        except (AttributeError, TypeError):  # a header that is not a str: the long way
            pass
        else:
            body = frame.body
            if content_length and body and "content-length" not in frame.headers:
                parts.append(f"content-length:{len(body)}")
            parts.append("\n")
            text = "\n".join(parts)
            if "\x00" not in text:
                return b"".join((text.encode("utf-8"), bytes(body), b"\x00"))
    lines = [frame.command]
    headers = dict(frame.headers)
    if content_length and frame.body and "content-length" not in headers:
        headers["content-length"] = str(len(frame.body))
    for name, value in headers.items():
        name, value = str(name), str(value)
        if "\x00" in name or "\x00" in value:
            raise ValueError(f"header {name!r} contains a NUL character")
        if raw:
            if ":" in name or any(c in name + value for c in "\r\n"):
                raise ValueError(f"header {name!r} cannot be sent unescaped in {frame.command}")
            lines.append(f"{name}:{value}")
        else:
            lines.append(f"{name.translate(table)}:{value.translate(table)}")
    head = ("\n".join(lines) + "\n\n").encode("utf-8")
    return head + bytes(frame.body) + b"\x00"


def for_stomp_10(frame: Frame) -> Frame:
    """``frame`` as a STOMP 1.0 peer can read it: a header 1.0 cannot carry (a line break
    in its name or value, ``:`` in its name) goes escaped as 1.2 escapes it, that header
    alone (1.0 defines no escapes: the peer sees the backslashes); every other header, the
    message id and the ack id among them, goes as it is."""
    headers = {}
    for name, value in frame.headers.items():
        name, value = str(name), str(value)
        if ":" in name or any(c in name + value for c in "\r\n"):
            name, value = name.translate(_ESCAPE_TABLE), value.translate(_ESCAPE_TABLE)
        headers[name] = value
    return Frame(frame.command, headers, frame.body)


def encode_many(frames: Iterable[Frame]) -> bytes:
    return b"".join(encode(f) for f in frames)


def make(command: str, headers: Mapping[str, str] | None = None, body: bytes = b"") -> Frame:
    return Frame(command, dict(headers or {}), body)


def _unescape(raw: bytes, what: str, table: dict[bytes, str] = _UNESCAPE) -> str:
    if b"\\" not in raw:
        return _decode(raw, what)
    out = bytearray()
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        code = raw[i + 1 : i + 2]
        if code not in table:
            shown = code.decode("latin-1") if code else "<end>"
            raise ProtocolError(f"undefined escape sequence '\\{shown}' in {what}")
        out += table[code].encode()
        i += 2
    return _decode(bytes(out), what)


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not valid UTF-8") from None


class FrameParser:
    """Incremental parser: ``feed(bytes)`` returns the frames completed by those bytes."""

    def __init__(self, limits: FrameLimits | None = None) -> None:
        self.limits = limits or FrameLimits()
        self._buf = bytearray()
        self._pos = 0
        self._frame: Frame | None = None  # headers parsed, waiting for the body
        self._length: int | None = None
        self._failed: ProtocolError | None = None
        self._scan = 0  # bytes before this index hold no terminator we are looking for
        self.heartbeats = 0
        """EOLs received between frames (heart-beats)."""
        self.version = "1.2"
        """STOMP version agreed with the peer: with 1.0, headers carry no escapes."""

    def feed(self, data: bytes) -> list[Frame]:
        """Consume ``data``; raise :class:`ProtocolError` on the first invalid frame (its
        ``frames``: those ``data`` completed before it), and again on any later call."""
        if self._failed is not None:
            raise ProtocolError(str(self._failed))
        self._buf += data
        frames: list[Frame] = []
        try:
            while True:
                frame = self._step()
                if frame is None:
                    break
                frames.append(frame)
        except ProtocolError as exc:
            exc.frames = frames
            self._failed = exc
            raise
        except Exception as exc:  # a bug must not leak through as something else
            self._failed = ProtocolError(f"malformed frame ({type(exc).__name__})", frames)
            raise self._failed from None
        if self._pos:
            del self._buf[: self._pos]
            self._scan = max(0, self._scan - self._pos)
            self._pos = 0
        return frames

    def _step(self) -> Frame | None:
        if self._frame is None:
            return self._head()
        return self._body()

    def _line(self, limit: int, what: str) -> bytes | None:
        end = self._buf.find(b"\n", self._pos)
        if end < 0:
            if len(self._buf) - self._pos > limit:
                raise ProtocolError(f"{what} longer than {limit} bytes")
            return None
        if end - self._pos > limit:
            raise ProtocolError(f"{what} longer than {limit} bytes")
        line = bytes(self._buf[self._pos : end])
        self._pos = end + 1
        return line[:-1] if line.endswith(b"\r") else line

    def _head(self) -> Frame | None:
        # Skip heart-beat EOLs between frames.
        buf = self._buf
        while self._pos < len(buf):
            c = buf[self._pos]
            if c == 0x0A:
                self._pos += 1
                self.heartbeats += 1
            elif c == 0x0D and self._pos + 1 < len(buf) and buf[self._pos + 1] == 0x0A:
                self._pos += 2
                self.heartbeats += 1
            elif c == 0x0D and self._pos + 1 >= len(buf):
                return None
            else:
                break
        if self._pos >= len(buf):
            return None
        # Need the whole header block before parsing it.
        start = self._pos
        # resume where the previous feed stopped looking (a terminator may straddle it)
        s0 = max(start, self._scan - 2)
        end = buf.find(b"\n\n", s0)
        # a CRLF blank line counts only before the LF one: search no further (the rest of
        # the buffer may hold many more frames)
        end_crlf = buf.find(b"\n\r\n", s0, len(buf) if end < 0 else end + 2)
        ends = [e for e in (end, end_crlf) if e >= 0]
        if not ends:
            budget = self.limits.max_command_line + (self.limits.max_header_line + 2) * (
                self.limits.max_headers + 1
            )
            if len(buf) - start > budget:
                raise ProtocolError("frame headers too large")
            # a NUL before the blank line means a frame without the blank line
            if buf.find(b"\x00", s0) >= 0:
                raise ProtocolError("frame ended before the blank line after its headers")
            limit = self.limits.max_command_line
            if len(buf) - start > limit and buf.find(b"\n", start, start + limit + 1) < 0:
                raise ProtocolError("command line too long")
            self._scan = len(buf)
            return None
        self._scan = 0
        if end >= 0 and (end_crlf < 0 or end < end_crlf):
            parsed = self._fast_head(start, end, end + 2)
        else:
            parsed = self._fast_head(start, end_crlf, end_crlf + 3)
        if parsed is not None:
            return self._headers_done(*parsed)
        command_line = self._line(self.limits.max_command_line, "command line")
        assert command_line is not None
        command = _decode(command_line, "command")
        if command not in COMMANDS:
            shown = command if len(command) <= 32 else command[:32] + "…"
            raise ProtocolError(f"unknown command {shown!r}")
        raw = command in _RAW_HEADER_COMMANDS or self.version == "1.0"
        headers: dict[str, str] = {}
        count = 0
        while True:
            line = self._line(self.limits.max_header_line, "header line")
            if line is None:  # pragma: no cover - guarded by the blank-line search above
                raise ProtocolError("truncated headers")
            if line == b"":
                break
            count += 1
            if count > self.limits.max_headers:
                raise ProtocolError(f"more than {self.limits.max_headers} headers")
            colon = line.find(b":")
            if colon <= 0:
                raise ProtocolError("header line without a name and a ':'")
            if raw:
                name = _decode(line[:colon], "header name")
                value = _decode(line[colon + 1 :], "header value")
            else:
                table = _UNESCAPE_11 if self.version == "1.1" else _UNESCAPE
                name = _unescape(line[:colon], "header name", table)
                value = _unescape(line[colon + 1 :], "header value", table)
            headers.setdefault(name, value)
        return self._headers_done(command, headers)

    def _fast_head(self, start: int, stop: int, after: int) -> tuple[str, dict[str, str]] | None:
        """The header block ``buf[start:stop]`` (its blank line ends at ``after``) parsed in
        one go when it is plain — valid UTF-8 within every limit, a known command, no
        escapes — which is what nearly every frame is; None leaves it to the line-by-line
        parser (which reports what is wrong)."""
        lim = self.limits
        if stop - start > lim.max_header_line:
            return None
        try:
            text = bytes(self._buf[start:stop]).decode("utf-8")
        except UnicodeDecodeError:
            return None
        lines = text.split("\n")
        command = lines[0]
        if len(command) > lim.max_command_line or len(lines) - 1 > lim.max_headers:
            return None
        if command.endswith("\r"):
            command = command[:-1]
        if command not in COMMANDS:
            return None
        if "\\" in text and not (command in _RAW_HEADER_COMMANDS or self.version == "1.0"):
            return None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not name or not colon:
                return None
            if value.endswith("\r"):
                value = value[:-1]
            if name not in headers:
                headers[name] = value
        self._pos = after
        return command, headers

    def _headers_done(self, command: str, headers: dict[str, str]) -> Frame | None:
        self._frame = Frame(command, headers)
        if command in ("CONNECT", "STOMP"):
            # the frames that follow in the same read are parsed before anyone answers
            # this CONNECT: a client offering only STOMP 1.0 sends them unescaped
            offered = {v.strip() for v in headers.get("accept-version", "1.0").split(",")}
            self.version = next((v for v in ("1.2", "1.1", "1.0") if v in offered), "1.2")
        length = headers.get("content-length")
        if length is not None:
            if not (length.isascii() and length.isdigit()) or len(length) > 12:
                raise ProtocolError(f"bad content-length {length[:20]!r}")
            n = int(length)
            if n > self.limits.max_body:
                raise ProtocolError(f"body of {n} bytes exceeds the {self.limits.max_body} limit")
            self._length = n
        else:
            self._length = None
        return self._body()

    def _body(self) -> Frame | None:
        assert self._frame is not None
        buf = self._buf
        if self._length is not None:
            end = self._pos + self._length
            if len(buf) <= end:
                return None
            if buf[end] != 0:
                raise ProtocolError("body longer than its content-length (no NUL after it)")
            body = bytes(buf[self._pos : end])
        else:
            end = buf.find(b"\x00", max(self._pos, self._scan))
            if end < 0:
                if len(buf) - self._pos > self.limits.max_body:
                    raise ProtocolError(f"body exceeds the {self.limits.max_body}-byte limit")
                self._scan = len(buf)
                return None
            if end - self._pos > self.limits.max_body:
                raise ProtocolError(f"body exceeds the {self.limits.max_body}-byte limit")
            body = bytes(buf[self._pos : end])
        self._pos = end + 1
        self._scan = 0
        frame = self._frame
        frame.body = body
        self._frame = None
        self._length = None
        return frame
