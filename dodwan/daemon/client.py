"""Client side of the admin API, used by the ``dodwan`` CLI (stdlib ``http.client`` only).

The daemon writes its admin address to ``STATE_DIR/admin.json`` once it serves; this module
reads it, sends one request per connection and turns every failure into
:class:`ClientError` with a message fit for one line of output.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .admin import MAX_HEADER_LINE

ADMIN_FILE = "admin.json"
TOKEN_FILE = "admin.token"
PUBLISH_HEADER = "X-Dodwan-Publish"
STREAM_HEARTBEAT = 15.0
"""Seconds between the blank lines a daemon sends on an idle ``/follow`` stream (asked for
in the request); :data:`STREAM_MISSED` of them missed and the stream is taken as dead."""
STREAM_MISSED = 3


def admin_path(*segments: str) -> str:
    """``/a/b/...`` with each segment percent-encoded whole (``/``, ``?``, ``#``, ``%`` too):
    a key or message id given by a user names that object, never another path or a query."""
    return "".join("/" + urllib.parse.quote(s, safe="") for s in segments)


class ClientError(Exception):
    """The daemon cannot be reached or refused the request."""


WAIT_STEP = 0.1
"""Seconds between two looks at a daemon being waited for."""


def _waited(message: str, wait: float) -> str:
    return f"{message}; waited {wait:g} s"


class AdminClient:
    def __init__(
        self, host: str, port: int, timeout: float = 30.0, token: str | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.token = token
        self._waiting: tuple[Path, float, float] | None = None
        """While waiting for the daemon to serve (:meth:`waiting_for`): its state directory,
        the monotonic deadline and the seconds waited in all."""

    @classmethod
    def for_state_dir(cls, state_dir: str | Path, timeout: float = 30.0) -> AdminClient:
        path = Path(state_dir) / ADMIN_FILE
        try:
            info = json.loads(path.read_text())
            client = cls(str(info["host"]), int(info["port"]), timeout)
            pid = int(info.get("pid", 0))
        except FileNotFoundError:
            raise ClientError(
                f"no daemon running for state directory {state_dir} ({path} not found)"
            ) from None
        except KeyError as exc:
            raise ClientError(
                f"cannot read {path}: it has no {exc.args[0]!r} (not written by a dodwan daemon?)"
            ) from None
        except (OSError, ValueError, TypeError) as exc:
            raise ClientError(f"cannot read {path}: {exc}") from None
        try:
            lines = (Path(state_dir) / TOKEN_FILE).read_text(encoding="utf-8").splitlines()
            client.token = lines[0].strip() if lines else None
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as exc:
            raise ClientError(f"cannot read the admin token {TOKEN_FILE}: {exc}") from None
        if pid > 0:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise ClientError(
                    f"no daemon running for state directory {state_dir} "
                    f"(stale {ADMIN_FILE} of process {pid})"
                ) from None
            except PermissionError:
                pass  # alive, another user's
        return client

    @classmethod
    def waiting_for(cls, state_dir: str | Path, wait: float, timeout: float = 30.0) -> AdminClient:
        """A client of the daemon of ``state_dir`` that waits up to ``wait`` seconds for it
        to serve (one still starting): while ``admin.json`` is missing or stale, and while its
        address refuses connections (a file left by a killed daemon whose PID now belongs to
        another process), it reads ``admin.json`` again (a restarted daemon writes a new one)
        and retries. The first request that connects ends the wait. After it, the error says
        it waited. ``wait`` 0 is :meth:`for_state_dir`."""
        deadline = time.monotonic() + wait
        while True:
            try:
                client = cls.for_state_dir(state_dir, timeout)
                break
            except ClientError as exc:
                if time.monotonic() >= deadline:
                    raise ClientError(_waited(str(exc), wait)) from None
            time.sleep(WAIT_STEP)
        if wait > 0:
            client._waiting = (Path(state_dir), deadline, wait)
        return client

    def _connect(self, conn: http.client.HTTPConnection) -> http.client.HTTPConnection:
        """``conn`` connected; while waiting for the daemon, a refused connection is retried
        (``admin.json`` read again) until the deadline."""
        while True:
            try:
                conn.connect()
                self._waiting = None  # the daemon serves: no more waiting
                return conn
            except ConnectionRefusedError:
                if self._waiting is None:
                    raise
                state_dir, deadline, wait = self._waiting
                if time.monotonic() >= deadline:
                    self._waiting = None
                    raise ClientError(
                        _waited(
                            f"the daemon at {self.host}:{self.port} is not reachable "
                            "(not running?)",
                            wait,
                        )
                    ) from None
            time.sleep(WAIT_STEP)
            try:
                fresh = AdminClient.for_state_dir(state_dir, self.timeout)
            except ClientError:
                continue  # admin.json being rewritten, or stale: the next round sees
            self.host, self.port, self.token = fresh.host, fresh.port, fresh.token
            conn = http.client.HTTPConnection(self.host, self.port, timeout=conn.timeout)

    def _open(
        self,
        method: str,
        path: str,
        body: Any = None,
        stream: bool = False,
        raw: bytes | None = None,
        sockets: list[socket.socket] | None = None,
    ) -> http.client.HTTPResponse:
        """Send the request and read the answer's head, each within ``timeout`` (a stream
        too: its reads after the head are timed by :meth:`stream`). ``sockets``: the
        connection's socket is appended to it."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        if self._waiting is not None:
            try:
                conn = self._connect(conn)
            except OSError as exc:
                raise ClientError(f"admin API at {self.host}:{self.port}: {exc}") from None
        headers: dict[str, str] = {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data: bytes | None
        if raw is not None:
            data = raw
            headers["Content-Type"] = "application/octet-stream"
            headers[PUBLISH_HEADER] = json.dumps(body or {}, ensure_ascii=True)
        else:
            data = None if body is None else json.dumps(body).encode()
            if data is not None:
                headers["Content-Type"] = "application/json"
        try:
            try:
                # ``path`` may hold segments already encoded by admin_path: '%' stays as is
                target = urllib.parse.quote(path, safe="/?=&%")
                conn.request(method, target, body=data, headers=headers)
                if sockets is not None and conn.sock is not None:
                    sockets.append(conn.sock)
            except (BrokenPipeError, ConnectionResetError):
                # The daemon may have refused the body (413) before reading all of it: its
                # answer is what the user needs to see, not the reset. A connection already
                # closed has no answer to read (the daemon died during the call).
                if data is None or conn.sock is None:
                    raise
            return conn.getresponse()
        except TimeoutError:
            raise ClientError(
                f"the daemon at {self.host}:{self.port} did not answer within {self.timeout:g} s "
                "(hung, stopped or overloaded?)"
            ) from None
        except ConnectionRefusedError:
            raise ClientError(
                f"the daemon at {self.host}:{self.port} is not reachable (not running?)"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ClientError(f"admin API at {self.host}:{self.port}: {exc}") from None

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Any:
        resp = self._open(method, path, body, raw=raw)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ClientError(f"admin API at {self.host}:{self.port}: {exc}") from None
        ctype = resp.getheader("Content-Type", "")
        if ctype.startswith("application/json"):
            try:
                result = json.loads(raw)
            except ValueError:
                raise ClientError("the daemon sent malformed JSON") from None
        else:
            result = raw.decode("utf-8", errors="replace")
        if resp.status != 200:
            msg = result.get("error") if isinstance(result, dict) else str(result)
            raise ClientError(str(msg or f"HTTP {resp.status}"))
        return result

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def publish_bytes(self, payload: bytes, **fields: Any) -> Any:
        """``POST /publish`` with a raw body (no base64); ``fields`` as in the JSON form.

        Fields too long for the ``X-Dodwan-Publish`` header line (long or non-ASCII
        attributes) go in the JSON form instead, the payload base64-encoded: whatever the
        daemon accepts can be published."""
        header = len(PUBLISH_HEADER) + len(": ") + len(json.dumps(fields, ensure_ascii=True))
        if header > MAX_HEADER_LINE:
            body = {**fields, "payload_b64": base64.b64encode(payload).decode("ascii")}
            return self.request("POST", "/publish", body)
        return self.request("POST", "/publish", fields, raw=payload)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def stream(
        self, path: str, body: Any, heartbeat: float | None = STREAM_HEARTBEAT
    ) -> Iterator[dict[str, Any]]:
        """POST and yield one JSON object per line until the daemon closes the stream.

        The daemon is asked for a blank line every ``heartbeat`` seconds while the stream
        is idle; when it says it sends them (in the first line, whose ``heartbeat`` key is
        taken out), a stream silent for :data:`STREAM_MISSED` of them is a
        :class:`ClientError` (a hung daemon), not a wait for ever. A daemon that does not
        send them (an older one) is waited for as long as it keeps the connection."""
        if heartbeat is not None and isinstance(body, dict):
            body = {**body, "heartbeat": heartbeat}
        sockets: list[socket.socket] = []
        resp = self._open("POST", path, body, stream=True, sockets=sockets)
        if resp.status != 200:
            try:
                err = json.loads(resp.read()).get("error")
            except (ValueError, AttributeError, OSError):
                err = None
            raise ClientError(str(err or f"HTTP {resp.status}"))
        first = True
        silent: float | None = self.timeout  # for the first line
        while True:
            try:
                line = resp.readline()
            except TimeoutError:
                raise ClientError(
                    f"the daemon at {self.host}:{self.port} sent nothing on the stream for "
                    f"{silent:g} s, not even its heartbeat (hung, stopped or overloaded?)"
                ) from None
            except OSError as exc:
                raise ClientError(f"stream interrupted: {exc}") from None
            if not line:
                return
            if not line.strip():  # a heartbeat
                continue
            try:
                item = json.loads(line)
            except ValueError:
                raise ClientError("the daemon sent a malformed line") from None
            if first:
                first = False
                beat = item.pop("heartbeat", None) if isinstance(item, dict) else None
                ok = isinstance(beat, (int, float)) and not isinstance(beat, bool) and beat > 0
                silent = STREAM_MISSED * float(beat) + 1.0 if ok else None
                for sock in sockets:
                    sock.settimeout(silent)
            yield item
