"""Where the daemon puts delivered messages: a directory, a command, or a live stream.

Each subscription key held by the daemon maps to one sink:

* ``dir``: the payload is written to ``OUTDIR/<name>`` and the descriptor beside it to
  ``OUTDIR/<name>.json``, the name made from the message id by :func:`file_name` (both written to a temporary name, then renamed, so a reader
  never sees half a file; the descriptor is renamed last).
* ``exec``: ``sh -c CMD`` runs with the payload on stdin and the descriptor in the
  environment (``DODWAN_ID``, ``DODWAN_SUBSCRIPTION``, ``DODWAN_DESCRIPTOR`` as JSON, and
  ``DODWAN_ATTR_<NAME>`` per attribute, names upper-cased with non-alphanumerics as ``_``;
  attributes whose names give one variable get none, see :func:`exec_environment`).
* ``follow``: deliveries are queued to the admin API clients streaming that key.

``on_done`` is told when a ``dir`` or ``exec`` delivery is finished (files renamed into
place, command ended, unless the shutdown stopped it); the daemon records it, and after a
crash or stop redoes the deliveries the core made but no sink finished (``exec`` then sees
``DODWAN_REDELIVERED=1``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import signal
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import MessageDelivered

log = logging.getLogger("dodwan.daemon.sinks")

KINDS = ("dir", "exec", "follow")
FOLLOW_BACKLOG = 10000
"""Deliveries queued for one follow stream before further ones are dropped (and counted)."""
FOLLOW_WINDOW = 32 * 1024 * 1024
"""Default payload bytes queued for one follow stream (setting ``follow_window``) before
further deliveries to it are dropped and counted (``sink_deliveries_follow_dropped``)."""
DIR_RETRY_FIRST = 1.0
DIR_RETRY_MAX = 60.0
DIR_RETRY_PENDING = 10000
"""Dir-sink writes that failed (out of file descriptors, disk full) wait, in order, and are
retried after 1 s, doubling up to 60 s, while the subscription lasts; beyond this many
waiting (all keys), the newest failures are left to the redelivery at the next start.
A waiting delivery keeps its payload while those kept total at most :data:`DIR_WAIT_MEMORY`
bytes (all keys); beyond that it holds its message id only, the payload read again from the
cache when it is written (given a ``reload`` function), and it is given up if the message
left the cache meanwhile."""
DIR_WAIT_MEMORY = 64 * 1024 * 1024
"""Default payload bytes kept by waiting dir-sink deliveries (setting ``dir_wait_memory``):
a message delivered here is among the first the cache evicts (``once`` ones especially), and
a waiting delivery holding only its id is lost when that happens before there is room."""
DIR_RETRY_BATCH = 64
"""Waiting deliveries written per turn of the event loop once the directory has room."""
EXEC_STOP_GRACE = 3.0
"""Seconds the commands still running at shutdown get between SIGTERM and SIGKILL (each
sent to the command's whole process group); a command stopped so is redone at the next
start."""
DIR_PERMANENT_ERRORS = frozenset({errno.ENAMETOOLONG})
"""Errors of a dir-sink write that retrying cannot cure (the path is too long whatever
the directory holds): logged and counted once, then the delivery is given up."""
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+@=-]{0,200}")
NAME_MAX = 255 - len("..json.tmp")
"""Longest name :func:`file_name` returns: the longest file made from it, the temporary
``.<name>.json.tmp``, then fits the 255 bytes file systems allow in a name."""
_HASHED_PREFIX = NAME_MAX - 33
"""Escaped characters kept before ``=`` and 32 hex digits of the id's SHA-256."""


def file_name(msg_id: str) -> str:
    """A file name for a message id (ids are printable but may contain ``/``).

    A plain id is its own name; another is ``%`` and the id percent-escaped; one whose
    escaped form is longer than :data:`NAME_MAX` is cut (never inside an escape) and ends
    with ``=`` and 32 hex digits of the id's SHA-256. An escaped name never contains a
    plain ``=`` and a plain one never starts with ``%``, so names stay distinct."""
    if _SAFE.fullmatch(msg_id) and not msg_id.endswith(".json"):
        return msg_id
    name = "%" + urllib.parse.quote(msg_id, safe="")
    if len(name) <= NAME_MAX:
        return name
    cut = _HASHED_PREFIX
    if "%" in name[cut - 2 : cut]:  # an escape would be cut: end before it
        cut = name.rindex("%", cut - 2, cut)
    digest = hashlib.sha256(msg_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{name[:cut]}={digest}"


def delivery_json(ev: MessageDelivered) -> dict[str, Any]:
    """A delivery as JSON (payload as UTF-8 text when it decodes, else base64)."""
    out: dict[str, Any] = {"subscription": ev.subscription, "descriptor": dict(ev.descriptor)}
    try:
        out["text"] = ev.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["payload_b64"] = base64.b64encode(ev.payload).decode("ascii")
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # no half-written file left in the user's directory
            tmp.unlink()
        raise


def write_to_dir(outdir: Path, ev: MessageDelivered) -> Path:
    """Write payload and descriptor; returns the payload path."""
    outdir.mkdir(parents=True, exist_ok=True)
    name = file_name(str(ev.descriptor.get("id", "unknown")))
    target = outdir / name
    _write_atomic(target, ev.payload)
    _write_atomic(
        outdir / f"{name}.json",
        json.dumps(dict(ev.descriptor), indent=2, sort_keys=True).encode() + b"\n",
    )
    return target


ATTR_PREFIX = "DODWAN_ATTR_"
OMITTED_VARIABLE = "DODWAN_ATTRS_OMITTED"
"""Set, as a JSON list of names, when some attribute has no ``DODWAN_ATTR_`` variable."""
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")


def attribute_variable(name: str) -> str:
    """``DODWAN_ATTR_`` and the attribute's name with each character that is not an ASCII
    letter or digit as ``_``, then upper-cased: ``a-b``, ``a.b``, ``a b`` and ``A_B`` all
    give ``DODWAN_ATTR_A_B``."""
    return ATTR_PREFIX + _NOT_ALNUM.sub("_", name).upper()


def exec_environment(
    ev: MessageDelivered, base: Mapping[str, str], redelivered: bool = False
) -> dict[str, str]:
    """The environment of an ``exec`` sink's command: ``base`` (the daemon's) without any
    variable of the names set here, then ``DODWAN_ID``, ``DODWAN_SUBSCRIPTION``,
    ``DODWAN_DESCRIPTOR`` (JSON: every attribute, exactly), ``DODWAN_REDELIVERED=1`` for a
    redelivery, and ``DODWAN_ATTR_<NAME>`` per attribute (:func:`attribute_variable`).

    No variable ever holds a value that is not its attribute's: when several attributes
    give one variable (``a-b`` and ``A_B``), none of them is set (which would be chosen is
    no rule a script could rely on), nor one whose value holds a NUL (no environment can).
    Those attributes are listed, sorted, as JSON in ``DODWAN_ATTRS_OMITTED``, set only
    then; ``DODWAN_DESCRIPTOR`` has them."""
    env = {
        k: v
        for k, v in base.items()
        if not k.startswith(ATTR_PREFIX) and k not in (OMITTED_VARIABLE, "DODWAN_REDELIVERED")
    }
    if redelivered:
        env["DODWAN_REDELIVERED"] = "1"
    env["DODWAN_ID"] = str(ev.descriptor.get("id", ""))
    env["DODWAN_SUBSCRIPTION"] = ev.subscription
    env["DODWAN_DESCRIPTOR"] = json.dumps(dict(ev.descriptor), sort_keys=True)
    by_variable: dict[str, list[str]] = {}
    for name in ev.descriptor:
        by_variable.setdefault(attribute_variable(name), []).append(name)
    omitted: list[str] = []
    for var, names in by_variable.items():
        value = ev.descriptor[names[0]]
        if len(names) > 1 or "\x00" in value:
            omitted.extend(names)
        else:
            env[var] = value
    if omitted:
        env[OMITTED_VARIABLE] = json.dumps(sorted(omitted))
    return env


class FollowQueue(asyncio.Queue["MessageDelivered | None"]):
    """A follow stream's queue that knows how many payload bytes it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def _put(self, item: MessageDelivered | None) -> None:
        super()._put(item)
        if item is not None:
            self.nbytes += len(item.payload)

    def _get(self) -> MessageDelivered | None:
        item: MessageDelivered | None = super()._get()
        if item is not None:
            self.nbytes -= len(item.payload)
        return item


@dataclass
class _DirBacklog:
    """A dir sink's deliveries waiting for its directory to take writes again (in order):
    the deliveries, or their message ids only beyond the router's payload budget when it can
    read payloads again (``reload``)."""

    target: str
    waiting: deque[str | MessageDelivered] = field(default_factory=deque)
    attempt: int = 0
    since: float = field(default_factory=time.monotonic)
    error: str = ""
    handle: asyncio.Handle | None = None
    written: int = 0
    given_up: int = 0


class SinkRouter:
    """Sinks by subscription key; dispatches deliveries without blocking the event loop."""

    def __init__(
        self,
        exec_timeout: float = 60.0,
        exec_concurrency: int = 4,
        on_done: Callable[[MessageDelivered], None] | None = None,
        follow_window: int = FOLLOW_WINDOW,
        reload: Callable[[str, str], MessageDelivered | None] | None = None,
        wait_memory: int = DIR_WAIT_MEMORY,
    ) -> None:
        """``reload(key, msg_id)``: the delivery of a cached message again (None when it is
        no longer cached), so that a dir delivery waiting for room beyond ``wait_memory``
        payload bytes (all keys) holds only its id."""
        self._on_done = on_done or (lambda ev: None)
        self._reload = reload
        self._backlogs: dict[str, _DirBacklog] = {}
        self._sinks: dict[str, tuple[str, str]] = {}
        self._followers: dict[str, set[FollowQueue]] = {}
        self._follow_window = follow_window
        self._retrying = 0
        self._wait_memory = max(0, wait_memory)
        self._waiting_bytes = 0  # payload bytes of the waiting deliveries kept whole
        self._exec_timeout = exec_timeout
        self._exec_slots = asyncio.Semaphore(exec_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: set[int] = set()
        """Process groups of the commands running (each command leads its own)."""
        self._closing = False
        self.counters: dict[str, int] = {}
        """By name without a prefix: the daemon exposes them as ``sink_<name>``."""

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # ------------------------------------------------------------------ table

    def set(self, key: str, kind: str, target: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown sink kind {kind!r}")
        self._sinks[key] = (kind, target)

    def remove(self, key: str) -> None:
        self._sinks.pop(key, None)
        self._drop_backlog(key)
        for q in self._followers.pop(key, set()):
            q.put_nowait(None)

    def get(self, key: str) -> tuple[str, str] | None:
        return self._sinks.get(key)

    def follow(self, key: str) -> FollowQueue:
        q = FollowQueue()
        self._followers.setdefault(key, set()).add(q)
        return q

    def unfollow(self, key: str, q: FollowQueue) -> int:
        """Detach a stream; returns how many streams remain on ``key``."""
        qs = self._followers.get(key, set())
        qs.discard(q)
        if not qs:
            self._followers.pop(key, None)
        return len(qs)

    # ------------------------------------------------------------------ dispatch

    def deliver(self, ev: MessageDelivered, redelivered: bool = False) -> bool:
        """Route one delivery; False when no sink holds its key."""
        sink = self._sinks.get(ev.subscription)
        if sink is None:
            self._count("deliveries_unrouted")
            return False
        kind, target = sink
        if kind == "dir":
            self._write_dir(target, ev)
        elif kind == "exec":
            if self._closing:
                return True  # not recorded finished: redone at the next start
            task = asyncio.get_running_loop().create_task(self._run(target, ev, redelivered))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            qs = self._followers.get(ev.subscription, set())
            for q in qs:
                if q.qsize() >= FOLLOW_BACKLOG or (
                    q.nbytes and q.nbytes + len(ev.payload) > self._follow_window
                ):  # a client that stopped reading
                    self._count("deliveries_follow_dropped")
                    continue
                q.put_nowait(ev)
            self._count("deliveries_follow" if qs else "deliveries_follow_unattended")
        return True

    def _write_dir(self, target: str, ev: MessageDelivered) -> None:
        """Write one delivery; when the directory cannot take it, the delivery waits in the
        key's backlog (behind those already waiting: deliveries stay in order)."""
        key = ev.subscription
        backlog = self._backlogs.get(key)
        if backlog is not None and backlog.target != target:  # the key's sink moved
            self._drop_backlog(key)
            backlog = None
        if backlog is not None:
            self._wait(backlog, ev)
            return
        try:
            write_to_dir(Path(target), ev)
        except OSError as exc:
            if exc.errno in DIR_PERMANENT_ERRORS:  # the same write would fail again
                self._give_up(target, ev, exc)
                return
            backlog = self._backlogs[key] = _DirBacklog(target, error=str(exc))
            self._wait(backlog, ev)
            log.error(
                "subscription %s: cannot write to %s: %s; deliveries wait and are retried "
                "after 1 s, doubling to 60 s (one line until it works again)",
                key,
                target,
                exc,
            )
            self._schedule(key, backlog)
            return
        self._count("deliveries_dir")
        self._on_done(ev)

    def _give_up(self, target: str, ev: MessageDelivered, exc: OSError) -> None:
        self._count("errors")
        log.error("subscription %s: cannot write to %s: %s (not retried)", ev.subscription,
                  target, exc)  # fmt: skip
        self._on_done(ev)  # a restart would fail the same way

    def _wait(self, backlog: _DirBacklog, ev: MessageDelivered) -> None:
        self._count("errors")
        if self._retrying >= DIR_RETRY_PENDING:
            self._count("dir_left_for_restart")
            return  # redone at the next start (its sink_done is not recorded)
        self._retrying += 1
        msg_id = ev.descriptor.get("id")
        size = len(ev.payload)
        if self._reload is not None and msg_id and (self._waiting_bytes + size > self._wait_memory):
            backlog.waiting.append(msg_id)
            return
        self._waiting_bytes += size
        backlog.waiting.append(ev)

    def _pop_waiting(self, backlog: _DirBacklog) -> None:
        """The oldest waiting delivery of ``backlog`` written or given up."""
        item = backlog.waiting.popleft()
        self._retrying -= 1
        if isinstance(item, MessageDelivered):
            self._waiting_bytes -= len(item.payload)

    def _schedule(self, key: str, backlog: _DirBacklog) -> None:
        delay = min(DIR_RETRY_MAX, DIR_RETRY_FIRST * 2**backlog.attempt)
        backlog.attempt += 1
        backlog.handle = asyncio.get_running_loop().call_later(delay, self._retry, key)

    def _retry(self, key: str) -> None:
        """Write the key's waiting deliveries, oldest first, :data:`DIR_RETRY_BATCH` per
        turn; at the first failure wait again (longer)."""
        backlog = self._backlogs.get(key)
        if backlog is None:
            return
        backlog.handle = None
        if self._closing:
            return  # not recorded finished: redone at the next start
        if self._sinks.get(key) != ("dir", backlog.target):  # unsubscribed (or moved)
            self._drop_backlog(key)
            return
        for _ in range(DIR_RETRY_BATCH):
            if not backlog.waiting:
                break
            item = backlog.waiting[0]
            ev = item if isinstance(item, MessageDelivered) else self._reload_one(key, item)
            if ev is None:  # no longer cached (expired, evicted): nothing to write it from
                self._pop_waiting(backlog)
                backlog.given_up += 1
                self._count("dir_given_up")  # the next start counts it as impossible too
                continue
            self._count("dir_retries")
            try:
                write_to_dir(Path(backlog.target), ev)
            except OSError as exc:
                if exc.errno in DIR_PERMANENT_ERRORS:
                    self._pop_waiting(backlog)
                    self._give_up(backlog.target, ev, exc)
                    continue
                backlog.error = str(exc)
                self._schedule(key, backlog)
                return
            self._pop_waiting(backlog)
            backlog.written += 1
            self._count("deliveries_dir")
            self._on_done(ev)
        if backlog.waiting:  # more to write: the next batch at the next turn
            backlog.handle = asyncio.get_running_loop().call_soon(self._retry, key)
            return
        del self._backlogs[key]
        log.info(
            "subscription %s: %s takes writes again after %.0f s: %d waiting deliveries written%s",
            key,
            backlog.target,
            time.monotonic() - backlog.since,
            backlog.written,
            f", {backlog.given_up} no longer cached (given up)" if backlog.given_up else "",
        )

    def _reload_one(self, key: str, msg_id: str) -> MessageDelivered | None:
        assert self._reload is not None
        return self._reload(key, msg_id)

    def _drop_backlog(self, key: str) -> None:
        backlog = self._backlogs.pop(key, None)
        if backlog is None:
            return
        if backlog.handle is not None:
            backlog.handle.cancel()
        self._retrying -= len(backlog.waiting)
        self._waiting_bytes -= sum(
            len(item.payload) for item in backlog.waiting if isinstance(item, MessageDelivered)
        )

    @property
    def dir_waiting(self) -> int:
        """Dir deliveries waiting for their directory to take writes again."""
        return self._retrying

    async def _run(self, command: str, ev: MessageDelivered, redelivered: bool = False) -> None:
        async with self._exec_slots:
            if self._closing:
                return  # queued when the daemon stopped: redone at the next start
            finished = await self._run_one(command, ev, redelivered)
        if finished:
            self._on_done(ev)  # whatever its outcome: a failed command is not retried

    async def _run_one(self, command: str, ev: MessageDelivered, redelivered: bool) -> bool:
        """Run the command once; False when the shutdown stopped it (not finished)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=exec_environment(ev, os.environ, redelivered),
                start_new_session=True,
            )
        except OSError as exc:
            self._count("errors")
            log.error("subscription %s: cannot run %r: %s", ev.subscription, command, exc)
            return True
        self._running.add(proc.pid)
        try:
            return await self._wait_command(proc, command, ev)
        finally:
            self._running.discard(proc.pid)

    async def _wait_command(
        self, proc: asyncio.subprocess.Process, command: str, ev: MessageDelivered
    ) -> bool:
        try:
            _, err = await asyncio.wait_for(
                proc.communicate(ev.payload), self._exec_timeout or None
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the whole group
            await proc.wait()
            self._count("errors")
            log.error("subscription %s: %r timed out", ev.subscription, command)
            return True
        except (BrokenPipeError, ConnectionResetError):
            err = b""
            await proc.wait()
        if proc.returncode == 0:
            self._count("deliveries_exec")
        elif self._closing:
            log.info(
                "subscription %s: %r stopped by the shutdown (redone at the next start)",
                ev.subscription,
                command,
            )
            return False
        else:
            self._count("errors")
            log.error(
                "subscription %s: %r exited with %s: %s",
                ev.subscription,
                command,
                proc.returncode,
                err.decode(errors="replace").strip()[:500],
            )
        return True

    def _signal_commands(self, sig: signal.Signals) -> None:
        for pgid in self._running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)

    async def close(self) -> None:
        """End follow streams; stop the commands still running (SIGTERM to their process
        groups, SIGKILL after :data:`EXEC_STOP_GRACE`) so none outlives the daemon."""
        self._closing = True
        for backlog in self._backlogs.values():  # not recorded finished: redone at next start
            if backlog.handle is not None:
                backlog.handle.cancel()
                backlog.handle = None
        for qs in self._followers.values():
            for q in qs:
                q.put_nowait(None)
        if not self._tasks:
            return
        self._signal_commands(signal.SIGTERM)
        _, pending = await asyncio.wait(list(self._tasks), timeout=EXEC_STOP_GRACE)
        if pending:
            self._signal_commands(signal.SIGKILL)
            await asyncio.wait(pending, timeout=EXEC_STOP_GRACE)
