"""The loopback admin API: a small HTTP/1.1 JSON server on asyncio streams.

One request per connection (``Connection: close``). Routes map to methods of the daemon's
:class:`AdminApp`; their results are JSON, ``/metrics`` is Prometheus text, and ``POST
/follow`` streams deliveries as newline-delimited JSON until the client disconnects.
The reference is ``docs/admin-api.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hmac
import ipaddress
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

log = logging.getLogger("dodwan.daemon.admin")

RAW_PAYLOAD = "\x00raw"
"""Body key under which a raw (``application/octet-stream``) request body is passed on."""

MAX_BODY = 96 * 1024 * 1024
"""Largest request body (a publication of the largest payload, base64-encoded)."""
MAX_HEADERS = 100
"""Header lines in one request."""
MAX_HEADER_LINE = 8192
"""Bytes in the request line or in one header line, its CRLF not counted."""
REQUEST_TIMEOUT = 10.0
"""Default seconds a client has to send its whole request (line, headers and body)."""
DRAIN_TIMEOUT = 10.0
"""After refusing an oversized body, seconds spent reading (and discarding) it so the client,
still sending, reads the 413 instead of a connection reset."""

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    408: "Request Timeout",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}


class ApiError(Exception):
    """A request the daemon refuses; becomes ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


SHOWN_UNKNOWN = 5
"""Unknown fields named in one error (the others are counted)."""
SHOWN_NAME = 64
"""Characters of an unknown field's name shown in an error."""


def check_fields(body: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
    """Refuse (``400``) a request object holding a field ``allowed`` does not name: a
    misspelt ``"tll"`` would otherwise be ignored and its default used in silence. The
    error names each unknown field (at most :data:`SHOWN_UNKNOWN`, each cut to
    :data:`SHOWN_NAME` characters), the close valid name when there is one, and the fields
    ``what`` (``"POST /publish"``, ...) takes. :data:`RAW_PAYLOAD` is the daemon's own."""
    unknown = sorted(str(k) for k in body if k not in allowed and k != RAW_PAYLOAD)
    if not unknown:
        return
    shown: list[str] = []
    for name in unknown[:SHOWN_UNKNOWN]:
        if len(name) > SHOWN_NAME:
            shown.append(repr(name[:SHOWN_NAME] + "…"))
            continue
        close = difflib.get_close_matches(name, allowed, n=1)
        shown.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    more = len(unknown) - len(shown)
    names = ", ".join(shown) + (f" and {more} more" if more else "")
    plural = "s" if len(unknown) > 1 else ""
    raise ApiError(
        400, f"unknown field{plural} {names} in {what}; its fields are {', '.join(allowed)}"
    )


class _TooLarge(ApiError):
    """A declared body over :data:`MAX_BODY` (answered 413, then drained)."""

    def __init__(self, length: int, message: str) -> None:
        super().__init__(413, message)
        self.length = length


class AdminApp(Protocol):
    def status(self) -> dict[str, Any]: ...
    def peers(self) -> dict[str, Any]: ...
    def profile(self) -> dict[str, Any]: ...
    def subscriptions(self) -> list[dict[str, Any]]: ...
    def cache_list(self) -> list[dict[str, Any]]: ...
    def cache_show(self, msg_id: str, payload: bool) -> dict[str, Any]: ...
    def cache_purge(self, msg_id: str) -> dict[str, Any]: ...
    def publish(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def subscribe(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def unsubscribe(self, key: str) -> dict[str, Any]: ...
    def follow(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...
    def metrics(self) -> str: ...
    def bridges_list(self) -> list[dict[str, Any]]: ...
    async def bridge_add(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def bridge_remove(self, name: str) -> dict[str, Any]: ...


Response = tuple[int, str, bytes]

JSON_TYPE = "application/json"
RAW_TYPE = "application/octet-stream"
"""The raw body of ``POST /publish`` (the only endpoint taking one)."""


def host_name(header: str) -> str:
    """The host of a ``Host`` header value, without its port or brackets, lowercased:
    ``[::1]:8080`` is ``::1``, ``LocalHost:80`` is ``localhost``."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def is_loopback_name(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _json(status: int, obj: Any) -> Response:
    return status, "application/json", json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n"


class AdminServer:
    """Serves one :class:`AdminApp` on a TCP port.

    With a ``token``, every request must carry ``Authorization: Bearer <token>`` (the daemon
    always sets one unless ``admin_without_token``).

    Requests a web browser could send for a page are refused whatever the token, so that a
    page can neither drive the API (cross-site request forgery) nor read it through a name
    resolving to loopback (DNS rebinding): one carrying an ``Origin`` header (browsers add it
    to cross-origin and to POST requests; no page uses this API) is answered ``403``, and so
    is one whose ``Host`` is not a loopback name nor the bound address, unless
    ``check_host`` is false (a non-loopback address: clients then use whatever name reaches
    the machine, and the token, always required there, protects the API). A request body must be ``application/json``
    (or ``application/octet-stream`` for ``POST /publish``), else ``415``: a browser sends a
    cross-origin body only as ``text/plain`` or a form.
    """

    def __init__(
        self,
        app: AdminApp,
        token: str | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        check_host: bool = True,
    ) -> None:
        self.app = app
        self.request_timeout = request_timeout
        self.check_host = check_host
        self._expected = None if token is None else f"Bearer {token}".encode()
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.Task[Any]] = set()
        self.address: tuple[str, int] = ("", 0)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port, limit=1 << 16)
        sock = self._server.sockets[0].getsockname()
        self.address = (str(sock[0]), int(sock[1]))
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            pending = list(self._streams)
            for t in pending:
                t.cancel()
            if pending:  # let follow streams run their clean-up while the daemon still can
                await asyncio.wait(pending, timeout=2.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    # ------------------------------------------------------------------ HTTP

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._streams.add(task)
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # never let one request take the daemon down
            log.exception("admin request failed")
        finally:
            if task is not None:
                self._streams.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    async def _line(reader: asyncio.StreamReader) -> bytes:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise ApiError(
                431, f"request line or header line longer than {MAX_HEADER_LINE} bytes"
            ) from None
        except asyncio.IncompleteReadError as exc:
            line = exc.partial
        # the line itself, without its end (CRLF, or LF alone); the reader's limit (64 KiB)
        # bounds what is read to find it
        end = 2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0
        if len(line) - end > MAX_HEADER_LINE:
            raise ApiError(431, f"request line or header line longer than {MAX_HEADER_LINE} bytes")
        return line

    async def _read_request(
        self, reader: asyncio.StreamReader
    ) -> tuple[str, str, dict[str, str], bytes]:
        """Request line, headers (bounded in number and size) and body."""
        parts = (await self._line(reader)).decode("latin-1").split()
        if len(parts) != 3:
            raise ApiError(400, "malformed request line")
        method, target, _version = parts
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = await self._line(reader)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise ApiError(431, f"more than {MAX_HEADERS} header lines")
        self._check_browser(headers)
        if self._expected is not None and not hmac.compare_digest(
            headers.get("authorization", "").encode("latin-1"), self._expected
        ):
            raise ApiError(401, "missing or wrong bearer token (see STATE_DIR/admin.token)")
        text = headers.get("content-length", "0") or "0"
        if not (text.isascii() and text.isdigit()) or len(text) > 15:
            raise ApiError(400, f"bad Content-Length {text[:20]!r}")
        length = int(text)
        if length > MAX_BODY:
            biggest = getattr(self.app, "max_payload", None)
            more = f"; the largest publication is {biggest()} bytes" if biggest else ""
            raise _TooLarge(length, f"request body of {length} bytes is over {MAX_BODY}{more}")
        raw = await reader.readexactly(length) if length else b""
        return method, target, headers, raw

    def _check_browser(self, headers: Mapping[str, str]) -> None:
        """Refuse (``403``) what a web page makes a browser send (see the class)."""
        if "origin" in headers:
            raise ApiError(
                403,
                f"request with an Origin header ({headers['origin'][:80]!r}) refused: the admin "
                "API is not for web pages (a browser adds Origin; other clients must not send it)",
            )
        if not self.check_host or "host" not in headers:
            return
        host = host_name(headers["host"])
        if is_loopback_name(host) or host == self.address[0].lower():
            return
        raise ApiError(
            403,
            f"request for host {headers['host'][:80]!r} refused: the admin API answers only "
            f"requests for localhost or {self.address[0]} (a name that resolves here is how a "
            "web page reaches it)",
        )

    @staticmethod
    def _check_content_type(method: str, path: str, headers: Mapping[str, str], raw: bytes) -> bool:
        """Whether the body is raw (``application/octet-stream``); ``415`` unless the body, if
        any, is ``application/json`` (or raw, for ``POST /publish``)."""
        given = headers.get("content-type")
        media = (given or "").partition(";")[0].strip().lower()
        if media == RAW_TYPE and method == "POST" and path == "/publish":
            return True
        if media == JSON_TYPE or (given is None and not raw):
            return False
        allowed = f"{JSON_TYPE} (or {RAW_TYPE} for POST /publish)"
        what = f"Content-Type {given[:80]!r}" if given is not None else "no Content-Type"
        raise ApiError(415, f"request body with {what}; the admin API takes {allowed}")

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.request_timeout):
                method, target, headers, raw = await self._read_request(reader)
        except TimeoutError:
            await self._send(
                writer,
                _json(408, {"error": f"request not received within {self.request_timeout:g} s"}),
            )
            return
        except _TooLarge as exc:
            await self._send(writer, _json(413, {"error": exc.message}))
            with contextlib.suppress(Exception):  # read what the client is still sending
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    left = exc.length
                    while left > 0 and (chunk := await reader.read(min(left, 1 << 20))):
                        left -= len(chunk)
            return
        except ApiError as exc:
            await self._send(writer, _json(exc.status, {"error": exc.message}))
            return
        url = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(url.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        try:
            body: dict[str, Any] = {}
            if self._check_content_type(method, path, headers, raw):
                # A raw payload; the other fields come as JSON in the X-Dodwan-Publish header.
                fields = headers.get("x-dodwan-publish", "") or "{}"
                body = self._json_object(fields, "the X-Dodwan-Publish header")
                body[RAW_PAYLOAD] = raw
            elif raw:
                body = self._json_object(raw)
            if method == "POST" and path == "/follow":
                try:
                    await self._stream(reader, writer, self.app.follow(body))
                except ConnectionError:  # the client reset the connection mid-stream: it left
                    log.debug("follow client %s went away", writer.get_extra_info("peername"))
                return
            response = await self._route(method, path, query, body)
        except ApiError as exc:
            response = _json(exc.status, {"error": exc.message})
        except Exception as exc:
            log.exception("admin request %s %s failed", method, path)
            response = _json(500, {"error": f"internal error: {exc}"})
        await self._send(writer, response)

    @staticmethod
    def _json_object(raw: bytes | str, what: str = "request body") -> dict[str, Any]:
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise ApiError(400, f"{what} is not JSON") from None
        except RecursionError:
            raise ApiError(
                400, f"{what} is not JSON this daemon accepts (nested too deeply)"
            ) from None
        if not isinstance(parsed, dict):
            raise ApiError(400, f"{what} must be a JSON object")
        parsed.pop(RAW_PAYLOAD, None)
        return parsed

    async def _route(
        self, method: str, path: str, query: dict[str, str], body: dict[str, Any]
    ) -> Response:
        app = self.app
        gets: dict[str, Callable[[], Any]] = {
            "/status": app.status,
            "/peers": app.peers,
            "/profile": app.profile,
            "/subscriptions": app.subscriptions,
            "/cache": app.cache_list,
        }
        if path in gets:
            if method != "GET":
                raise ApiError(405, f"{path} only accepts GET")
            return _json(200, gets[path]())
        if path == "/metrics":
            if method != "GET":
                raise ApiError(405, "/metrics only accepts GET")
            return 200, "text/plain; version=0.0.4; charset=utf-8", app.metrics().encode()
        posts: dict[str, Callable[[dict[str, Any]], Any]] = {
            "/publish": app.publish,
            "/subscribe": app.subscribe,
        }
        if path in posts:
            if method != "POST":
                raise ApiError(405, f"{path} only accepts POST")
            return _json(200, posts[path](body))
        if path.startswith("/subscriptions/") and len(path) > len("/subscriptions/"):
            key = path[len("/subscriptions/") :]
            if method != "DELETE":
                raise ApiError(405, "use DELETE /subscriptions/KEY")
            return _json(200, app.unsubscribe(key))
        if path == "/bridges":
            if method == "GET":
                return _json(200, app.bridges_list())
            if method == "POST":
                return _json(200, await app.bridge_add(body))
            raise ApiError(405, "use GET or POST /bridges")
        if path.startswith("/bridges/") and len(path) > len("/bridges/"):
            if method != "DELETE":
                raise ApiError(405, "use DELETE /bridges/NAME")
            return _json(200, await app.bridge_remove(path[len("/bridges/") :]))
        if path.startswith("/cache/") and len(path) > len("/cache/"):
            msg_id = path[len("/cache/") :]
            if method == "GET":
                return _json(200, app.cache_show(msg_id, query.get("payload") in ("1", "true")))
            if method == "DELETE":
                return _json(200, app.cache_purge(msg_id))
            raise ApiError(405, "use GET or DELETE /cache/ID")
        raise ApiError(404, f"no such endpoint: {method} {path}")

    async def _send(self, writer: asyncio.StreamWriter, response: Response) -> None:
        status, ctype, payload = response
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + payload)
        await writer.drain()

    async def _stream(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        items: AsyncIterator[dict[str, Any]],
    ) -> None:
        """NDJSON until the client hangs up or the daemon stops (no Content-Length)."""
        first: dict[str, Any] = await items.__anext__()  # may raise ApiError: sent as JSON
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
            b"Connection: close\r\n\r\n" + json.dumps(first).encode() + b"\n"
        )
        await writer.drain()
        # A blank line every ``heartbeat`` seconds of silence, when the client asked for it
        # (see Daemon.follow): its client tells a hung daemon from an idle stream.
        beat = first.get("heartbeat")
        heartbeat = float(beat) if isinstance(beat, (int, float)) else None
        hangup = asyncio.ensure_future(reader.read(1))
        step: asyncio.Future[dict[str, Any]] | None = None
        try:
            while True:
                nxt: Awaitable[dict[str, Any]] = items.__anext__()
                step = asyncio.ensure_future(nxt)
                while True:
                    done, _ = await asyncio.wait(
                        {step, hangup}, timeout=heartbeat, return_when=asyncio.FIRST_COMPLETED
                    )
                    if done:
                        break
                    writer.write(b"\n")
                    await writer.drain()
                if step not in done:  # the client hung up
                    break
                try:
                    item = step.result()
                except StopAsyncIteration:
                    break
                finally:
                    step = None
                writer.write(json.dumps(item).encode() + b"\n")
                await writer.drain()
        finally:
            hangup.cancel()
            if step is not None:  # stop the pending read: the generator runs its clean-up
                step.cancel()
                with contextlib.suppress(BaseException):
                    await step
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()
