"""The daemon: one core Node driven by asyncio, UDP, SQLite, sinks and the admin API.

Shaped like aioquic's asyncio adapter: every input (a datagram, the timer, a local call)
is fed to the node with ``now = time.time()``, then :meth:`Daemon._after_input` drains the
node's datagrams into the pacer, routes its events and re-arms the single timer from
``get_timer()``. Wall-clock time is used (not the loop's monotonic clock) because message
deadlines are absolute and survive restarts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import fcntl
import inspect
import ipaddress
import json
import logging
import math
import os
import random
import re
import secrets
import signal
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..bridges import KEY_PREFIX as BRIDGE_PREFIX
from ..bridges import BridgeError, BridgeManager
from ..bridges.host import DaemonBridgeHost
from ..bridges.outbox import DB_FILE as BRIDGES_DB_FILE
from ..bridges.uri import KEYS as BINDING_KEYS
from ..core import (
    CacheFullError,
    MessageDelivered,
    MessageEvicted,
    NeighbourFound,
    NeighbourLost,
    NeighbourRestarted,
    Node,
    PatternError,
    Profile,
)
from ..core.errors import WireError
from .admin import MAX_BODY, RAW_PAYLOAD, AdminServer, ApiError, check_fields
from .collector import settle_collector
from .config import ATTRIBUTE_RESERVE, PUBLISH_MARGIN, DaemonConfig
from .memdebug import MemProbe
from .netkey import OVERHEAD as NETKEY_OVERHEAD
from .netkey import NetKey, NetKeyError, read_key_file, write_secret_file
from .pacer import Pacer
from .private import private_dir, private_file
from .service_host import SERVICE_PREFIX
from .sinks import KINDS, SinkRouter, delivery_json
from .sqlite_store import (
    SqliteStore,
    StoreError,
    check_plain_files,
    disk_room,
    sqlite_files,
)
from .transport import Medium, UdpTransport, medium_for, medium_text, parse_address

log = logging.getLogger("dodwan.daemon")

_LOOKAHEAD = 0.05
"""Seconds of air time of requested fragments handed to a paced link at a time; the node
keeps the rest and decides their order (see ``Node.datagrams_to_send``)."""

ADMIN_FILE = "admin.json"
LOCK_FILE = "daemon.lock"
DB_FILE = "dodwan.db"
TRACE_FILE = "trace.jsonl"
TOKEN_FILE = "admin.token"
JOMS_DB_FILE = "joms.sqlite"  # the JOMS service store (joms.stomp.host) with --stomp
DEFAULT_TTL = 3600.0
ACCEPT_EPISODE = 10.0
"""Seconds without an accept failure after which the next one starts a new episode (logged)."""
FOLLOW_HEARTBEAT = (0.2, 300.0)
"""Seconds a ``/follow`` client may ask between two heartbeats (blank lines) of an idle
stream."""
WATCH_PERIOD = 1.0
"""Seconds between two looks at the state directory and the write-ahead log (a few
``stat`` calls): see :meth:`Daemon._watch`."""


class DaemonError(Exception):
    """The daemon cannot start (message fit for one line of output)."""


PUBLISH_FIELDS = ("attributes", "text", "payload_b64", "ttl", "priority", "persistent")
"""The fields of ``POST /publish`` (JSON body or ``X-Dodwan-Publish`` header)."""
SUBSCRIBE_FIELDS = ("patterns", "key", "sink", "trusted_keys")
"""The fields of ``POST /subscribe``."""
SINK_FIELDS = ("kind", "target")
"""The fields of ``POST /subscribe``'s ``sink``."""
FOLLOW_FIELDS = ("patterns", "key", "trusted_keys", "heartbeat")
"""The fields of ``POST /follow``."""
_MISSING = object()


def _json_kind(value: Any) -> str:
    """What a JSON value is, for an error: ``a string ('no')``, ``4.0``, ``a boolean (true)``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return f"a string ({value[:40]!r}{'…' if len(value) > 40 else ''})"
    return "a list" if isinstance(value, list) else "an object"


def _field(
    body: Mapping[str, Any], name: str, kind: Any, expected: str, default: Any = _MISSING
) -> Any:
    """``body[name]`` if it is a ``kind`` (a JSON boolean is never a number here), else
    ``400`` naming the field, what it must be and what it is; ``default`` when absent."""
    value = body.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ApiError(400, f"{name} is required")
        return default
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise ApiError(400, f"{name} must be {expected}, not {_json_kind(value)}")


def _named(field: str) -> str:
    return field if " " in field else repr(field)


def generate_host_id() -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40] or "host"
    return f"{base}-{secrets.token_hex(3)}"


def _is_local(host: str) -> bool:
    """The default local addresses; anything else needs ``allow_remote`` and credentials."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip in (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def _read_secret_line(path: str, what: str) -> str:
    try:
        line = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DaemonError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DaemonError(f"{what} {path} is not UTF-8 text") from None
    if not line or not line[0]:
        raise DaemonError(f"{what} {path} is empty")
    return line[0]


def _metric_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


class Daemon:
    """One DoDWAN host. ``await run()`` serves until :meth:`stop` (or SIGINT/SIGTERM)."""

    def __init__(self, state_dir: str | Path, config: DaemonConfig) -> None:
        self.state_dir = Path(state_dir)
        self.config = config
        self.medium: Medium = medium_for(config.group, config.interface)
        admin_host, admin_port = parse_address(config.admin)
        if not _is_local(admin_host) and not config.allow_remote:
            raise ValueError(
                f"admin address {config.admin!r} is not a loopback address (by default only "
                "127.0.0.1 and ::1 are); listening elsewhere needs --allow-remote, and clients "
                "then need the token of STATE_DIR/admin.token"
            )
        if config.admin_without_token and not _is_local(admin_host):
            raise ValueError(
                f"admin_without_token is only for a loopback admin address, not {config.admin!r}"
            )
        self._admin_addr = (admin_host, admin_port)
        self._admin_token: str | None = None
        self.netkey: NetKey | None = None
        if config.network_key:
            try:
                self.netkey = NetKey(read_key_file(config.network_key), config.network_key_mode)
            except NetKeyError as exc:
                raise ValueError(f"--network-key: {exc}") from None
        self._signing_key: bytes | None = None
        if config.signing_key:
            try:
                self._signing_key = read_key_file(config.signing_key)
            except NetKeyError as exc:
                raise ValueError(f"--signing-key: {exc}") from None
        self.store: SqliteStore | None = None
        self.node: Node | None = None
        self._max_payload: tuple[Node, int] | None = None
        self.transport: UdpTransport | None = None
        self.pacer: Pacer | None = None
        self.sinks: SinkRouter | None = None
        self.admin: AdminServer | None = None
        self.joms_service: Any = None
        self._delivery_handler: Callable[[MessageDelivered], Any] | None = None
        self._stomp_server: Any = None
        self.bridges: BridgeManager | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._pump_handle: asyncio.Handle | None = None
        self._stopping = asyncio.Event()
        self._lock_fd: int | None = None
        self._trace_file: TextIO | None = None
        self._started = time.time()
        self.counters: dict[str, int] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self.host_id = ""
        self._memprobe: MemProbe | None = None
        self._memprobe_handle: asyncio.TimerHandle | None = None
        self._watch_handle: asyncio.TimerHandle | None = None
        self._wrote_admin = False
        self._instance = secrets.token_hex(16)  # in admin.json: removed at stop only if ours
        self._state_ids: dict[Path, tuple[int, int]] = {}  # (st_dev, st_ino) of state files
        self.state_lost = ""  # why the state directory no longer holds this daemon's state
        self._open_state_dir: int | None = None
        """The mode of a state directory other users may enter (warned about once started)."""
        self._accept_failed_at = 0.0
        self._store_failure_logged = 0.0

    # ------------------------------------------------------------------ lifecycle

    def _lock(self) -> None:
        self._open_state_dir = private_dir(self.state_dir)
        path = self.state_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            private_file(path)
        except OSError as exc:
            raise DaemonError(f"cannot use {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DaemonError(
                f"another daemon is running on state directory {self.state_dir}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _check_state_files(self) -> None:
        """Refuse at once, naming it, a directory (or other non-file) where this daemon is
        about to keep one of its files: the open would fail later, less clearly."""
        names = [ADMIN_FILE, ADMIN_FILE + ".tmp", *sqlite_files(Path(BRIDGES_DB_FILE))]
        if self.config.node.get("trace"):
            names.append(TRACE_FILE)
        if self.config.stomp:
            names += sqlite_files(Path(JOMS_DB_FILE))
        try:  # dodwan.db and its side files: SqliteStore checks them
            check_plain_files(self.state_dir / name for name in names)
        except StoreError as exc:
            raise DaemonError(str(exc)) from None

    def _state_dir_problem(self, exc: OSError) -> str:
        """Why the state directory cannot be used; mkdir says 'File exists' for a file of
        that name and 'Not a directory' for a file on the way: name the file instead."""
        if self.state_dir.exists() and not self.state_dir.is_dir():
            return f"state directory {self.state_dir} is not a directory"
        if isinstance(exc, NotADirectoryError):
            for parent in self.state_dir.parents:
                if parent.exists() and not parent.is_dir():
                    return (
                        f"cannot use state directory {self.state_dir}: {parent} is not a directory"
                    )
        return f"cannot use state directory {self.state_dir}: {exc.strerror}"

    async def start(self) -> None:
        try:
            self._lock()
        except OSError as exc:
            raise DaemonError(self._state_dir_problem(exc)) from None
        self._check_state_files()
        try:
            (self.state_dir / ADMIN_FILE).unlink(missing_ok=True)
        except OSError as exc:
            raise DaemonError(
                f"cannot remove {self.state_dir / ADMIN_FILE}: {exc.strerror}"
            ) from None
        self.store = SqliteStore(
            self.state_dir / DB_FILE,
            self.config.sqlite_synchronous,
            commit_delay=self.config.fragment_commit_delay,
            fragment_cache=self.config.fragment_cache,
        )
        host_id = self.config.host_id or self.store.get_meta("host_id") or generate_host_id()
        if self.store.get_meta("host_id") != host_id:
            self.store.set_meta("host_id", host_id)
            self.store.commit()
        self.host_id = host_id
        node_config = self.config.node_config(host_id, signing_key=self._signing_key)
        self.node = Node(node_config, rng=random.Random(), store=self.store)
        if node_config.trace:
            try:
                private_file(self.state_dir / TRACE_FILE)
                self._trace_file = open(  # noqa: SIM115  (open for the daemon's lifetime)
                    self.state_dir / TRACE_FILE,
                    "a",
                    encoding="utf-8",
                    buffering=1 << 16,
                    opener=lambda p, flags: os.open(p, flags, 0o600),
                )
            except OSError as exc:
                raise DaemonError(
                    f"cannot open {self.state_dir / TRACE_FILE}: {exc.strerror}"
                ) from None
        self.sinks = SinkRouter(
            self.config.exec_timeout,
            self.config.exec_concurrency,
            on_done=self._sink_done,
            follow_window=self.config.follow_window,
            reload=self._reload_delivery,
            wait_memory=self.config.dir_wait_memory,
        )
        for row in list(self.store.iter_sinks()):
            if row.kind == "follow" or row.key not in self.node.subscriptions():
                # A follow stream ended with the previous process; drop its subscription.
                self.store.delete_sink(row.key)
                with contextlib.suppress(KeyError):
                    self.node.unsubscribe(row.key, time.time())
                continue
            self.sinks.set(row.key, row.kind, row.target)
        self.store.commit()
        self._redo_deliveries()
        self.transport = UdpTransport(
            self.medium,
            self.config.socket_buffer,
            self.config.multicast_ttl,
            self.netkey,
            offload=self.config.udp_offload,
        )
        now = time.time()
        self.pacer = Pacer(
            self.transport.send,
            float(self.config.bitrate),
            self.config.burst,
            now,
            overhead=NETKEY_OVERHEAD if self.netkey is not None else 0,
            send_many=self.transport.send_many,
        )
        await self.transport.start(self._on_datagram, self._after_input)
        self.bridges = BridgeManager(
            DaemonBridgeHost(self), list(self.config.bridges), self.config.sqlite_synchronous
        )
        try:
            await self.bridges.start()
        except (sqlite3.Error, OSError) as exc:
            raise DaemonError(f"cannot open {self.state_dir / BRIDGES_DB_FILE}: {exc}") from None
        if not self.config.admin_without_token:
            self._admin_token = self._load_token()
        self.admin = AdminServer(
            self,
            token=self._admin_token,
            request_timeout=self.config.admin_request_timeout,
            # off loopback (--allow-remote) clients use whatever name reaches the machine,
            # and the token is always required there
            check_host=_is_local(self._admin_addr[0]),
        )
        try:
            host, port = await self.admin.start(*self._admin_addr)
        except OSError as exc:
            raise DaemonError(
                f"cannot listen on admin address {self.config.admin}: {exc.strerror}"
            ) from None
        if self.config.stomp:
            await self._start_stomp(self.config.stomp)
        stomp = self._stomp_address()
        info: dict[str, Any] = {"host": host, "port": port, "pid": os.getpid(), "host_id": host_id}
        info["stomp"] = stomp  # the JOMS STOMP gateway "HOST:PORT", or None without one
        info["instance"] = self._instance  # which process wrote it (see close())
        tmp = self.state_dir / (ADMIN_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(info) + "\n")
            os.replace(tmp, self.state_dir / ADMIN_FILE)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise DaemonError(
                f"cannot write {self.state_dir / ADMIN_FILE}: {exc.strerror}"
            ) from None
        self._wrote_admin = True
        self._remember_state_files()
        log.info(
            "host %s on %s %s via %s; admin http://%s:%d/; %s",
            host_id,
            self.medium.kind,
            medium_text(self.medium),
            self.medium.interface,
            host,
            port,
            f"JOMS STOMP gateway stomp://{stomp}"
            if stomp
            else "no STOMP gateway (start with --stomp 127.0.0.1:61613 for JOMS)",
        )
        if self._open_state_dir is not None:
            log.warning(
                "state directory %s is mode %04o: other users may list it (its files are 0600 "
                "but their names show); chmod 700 it",
                self.state_dir,
                self._open_state_dir,
            )
        self._after_input()
        self._watch_handle = asyncio.get_running_loop().call_later(WATCH_PERIOD, self._watch)
        self._memprobe = MemProbe.from_environment()
        if self._memprobe is not None:
            self._memprobe_handle = asyncio.get_running_loop().call_later(
                self._memprobe.period, self._memprobe_sample
            )

    def _stomp_address(self) -> str | None:
        """Where the STOMP gateway listens ("HOST:PORT", the bound port), or None."""
        server = self._stomp_server
        sockets = getattr(server, "sockets", None) if server is not None else None
        if not sockets:
            return None
        name = sockets[0].getsockname()
        host = str(name[0])
        return f"[{host}]:{name[1]}" if ":" in host else f"{host}:{name[1]}"

    def _remember_state_files(self) -> None:
        """Note which files the state directory, its lock and database are (device, inode),
        for :meth:`_watch`."""
        for path in (self.state_dir, self.state_dir / LOCK_FILE, self.state_dir / DB_FILE):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                self._state_ids[path] = (st.st_dev, st.st_ino)

    def _state_problem(self) -> str:
        """Why the state directory no longer holds this daemon's state ('' when it does):
        the directory, its lock or its database removed or replaced under it (a tmp cleaner,
        an ``rm``). A few ``stat`` calls."""
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                if os.fstat(self._lock_fd).st_nlink == 0:
                    return f"its lock file {self.state_dir / LOCK_FILE} was removed"
        for path, ident in self._state_ids.items():
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return f"{path} was removed"
            except OSError as exc:
                return f"{path} cannot be looked at ({exc.strerror})"
            if (st.st_dev, st.st_ino) != ident:
                return f"{path} was replaced by another file"
        return ""

    def _watch(self) -> None:
        """Every :data:`WATCH_PERIOD`: while a foreign reader keeps the write-ahead log from
        being emptied, ask for a checkpoint (it empties the log once the reader is gone,
        even if nothing is written meanwhile); and check that the state directory still
        holds this daemon's state (:meth:`_state_problem`)."""
        store = self.store
        if store is not None and store.wal_held_now:
            store.poke_checkpoint()
        if not self.state_lost:
            problem = self._state_problem()
            if problem:
                self.state_lost = problem
                self._count("state_lost")
                log.error(
                    "%s while the daemon runs: what it stores now would be lost at the next "
                    "start, so new publications and subscriptions are refused (503). The "
                    "daemon keeps carrying the messages it holds; restart it to start afresh "
                    "(with a new database; the messages held only in memory are lost then)",
                    problem,
                )
        self._watch_handle = asyncio.get_running_loop().call_later(WATCH_PERIOD, self._watch)

    def _check_state(self) -> None:
        """Refuse a change this daemon could not keep: its state directory is gone."""
        if self.state_lost:
            raise ApiError(
                503,
                f"the daemon's state is gone ({self.state_lost}): nothing new can be stored; "
                "restart the daemon",
            )

    def health(self) -> dict[str, Any]:
        """``{"ok": bool, "problems": [one line each]}`` for ``GET /status``."""
        problems: list[str] = []
        if self.state_lost:
            problems.append(
                f"state lost: {self.state_lost}; new publications and subscriptions are "
                "refused (restart the daemon)"
            )
        store = self.store
        if store is not None and store.wal_held_now:
            problems.append(
                f"the write-ahead log {store.path}-wal is over its limit: another program "
                "holds a read transaction on the database (writes go on)"
            )
        return {"ok": not problems, "problems": problems}

    def _memprobe_sample(self) -> None:
        """One sample of :mod:`dodwan.daemon.memdebug` (only with DODWAN_MEMTRACE set)."""
        probe = self._memprobe
        if probe is None:
            return
        try:
            probe.sample(self._memprobe_extra())
        except Exception:
            log.exception("memory probe failed")
        self._memprobe_handle = asyncio.get_running_loop().call_later(
            probe.period, self._memprobe_sample
        )

    def _memprobe_extra(self) -> dict[str, Any]:
        """The daemon's own tables for a memory sample."""
        extra: dict[str, Any] = {
            "tasks": len(asyncio.all_tasks()),
            "daemon_tasks": len(self._tasks),
        }
        if self.store is not None:
            extra["store"] = {
                "frag_messages": len(self.store._frags),
                "frags_bytes": self.store._frags_bytes,
                "unwritten": len(self.store._unwritten),
            }
        if self.node is not None:
            # dir(), not vars(): the compiled core's objects have no __dict__
            node = self.node
            private = (k for k in dir(node) if k.startswith("_") and not k.startswith("__"))
            tables = ((k, getattr(node, k, None)) for k in private)
            extra["node"] = {k: len(v) for k, v in tables if isinstance(v, (dict, list, set))}
        if self.admin is not None:
            extra["admin_streams"] = len(self.admin._streams)
        if self.sinks is not None:
            extra["sink_tasks"] = len(self.sinks._tasks)
        if self.pacer is not None:
            extra["pacer_queued"] = self.pacer.queued
        return extra

    def _load_token(self) -> str:
        """The admin bearer token of STATE_DIR/admin.token (made once, mode 0600)."""
        path = self.state_dir / TOKEN_FILE
        if path.exists():
            token = _read_secret_line(str(path), "admin token file")
            if len(token) >= 32:
                try:  # owner-only, whoever made it
                    os.chmod(path, 0o600)
                except OSError as exc:
                    raise DaemonError(f"cannot make {path} mode 0600: {exc.strerror}") from None
                return token
        token = secrets.token_urlsafe(32)
        try:
            write_secret_file(path, token + "\n", force=True)
        except OSError as exc:
            raise DaemonError(f"cannot write {path}: {exc.strerror}") from None
        return token

    def _sink_done(self, ev: MessageDelivered) -> None:
        if self.store is None:
            return
        try:
            deadline = float(ev.descriptor.get("deadline", "0"))
        except ValueError:
            deadline = 0.0
        self.store.sink_done(str(ev.descriptor.get("id", "")), ev.subscription, deadline)
        self._count("sink_deliveries_finished")
        self.store.commit()  # recorded: a restart will not run this sink again

    def _reload_delivery(self, key: str, msg_id: str) -> MessageDelivered | None:
        """A cached message's delivery to ``key`` again (a dir sink's delivery that waited
        for room beyond ``dir_wait_memory`` holds only the id); None when it is no longer
        cached."""
        node = self.node
        if node is None:
            return None
        entry = node.cache_entry(msg_id)
        payload = node.message_payload(msg_id)
        if entry is None or payload is None:
            return None
        return MessageDelivered(key, entry["descriptor"], payload)

    def _redo_deliveries(self) -> None:
        """Deliveries the core made before a crash that their dir/exec sink did not finish.

        Such a delivery may have been made to an earlier subscription of the same key (one
        in progress when it was removed): it is redone only if the key's subscription now
        accepts the message (patterns, trusted keys), as the core would deliver it; else
        it is over, recorded as done so that no later start looks at it again."""
        node, store, sinks = self.node, self.store, self.sinks
        assert node is not None and store is not None and sinks is not None
        undone = store.unfinished_deliveries()
        store.purge_sink_done(time.time())
        for msg_id, key, deadline in undone:
            payload = node.message_payload(msg_id)
            entry = node.cache_entry(msg_id)
            if payload is None or entry is None:  # no longer cached: nothing to redo it from
                self._count("redeliveries_impossible")
                store.sink_done(msg_id, key, deadline)
                continue
            if not node.subscription_accepts(key, msg_id):
                self._count("redeliveries_declined")
                store.sink_done(msg_id, key, deadline)
                log.info(
                    "not redelivering %s to %s: its subscription now does not accept it",
                    msg_id,
                    key,
                )
                continue
            self._count("redeliveries")
            sinks.deliver(MessageDelivered(key, entry["descriptor"], payload), redelivered=True)
            log.info("redelivered %s to %s (unfinished before a restart)", msg_id, key)
        store.flush()

    async def _start_stomp(self, address: str) -> None:
        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise DaemonError(f"--stomp: {exc}") from None
        login: str | None = self.config.stomp_login or None
        passcode: str | None = None
        if self.config.stomp_passcode_file:
            passcode = _read_secret_line(self.config.stomp_passcode_file, "STOMP passcode file")
        if not _is_local(host):
            if not self.config.allow_remote:
                raise DaemonError(
                    f"STOMP address {address!r} is not a loopback address (by default only "
                    "127.0.0.1 and ::1 are); listening elsewhere needs --allow-remote and a "
                    "login (stomp_login, stomp_passcode_file)"
                )
            if login is None or passcode is None:
                raise DaemonError(
                    f"STOMP on {address!r} needs a login: set stomp_login and stomp_passcode_file"
                )
        try:
            from joms.service.store import StoreWriteError
            from joms.stomp.server import serve
        except ImportError as exc:
            raise DaemonError(
                f"--stomp needs the JOMS STOMP gateway (joms.stomp.server), which is not available: {exc}"
            ) from None
        try:
            server: Any = serve(
                self.service_host(),
                host,
                port,
                login=login,
                passcode=passcode,
                allow_remote=bool(self.config.allow_remote),
                connect_timeout=self.config.stomp_connect_timeout,
                write_window=self.config.stomp_write_window,
                write_timeout=self.config.stomp_write_timeout,
            )
            if inspect.isawaitable(server):
                server = await server
        except OSError as exc:
            raise DaemonError(f"cannot listen on STOMP address {address}: {exc.strerror}") from None
        except sqlite3.Error as exc:  # the JOMS service's store
            raise DaemonError(f"cannot open {self.state_dir / JOMS_DB_FILE}: {exc}") from None
        except StoreWriteError as exc:  # its first commit (disk full, I/O error)
            raise DaemonError(
                f"cannot start the JOMS service: cannot write to {exc.path} ({exc.reason})"
                f"{'' if 'full' in exc.reason else disk_room(exc.path)}"
            ) from None
        except ValueError as exc:
            raise DaemonError(f"--stomp: {exc}") from None
        self._stomp_server = server

    async def run(self, *, own_process: bool = False) -> None:
        """Start, serve until stopped, shut down cleanly.

        ``own_process``: the daemon is the whole process (``dodwan daemon``): once started,
        what the start-up built is frozen for the garbage collector
        (:func:`~dodwan.daemon.collector.settle_collector`)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        loop.set_exception_handler(self._loop_exception)
        try:
            await self.start()
            if own_process:
                settle_collector()
            await self._stopping.wait()
        finally:
            await self.close()

    def stop(self) -> None:
        self._stopping.set()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Out of file descriptors, asyncio pauses the listening socket for a second and
        reports every failed accept with a traceback; one line per episode is enough."""
        exc = context.get("exception")
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            now = time.monotonic()
            if now - self._accept_failed_at > ACCEPT_EPISODE:
                log.warning(
                    "out of file descriptors (%s): new connections wait, accept retried every "
                    "second (one line per episode)",
                    getattr(exc, "strerror", None) or exc,
                )
            self._accept_failed_at = now
            self._count("accept_failures")
            return
        loop.default_exception_handler(context)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._pump_handle is not None:
            self._pump_handle.cancel()
        if self._memprobe_handle is not None:
            self._memprobe_handle.cancel()
        if self._watch_handle is not None:
            self._watch_handle.cancel()
        if self._stomp_server is not None:
            await self._close_stomp()
        if self.admin is not None:
            await self.admin.close()
        if self.bridges is not None:
            await self.bridges.close()
        if self.sinks is not None:
            await self.sinks.close()
        if self.pacer is not None:
            self.pacer.pump(time.time())
        if self.transport is not None:
            self.transport.close()
        if self.store is not None and self.node is not None:
            # Follow streams are gone with this process.
            for key in [k for k, (kind, _) in self._sink_items() if kind == "follow"]:
                self._drop_subscription(key)
        if self.store is not None:
            self.store.close()
        if self._trace_file is not None:
            self._trace_file.close()
            self._trace_file = None
        if self._wrote_admin:  # never the file of another daemon (one refused its lock)
            self._remove_admin_file()
            self._wrote_admin = False
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _remove_admin_file(self) -> None:
        """Remove admin.json if it is still the one this process wrote: after the state
        directory was removed under it, another daemon may have started there and written
        its own, which the CLI needs."""
        path = self.state_dir / ADMIN_FILE
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            info = None
        if not isinstance(info, dict) or info.get("instance") != self._instance:
            log.info("%s is not this daemon's any more: left in place", path)
            return
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    async def _close_stomp(self) -> None:
        """Stop the STOMP gateway before anything it uses is closed: no new connections,
        every client told and disconnected, the JOMS service's pending acknowledgements
        published (into dodwan.db, still open) and its timer stopped, its store closed.
        (``asyncio.Server.close`` alone leaves the open connections serving, and 3.11's
        ``wait_closed`` does not wait for them.)"""
        server = self._stomp_server
        closer = getattr(server, "close", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                res = closer()
                if inspect.isawaitable(res):
                    await res
        gateway = getattr(server, "gateway", None)
        if gateway is not None:
            try:
                gateway.close()
            except Exception:
                log.exception("stopping the STOMP gateway failed")
            store = getattr(getattr(gateway, "service", None), "store", None)
            with contextlib.suppress(Exception):
                if store is not None:
                    store.close()
        waiter = getattr(server, "wait_closed", None)
        if waiter is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(waiter(), 2.0)

    def _sink_items(self) -> list[tuple[str, tuple[str, str]]]:
        if self.sinks is None:  # close() after a start that failed before the sinks
            return []
        return [(k, v) for k in list(self.sinks._sinks) if (v := self.sinks.get(k)) is not None]

    # ------------------------------------------------------------------ core driving

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _on_datagram(self, data: bytes, addr: Any) -> None:
        node = self.node
        if node is None:
            return
        node.receive_datagram(data, addr, time.time())
        # The transport calls _after_input once per batch of datagrams.

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.node is None:
            return
        self.node.handle_timer(time.time())
        self._after_input()

    def _undo_store_failures(self) -> set[str]:
        """Drop from the core the messages whose storage failed (and was rolled back), before
        anything about them is sent or delivered: held only if stored."""
        store, node = self.store, self.node
        if store is None or node is None:
            return set()
        failed = store.take_failed()
        if not failed:
            return failed
        now = time.time()
        for msg_id in failed:
            with contextlib.suppress(KeyError):
                node.purge(msg_id, now)
        self._count("messages_dropped_store", len(failed))
        if time.monotonic() - self._store_failure_logged > ACCEPT_EPISODE:
            self._store_failure_logged = time.monotonic()
            log.warning(
                "cannot write to %s (%s): %d message(s) dropped (counted in "
                "daemon_messages_dropped_store; one line per 10 s)",
                store.path,
                store.last_error,
                len(failed),
            )
        return failed

    def _after_input(self) -> None:
        node, pacer = self.node, self.pacer
        if node is None or pacer is None:
            return
        dropped = self._undo_store_failures()
        now = time.time()
        out = node.datagrams_to_send(now, pacer.ready_bytes(_LOOKAHEAD))
        pacer.push_many([data for data, _dest in out])
        if out and self._pump_handle is None:
            self._pump()
        while (ev := node.next_event()) is not None:
            if dropped and isinstance(ev, MessageDelivered) and ev.descriptor.get("id") in dropped:
                continue  # not stored: not delivered either
            self._on_event(ev)
        if self._trace_file is not None:
            for rec in node.pop_trace():
                self._trace_file.write(json.dumps(dataclasses.asdict(rec)) + "\n")
        self._arm_timer(now)

    def _refill(self) -> None:
        self._pump_handle = None
        self._after_input()

    def _pump(self) -> None:
        self._pump_handle = None
        assert self.pacer is not None
        delay = self.pacer.pump(time.time())
        if delay is None and self.node is not None and self.node.fragments_queued:
            # the link is idle and the node has more to send: pull it (not recursively)
            self._pump_handle = asyncio.get_running_loop().call_soon(self._refill)
            return
        if delay is not None:
            self._pump_handle = asyncio.get_running_loop().call_later(
                max(delay, 0.0005), self._pump
            )

    def _arm_timer(self, now: float) -> None:
        assert self.node is not None
        at = self.node.get_timer()
        if at is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
                self._timer_at = None
            return
        if self._timer is not None and self._timer_at == at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(max(0.0, at - now), self._on_timer)

    def _on_event(self, ev: object) -> None:
        if isinstance(ev, MessageDelivered):
            self._count("deliveries")
            if ev.subscription.startswith(BRIDGE_PREFIX):
                if self.bridges is not None:
                    self.bridges.deliver(ev)
                return
            if ev.subscription.startswith(SERVICE_PREFIX):
                handler = self._delivery_handler or getattr(self.joms_service, "deliver", None)
                if handler is None:
                    self._count("deliveries_unrouted")
                    return
                # Deferred: the service may be the caller of the input that produced this.
                asyncio.get_running_loop().call_soon(self._to_service, handler, ev)
                return
            assert self.sinks is not None
            self.sinks.deliver(ev)
        elif isinstance(ev, NeighbourFound):
            log.info("neighbour %s found at %s", ev.host_id, ev.address)
        elif isinstance(ev, NeighbourLost):
            log.info("neighbour %s lost", ev.host_id)
        elif isinstance(ev, NeighbourRestarted):
            log.info("neighbour %s restarted (now at %s): offering it everything again",
                     ev.host_id, ev.address)  # fmt: skip
        elif isinstance(ev, MessageEvicted):
            log.info("message %s evicted (%s)", ev.msg_id, ev.reason)

    def _to_service(self, handler: Callable[[MessageDelivered], Any], ev: MessageDelivered) -> None:
        try:
            res = handler(ev)
            if inspect.isawaitable(res):
                task = asyncio.ensure_future(res)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception:
            log.exception("hosted service failed on a delivery")

    # ------------------------------------------------------------------ service host

    def service_host(self) -> _ServiceHost:
        return _ServiceHost(self)

    # ------------------------------------------------------------------ admin app

    def _node(self) -> Node:
        if self.node is None:
            raise ApiError(503, "daemon is starting")
        return self.node

    def status(self) -> dict[str, Any]:
        node = self._node()
        assert self.pacer is not None and self.transport is not None
        return {
            "host_id": self.host_id,
            "pid": os.getpid(),
            "uptime": round(time.time() - self._started, 3),
            "started": self._started,
            "medium": {
                "kind": self.medium.kind,
                "group": medium_text(self.medium),
                "interface": self.medium.interface,
                "local_address": list(self.transport.local_address),
                "network_key": None if self.netkey is None else self.netkey.mode,
            },
            "neighbours": sorted(node.neighbours()),
            "cache": node.cache_usage(),
            "remote_memory": node.remote_memory_usage(),
            "subscriptions": len(node.subscriptions()),
            "max_payload": self.max_payload(),
            "announce_period": node.config.announce_period,
            "counters": dict(sorted(self._all_counters().items())),
            "state_dir": str(self.state_dir),
            "health": self.health(),
            "bridges": [] if self.bridges is None else self.bridges.status(),
        }

    def _all_counters(self) -> dict[str, int]:
        node = self._node()
        out = dict(node.counters)
        for k, v in self.counters.items():
            out[f"daemon_{k}"] = v
        if self.sinks is not None:
            for k, v in self.sinks.counters.items():
                out[f"sink_{k}"] = v
            out["sink_dir_waiting"] = self.sinks.dir_waiting
        if self.store is not None:
            out["daemon_store_write_failures"] = self.store.write_failures
            out["daemon_store_read_errors"] = self.store.read_errors
            out["daemon_store_checkpoint_errors"] = self.store.checkpoint_errors
            out["daemon_store_wal_held"] = self.store.wal_held
        gateway = getattr(self._stomp_server, "gateway", None)
        for k, v in getattr(gateway, "counters", {}).items():
            out[f"daemon_stomp_{k}"] = v
        for k, v in getattr(getattr(gateway, "service", None), "counters", {}).items():
            out[f"joms_{k}"] = v  # the JOMS service's (order_gaps, dead_lettered, ...)
        if self.pacer is not None:
            out["pacer_sent"] = self.pacer.sent
            out["pacer_dropped"] = self.pacer.dropped
            out["pacer_queued"] = self.pacer.queued
        if self.netkey is not None:
            out["netkey_rejected"] = self.netkey.rejected
            out["netkey_replayed"] = self.netkey.replayed
        if self.transport is not None:
            out["udp_send_errors"] = self.transport.send_errors
            out["udp_receive_errors"] = self.transport.receive_errors
            out["udp_own_filtered"] = self.transport.own_filtered
            out["udp_offload"] = int(self.transport.offload)
            out["udp_coalesced_reads"] = self.transport.coalesced
            if self.transport._tx_proto is not None:
                out["udp_send_errors"] += self.transport._tx_proto.errors
        return out

    def peers(self) -> dict[str, Any]:
        now = time.time()
        out: dict[str, Any] = {}
        for host, info in self._node().neighbours().items():
            d = dict(info)
            addr = d.get("address")
            d["address"] = list(addr) if isinstance(addr, tuple) else str(addr)
            d["silent_for"] = round(now - float(d.get("last_heard", now)), 3)
            out[host] = d
        return out

    def profile(self) -> dict[str, Any]:
        return self._node().profile()

    def subscriptions(self) -> list[dict[str, Any]]:
        assert self.sinks is not None
        out = []
        node = self._node()
        for key, patterns in sorted(node.subscriptions().items()):
            sink = self.sinks.get(key)
            if sink is None and key.startswith(SERVICE_PREFIX):
                sink = ("service", "joms")
            trusted = node.trusted_keys(key)
            out.append(
                {
                    "key": key,
                    "trusted_keys": trusted,
                    "patterns": patterns,
                    "sink": None if sink is None else {"kind": sink[0], "target": sink[1]},
                }
            )
        return out

    def _with_signer(self, entry: dict[str, Any]) -> dict[str, Any]:
        # Only verified signatures are kept: a bad one is dropped at reception.
        entry["signed_by"] = entry["descriptor"].get("sigkey")
        if entry.get("reason") == "carried altruistically" and not self._node().config.altruistic:
            # The core's word for "no one known wants it" — but this host is not altruistic:
            # e.g. delivered here before its subscription was removed. Kept until its
            # deadline or until evicted (such messages go first).
            entry["reason"] = "no longer wanted here (kept until its deadline or eviction)"
        return entry

    def cache_list(self) -> list[dict[str, Any]]:
        return [self._with_signer(e) for e in self._node().cache_listing()]

    def cache_show(self, msg_id: str, payload: bool) -> dict[str, Any]:
        node = self._node()
        entry = node.cache_entry(msg_id)
        if entry is None:
            raise ApiError(404, f"no cached message {msg_id!r}")
        if payload:
            data = node.message_payload(msg_id)
            if data is None and entry.get("complete"):
                raise ApiError(
                    500,
                    f"the stored payload of {msg_id} cannot be read: the database is damaged "
                    "(run `dodwan check`, then `dodwan repair`)",
                )
            entry["payload_b64"] = None if data is None else base64.b64encode(data).decode("ascii")
        return self._with_signer(entry)

    def cache_purge(self, msg_id: str) -> dict[str, Any]:
        """Drop a cached message. The deletion is committed before the core forgets it: if
        the database cannot store it (disk full), the message stays, in memory too, and
        ``ApiError(507)`` says so (else it would come back at the next start)."""
        node, store = self._node(), self.store
        assert store is not None
        if node.cache_entry(msg_id) is None:
            raise ApiError(404, f"no cached message {msg_id!r}")
        failures = store.write_failures
        store.delete_message(msg_id)
        store.commit()
        if store.write_failures != failures:
            store.keep_message(msg_id)  # kept: its deletion is not to be redone
            self._after_input()  # drops what the rolled-back transaction also held
            message = f"cannot store the purge of {msg_id} ({store.last_error}); it is kept"
            log.warning("%s", message)
            raise ApiError(507, message)
        try:
            node.purge(msg_id, time.time())
        except KeyError:
            raise ApiError(404, f"no cached message {msg_id!r}") from None
        self._after_input()
        return {"purged": msg_id}

    def publish(self, body: dict[str, Any]) -> dict[str, Any]:
        node = self._node()
        self._check_state()
        check_fields(body, PUBLISH_FIELDS, "POST /publish")
        attributes = body.get("attributes", {})
        if not isinstance(attributes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
        ):
            raise ApiError(400, "attributes must be an object of strings")
        given = [f for f in ("text", "payload_b64") if f in body]
        if isinstance(body.get(RAW_PAYLOAD), bytes):
            given.insert(0, "an application/octet-stream body")
        if len(given) > 1:
            raise ApiError(
                400,
                "give the payload once, as 'text', 'payload_b64' or an "
                f"application/octet-stream body, not {' and '.join(map(_named, given))}",
            )
        if not given:
            raise ApiError(
                400, "give the payload as 'text', 'payload_b64' or an application/octet-stream body"
            )
        if isinstance(body.get(RAW_PAYLOAD), bytes):
            payload = body[RAW_PAYLOAD]
        elif "payload_b64" in body:
            encoded = _field(body, "payload_b64", str, "a string (base64)")
            try:
                payload = base64.b64decode(encoded, validate=True)
            except ValueError:
                raise ApiError(400, "payload_b64 is not valid base64") from None
        else:
            payload = _field(body, "text", str, "a string").encode("utf-8")
        ttl_given = _field(body, "ttl", int | float, "a number", DEFAULT_TTL)
        priority = _field(body, "priority", int, "an integer from 0 to 9", 4)
        if not 0 <= priority <= 9:
            raise ApiError(400, f"priority must be an integer from 0 to 9, not {priority}")
        persistent = _field(body, "persistent", bool, "true or false", True)
        biggest = self.max_payload()
        if len(payload) > biggest:
            raise ApiError(
                413,
                f"payload of {len(payload)} bytes: the largest publication is {biggest} bytes",
            )
        now = time.time()
        try:
            ttl = float(ttl_given)
            if not ttl > 0 or not math.isfinite(ttl):
                raise ValueError("ttl must be a positive, finite number of seconds")
            max_ttl = node.config.limits.max_ttl
            if ttl > max_ttl:  # the value as given (now + ttl - now is not always ttl)
                raise ValueError(
                    f"time to live {ttl_given} s is longer than the maximum, {max_ttl:.15g} s "
                    "(limits.max_ttl)"
                )
            msg_id = node.publish(
                attributes,
                payload,
                deadline=now + ttl,
                now=now,
                priority=priority,
                persistent=persistent,
            )
        except CacheFullError as exc:
            raise ApiError(409, str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise ApiError(400, str(exc)) from None
        except WireError as exc:
            raise ApiError(413, f"payload refused: {exc}") from None
        self._check_stored(msg_id)
        self._after_input()
        return {"id": msg_id}

    def max_payload(self) -> int:
        """Largest payload ``POST /publish`` accepts (documented in docs/admin-api.md and
        docs/configuration.md): what the cache and ``max_message_size`` hold, what one
        request body carries (as ``application/octet-stream``), and, for an incompressible
        payload with up to ``ATTRIBUTE_RESERVE`` bytes of application attributes, what
        ``max_fragments`` fragments of this ``max_datagram`` hold."""
        node = self._node()
        if self._max_payload is None or self._max_payload[0] is not node:
            # fixed for a node's life (its settings, host id and key): computed once, not
            # at every publication (it compresses, and may sign, a descriptor)
            conf = node.config
            self._max_payload = (
                node,
                min(
                    min(conf.limits.max_message_size, conf.cache_capacity) - PUBLISH_MARGIN,
                    MAX_BODY,
                    node.largest_fragmented_payload(ATTRIBUTE_RESERVE),
                ),
            )
        return self._max_payload[1]

    def _check_stored(self, msg_id: str) -> None:
        """After a publication: if its storage failed, it is dropped (never sent) and the
        caller is told (507)."""
        assert self.store is not None
        if not self.store.has_failed(msg_id):
            return
        error = self.store.last_error
        self._count("publications_refused_store")
        self._after_input()  # drops it from the core before anything is sent
        raise ApiError(507, f"cannot store the message ({error}): not published")

    @staticmethod
    def _patterns(body: dict[str, Any]) -> list[dict[str, str]]:
        patterns = body.get("patterns")
        if isinstance(patterns, dict):
            patterns = [patterns]
        if not isinstance(patterns, list) or not patterns:
            raise ApiError(400, "patterns must be an object (attribute -> regex) or a list of them")
        for p in patterns:
            if not isinstance(p, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in p.items()
            ):
                raise ApiError(400, "each pattern must map attribute names to regex strings")
        return patterns

    @staticmethod
    def _trusted(body: dict[str, Any]) -> list[str] | None:
        keys = body.get("trusted_keys")
        if keys is None:
            return None
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise ApiError(400, "trusted_keys must be a non-empty list of hex public keys")
        return keys

    def _add_subscription(
        self,
        patterns: list[dict[str, str]],
        key: str | None,
        kind: str,
        target: str,
        trusted_keys: list[str] | None = None,
        attach: Callable[[str], None] | None = None,
    ) -> str:
        """Add a subscription and its sink; ``attach(key)`` runs just before the core is told,
        so that a follow stream is in place for the messages the cache already holds."""
        node, store, sinks = self._node(), self.store, self.sinks
        assert store is not None and sinks is not None
        self._check_state()
        if key is not None and not isinstance(key, str):
            raise ApiError(400, f"key must be a string, not {type(key).__name__}")
        if key is not None and key.startswith((SERVICE_PREFIX, BRIDGE_PREFIX)):
            raise ApiError(
                400,
                f"subscription keys starting with {SERVICE_PREFIX!r} or {BRIDGE_PREFIX!r} "
                "are reserved",
            )
        if key is None:
            key = f"{kind}-{secrets.token_hex(4)}"
        if key in node.subscriptions():
            raise ApiError(409, f"subscription {key!r} exists; unsubscribe it first")
        old = sinks.get(key)
        sinks.set(key, kind, target)
        store.put_sink(key, kind, target)  # committed with the subscription, atomically
        failures = store.write_failures
        if attach is not None:
            attach(key)
        try:
            key = node.subscribe(patterns, now=time.time(), key=key, trusted_keys=trusted_keys)
            if store.write_failures != failures:
                with contextlib.suppress(KeyError):
                    node.unsubscribe(key, time.time())
                raise ApiError(507, f"cannot store the subscription ({store.last_error})")
        except (TypeError, ValueError, ApiError) as exc:
            store.delete_sink(key)
            store.commit()
            if old is None:
                sinks.remove(key)
            else:
                sinks.set(key, *old)
            if isinstance(exc, ApiError):
                raise
            raise ApiError(400, str(exc)) from None
        self._after_input()
        return key

    def subscribe(self, body: dict[str, Any]) -> dict[str, Any]:
        check_fields(body, SUBSCRIBE_FIELDS, "POST /subscribe")
        patterns = self._patterns(body)
        sink = body.get("sink")
        if isinstance(sink, dict):
            check_fields(sink, SINK_FIELDS, "the sink of POST /subscribe")
        if not isinstance(sink, dict) or sink.get("kind") not in ("dir", "exec"):
            raise ApiError(400, "sink must be {'kind': 'dir'|'exec', 'target': ...}")
        kind, target = str(sink["kind"]), sink.get("target")
        if not isinstance(target, str) or not target:
            raise ApiError(400, "sink target must be a non-empty string")
        try:  # refuse bad patterns before touching the file system
            Profile.from_patterns(patterns, self._node().config.limits)
        except (PatternError, TypeError, ValueError) as exc:
            raise ApiError(400, str(exc)) from None
        if kind == "dir":
            if not os.path.isabs(target):
                raise ApiError(400, "a dir sink needs an absolute path")
            try:
                Path(target).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ApiError(400, f"cannot create directory {target}: {exc.strerror}") from None
            if not os.access(target, os.W_OK):
                raise ApiError(400, f"directory {target} is not writable")
        trusted = self._trusted(body)
        key = self._add_subscription(patterns, body.get("key"), kind, target, trusted)
        return {"key": key}

    def _drop_subscription(self, key: str, stored_first: bool = False) -> None:
        """Remove a subscription and its sink.

        With ``stored_first`` (an unsubscription someone is told about), the deletion is
        committed before anything changes in memory: if the database cannot store it (disk
        full), the transaction is rolled back, the subscription stays, and ``ApiError(507)``
        says so. Otherwise the running daemon would stop delivering to a subscription its
        database still holds, and that comes back at the next start. (A follow stream's
        subscription is dropped at each start anyway, so its end never waits on the disk.)
        """
        node, store, sinks = self._node(), self.store, self.sinks
        assert store is not None and sinks is not None
        if stored_first:
            failures = store.write_failures
            store.delete_sink(key)
            store.delete_subscription(key)
            store.commit()
            if store.write_failures != failures:
                store.keep_subscription(key)  # kept: its deletion is not to be redone
                self._after_input()  # drops what the rolled-back transaction also held
                message = (
                    f"cannot store the removal of subscription {key!r} ({store.last_error}); "
                    "it is kept"
                )
                log.warning("%s", message)
                raise ApiError(507, message)
        store.delete_sink(key)
        sinks.remove(key)
        try:
            node.unsubscribe(key, time.time())
        except KeyError:
            store.commit()

    def unsubscribe(self, key: str) -> dict[str, Any]:
        if key not in self._node().subscriptions():
            raise ApiError(404, f"no subscription {key!r}")
        if key.startswith(SERVICE_PREFIX):
            raise ApiError(409, f"{key!r} belongs to the JOMS service")
        if key.startswith(BRIDGE_PREFIX):
            raise ApiError(409, f"{key!r} belongs to a bridge; use `dodwan bridge rm`")
        self._drop_subscription(key, stored_first=True)
        self._after_input()
        return {"unsubscribed": key}

    async def follow(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        check_fields(body, FOLLOW_FIELDS, "POST /follow")
        patterns = self._patterns(body)
        assert self.sinks is not None
        trusted = self._trusted(body)
        heartbeat = body.get("heartbeat")
        if heartbeat is not None and (
            isinstance(heartbeat, bool)
            or not isinstance(heartbeat, (int, float))
            or not FOLLOW_HEARTBEAT[0] <= heartbeat <= FOLLOW_HEARTBEAT[1]
        ):
            raise ApiError(
                400,
                f"heartbeat must be a number of seconds from {FOLLOW_HEARTBEAT[0]:g} to "
                f"{FOLLOW_HEARTBEAT[1]:g}",
            )
        attached: list[tuple[str, asyncio.Queue[MessageDelivered | None]]] = []
        sinks = self.sinks
        try:
            key = self._add_subscription(
                patterns,
                body.get("key"),
                "follow",
                "",
                trusted,
                # Attached before the core subscribes: matching messages already cached are
                # delivered at once, and must find the stream (as a --dir sink finds its dir).
                attach=lambda k: attached.append((k, sinks.follow(k))),
            )
        except ApiError:
            for k, q in attached:
                sinks.unfollow(k, q)
            raise
        [(_, queue)] = attached
        try:
            yield (
                {"subscribed": key}
                if heartbeat is None
                else {
                    "subscribed": key,
                    "heartbeat": heartbeat,
                }
            )
            while True:
                ev = await queue.get()
                if ev is None:
                    return
                yield delivery_json(ev)
        finally:
            left = self.sinks.unfollow(key, queue)
            if not left and self.node is not None and key in self.node.subscriptions():
                self._drop_subscription(key)
                self._after_input()

    # ------------------------------------------------------------------ bridges

    def _bridge_manager(self) -> BridgeManager:
        if self.bridges is None or self.bridges.outbox is None:
            raise ApiError(503, "daemon is starting")
        return self.bridges

    def bridges_list(self) -> list[dict[str, Any]]:
        return self._bridge_manager().status()

    async def bridge_add(self, body: dict[str, Any]) -> dict[str, Any]:
        body = dict(body)
        check_fields(body, (*sorted(BINDING_KEYS), "replace"), "POST /bridges")
        replace = _field(body, "replace", bool, "true or false", False)
        body.pop("replace", None)
        try:
            return await self._bridge_manager().add(body, replace=replace)
        except BridgeError as exc:
            raise ApiError(exc.status, exc.message) from None

    async def bridge_remove(self, name: str) -> dict[str, Any]:
        try:
            return await self._bridge_manager().remove(name)
        except BridgeError as exc:
            raise ApiError(exc.status, exc.message) from None

    def metrics(self) -> str:
        node = self._node()
        lines = [
            "# HELP dodwan_up 1 while the daemon runs.",
            "# TYPE dodwan_up gauge",
            f'dodwan_up{{host_id="{self.host_id}"}} 1',
            "# HELP dodwan_uptime_seconds Seconds since the daemon started.",
            "# TYPE dodwan_uptime_seconds gauge",
            f"dodwan_uptime_seconds {time.time() - self._started:.3f}",
            "# HELP dodwan_neighbours Current neighbours.",
            "# TYPE dodwan_neighbours gauge",
            f"dodwan_neighbours {len(node.neighbours())}",
            "# HELP dodwan_subscriptions Local subscriptions.",
            "# TYPE dodwan_subscriptions gauge",
            f"dodwan_subscriptions {len(node.subscriptions())}",
        ]
        for name, value in sorted(node.cache_usage().items()):
            metric = f"dodwan_cache_{_metric_name(name)}"
            lines += [f"# TYPE {metric} gauge", f"{metric} {value}"]
        lines += [
            "# HELP dodwan_events_total Protocol and daemon counters, by name.",
            "# TYPE dodwan_events_total counter",
        ]
        for name, value in sorted(self._all_counters().items()):
            lines.append(f'dodwan_events_total{{name="{_metric_name(name)}"}} {value}')
        if self.bridges is not None:
            lines += self.bridges.metrics()
        return "\n".join(lines) + "\n"


def _store_refusal(message: str) -> Exception:
    """What a hosted service is told when a publication could not be stored."""
    try:
        from joms.errors import ResourceAllocationException
    except ImportError:  # pragma: no cover - JOMS is part of this distribution
        return OSError(message)
    return ResourceAllocationException(message)


class _ServiceHost:
    """:class:`~dodwan.daemon.service_host.ServiceHost` backed by a running daemon."""

    def __init__(self, daemon: Daemon) -> None:
        self._d = daemon
        self._batch: list[str] | None = None  # ids published in the open batch

    @property
    def host_id(self) -> str:
        return self._d.host_id

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """A run of service calls (a STOMP gateway's frames from one read) with one store
        commit at the end; what they published is sent and delivered only after it. When
        the commit fails, those publications are dropped and this raises
        ResourceAllocationException: the caller must confirm none of them."""
        store = self._d.store
        if store is None or self._batch is not None:
            yield
            return
        self._batch = []
        try:
            with store.hold():
                yield
        finally:
            published, self._batch = self._batch, None
            failed = [msg_id for msg_id in published if store.has_failed(msg_id)]
            self._d._after_input()  # drops the failed ones before anything is sent
        if failed:
            self._d._count("publications_refused_store", len(failed))
            raise _store_refusal(
                f"cannot store {len(failed)} message(s) ({store.last_error}): not published"
            )

    def _after_input(self) -> None:
        if self._batch is None:  # in a batch: once it is committed
            self._d._after_input()

    @property
    def state_dir(self) -> Path:
        return self._d.state_dir

    @property
    def joms_config(self) -> dict[str, Any]:
        """The config file's ``[joms]`` table (settings of the JOMS service it hosts)."""
        return self._d.config.joms

    def now(self) -> float:
        return time.time()

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        deadline: float,
        priority: int = 4,
        persistent: bool = True,
    ) -> str:
        node = self._d._node()
        store = self._d.store
        try:
            self._d._check_state()
        except ApiError as exc:
            raise _store_refusal(exc.message) from None
        # a non-persistent message (JMS NON_PERSISTENT) need not survive a restart: the
        # store keeps it in memory only (bounded; see SqliteStore.volatile)
        with store.volatile() if store is not None and not persistent else contextlib.nullcontext():
            msg_id = node.publish(
                attributes,
                payload,
                deadline=deadline,
                now=time.time(),
                priority=priority,
                persistent=persistent,
            )
        if self._batch is not None:  # stored (or refused) at the end of the batch
            self._batch.append(msg_id)
            return msg_id
        try:
            self._d._check_stored(msg_id)
        except ApiError as exc:
            raise _store_refusal(exc.message) from None
        self._d._after_input()
        return msg_id

    def subscribe(self, patterns: Mapping[str, str] | Sequence[Mapping[str, str]], key: str) -> str:
        if not key.startswith(SERVICE_PREFIX):
            raise ValueError(f"service subscription keys must start with {SERVICE_PREFIX!r}")
        k = self._d._node().subscribe(patterns, now=time.time(), key=key)
        self._after_input()
        return k

    def unsubscribe(self, key: str) -> None:
        self._d._node().unsubscribe(key, time.time())
        self._after_input()

    def subscriptions(self) -> dict[str, list[dict[str, str]]]:
        return self._d._node().subscriptions()

    def purge(self, msg_id: str) -> None:
        self._d._node().purge(msg_id, time.time())
        self._after_input()

    def set_delivery_handler(self, handler: Callable[[MessageDelivered], Any] | None) -> None:
        self._d._delivery_handler = handler


__all__ = ["KINDS", "Daemon", "DaemonError"]
