"""What the STOMP gateway needs from its host, and a driver that provides it on asyncio.

The gateway (``joms.stomp.server``) only needs a :class:`GatewayHost`: the JOMS service, a
clock, ``poke()`` to say "I changed the service, flush its outputs", and a way to be woken
when the service may have events. :class:`ServiceDriver` implements it for any runner: it
re-arms the service's single timer with ``loop.call_at`` and calls a ``flush`` hook of the
runner (e.g. drain the node's events into ``service.on_delivery`` and send datagrams).

:func:`from_daemon_host` adapts the daemon's hosted-service interface
(``dodwan.daemon.service_host.ServiceHost``: publish / subscribe / unsubscribe /
set_delivery_handler) so ``serve(daemon.service_host(), host, port)`` just works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..errors import JMSException, ResourceAllocationException
from ..service import JomsService, ServiceConfig
from ..service.store import (
    MemoryServiceStore,
    ServiceStore,
    SqliteServiceStore,
    StoreWriteError,
)

log = logging.getLogger(__name__)

STORE_FAILURE_LOG_PERIOD = 10.0
"""Seconds between two log lines about commits of the service's store that failed."""


class GatewayHost(Protocol):
    """The gateway's view of its host."""

    service: JomsService

    def now(self) -> float:
        """Wall-clock seconds, the same clock fed to the service and the node."""

    def poke(self) -> None:
        """The gateway called into the service: flush its outputs, re-arm timers, wake."""

    def add_wakeup(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in the loop thread) whenever service events may be ready."""

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Around a run of client frames handled at once: the host may group their store
        commits into one at the end (before any receipt is written)."""


class ServiceDriver:
    """A :class:`GatewayHost` driving a :class:`JomsService` on the running asyncio loop."""

    def __init__(
        self,
        service: JomsService,
        now: Callable[[], float],
        flush: Callable[[], None] | None = None,
        batch: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.service = service
        self._now = now
        self._flush = flush or (lambda: None)
        self._batch = batch
        self._wakeups: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._busy = False
        self.store_failures = 0
        """Commits of the service's store that failed (disk full); their writes are kept."""
        self._store_failure_logged = -STORE_FAILURE_LOG_PERIOD
        self._closed = False

    def now(self) -> float:
        return self._now()

    def add_wakeup(self, callback: Callable[[], None]) -> None:
        self._wakeups.append(callback)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """See :class:`GatewayHost`. When the service's store cannot commit (disk full),
        raises ResourceAllocationException: the caller confirms none of the run (the
        service keeps its state, written once there is room; see StoreWriteError)."""
        try:
            with self._service_hold():  # committed after the node's store (inner)
                if self._batch is None:
                    yield
                else:
                    with self._batch():
                        yield
        except StoreWriteError as exc:
            self._store_failed(exc)
            refusal = exc.__context__
            if isinstance(refusal, JMSException):  # the node's store refused too: its say
                raise refusal from None
            raise ResourceAllocationException(f"{exc}: not confirmed") from None

    def _service_hold(self) -> contextlib.AbstractContextManager[None]:
        """One commit of the service's store for a run of inputs (when it can group)."""
        hold = getattr(self.service.store, "hold", None)
        return hold() if hold is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _stored(self) -> Iterator[None]:
        """One commit of the service's store around a service call no client waits on: a
        failure (disk full) is logged in one line (every STORE_FAILURE_LOG_PERIOD seconds)
        and the service goes on; the store keeps the writes for its next commit."""
        try:
            with self._service_hold():
                yield
        except StoreWriteError as exc:
            self._store_failed(exc)

    def _store_failed(self, exc: StoreWriteError) -> None:
        self.store_failures += 1
        if time.monotonic() - self._store_failure_logged >= STORE_FAILURE_LOG_PERIOD:
            self._store_failure_logged = time.monotonic()
            log.warning(
                "cannot write to %s (%s): the JOMS service's state is kept in memory and "
                "written once there is room; requests needing it are refused meanwhile "
                "(%d failed commit(s); one line per %g s)",
                exc.path,
                exc.reason,
                self.store_failures,
                STORE_FAILURE_LOG_PERIOD,
            )

    def deliver(self, key: str, descriptor: Mapping[str, str], payload: bytes) -> None:
        """Feed a DoDWAN delivery for a ``joms:`` key (from the runner)."""
        if self._closed:  # stopping: it comes again at the next start (new keys)
            return
        with self._stored():
            self.service.on_delivery(key, descriptor, payload, self._now())
        self.poke()

    def deliver_many(self, deliveries: list[tuple[str, Mapping[str, str], bytes]]) -> None:
        """Feed a burst of deliveries: one store commit, then one flush of the outputs
        (one write per connection) — not one of each per message."""
        if self._closed:
            return
        with self._stored():
            for key, descriptor, payload in deliveries:
                self.service.on_delivery(key, descriptor, payload, self._now())
        self.poke()

    def poke(self) -> None:
        if self._busy or self._closed:  # re-entered from flush(): the outer call finishes
            return
        self._busy = True
        try:
            with self._stored():  # committed before the wakeups write anything
                self._flush()
        finally:
            self._busy = False
        self._rearm()  # also after a failed commit: the service's timer must go on
        for cb in list(self._wakeups):
            try:
                cb()
            except Exception:  # a broken front end must not stop the service
                log.exception("gateway wakeup failed")

    def _rearm(self) -> None:
        at = self.service.get_timer()
        if at is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._timer_at = None
            return
        if self._timer is not None and self._timer_at == at:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = at
        self._timer = loop.call_later(max(0.0, at - self._now()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        if self._closed:
            return
        try:
            with self._stored():
                self.service.handle_timer(self._now())
        except Exception:
            log.exception("JOMS service timer failed")
        self.poke()

    def close(self) -> None:
        """Stop driving the service: publish what it holds back in memory (its pending
        queue acknowledgements), stored in one commit, then no more timers, deliveries or
        pokes. The runner closes the stores afterwards (the service's and its own)."""
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        try:
            with self.batch():
                self.service.flush(self._now())
        except JMSException as exc:  # the host's store refused (disk full): logged there
            log.warning("stopping the JOMS service: %s", exc)
        self._closed = True


class _DaemonPort:
    """:class:`~joms.service.port.DisseminationPort` over the daemon's ServiceHost."""

    def __init__(self, host: Any) -> None:
        self._host = host
        self.host_id = str(host.host_id)

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        *,
        deadline: float,
        priority: int,
        persistent: bool,
    ) -> str:
        return str(
            self._host.publish(
                attributes, payload, deadline=deadline, priority=priority, persistent=persistent
            )
        )

    def subscribe(self, patterns: list[dict[str, str]], *, key: str) -> str:
        return str(self._host.subscribe(patterns, key=key))

    def unsubscribe(self, key: str) -> None:
        with contextlib.suppress(KeyError):
            self._host.unsubscribe(key)

    def drop(self, msg_id: str) -> None:
        purge = getattr(self._host, "purge", None)
        if purge is not None:
            with contextlib.suppress(KeyError, ValueError):
                purge(msg_id)


def from_daemon_host(
    host: Any,
    *,
    config: ServiceConfig | None = None,
    store: ServiceStore | None = None,
) -> ServiceDriver:
    """Build the JOMS service on the daemon's hosted-service interface.

    The service state goes to ``STATE_DIR/joms.sqlite`` when the host has a ``state_dir``
    attribute (else memory), and its settings come from a ``joms_config`` attribute
    (a :class:`ServiceConfig`, or a mapping such as a TOML ``[joms]`` table) when present.
    """
    if store is None:
        state_dir = getattr(host, "state_dir", None)
        store = (
            SqliteServiceStore(Path(state_dir) / "joms.sqlite")
            if state_dir
            else MemoryServiceStore()
        )
    cfg = config or getattr(host, "joms_config", None) or ServiceConfig()
    if isinstance(cfg, Mapping):  # a config-file table, e.g. TOML [joms]
        cfg = ServiceConfig.from_mapping(cfg)
    service = JomsService(_DaemonPort(host), cfg, store, random.Random())
    driver = ServiceDriver(service, host.now, batch=getattr(host, "batch", None))

    waiting: list[tuple[str, Mapping[str, str], bytes]] = []

    def drain() -> None:
        burst = waiting[:]
        waiting.clear()
        driver.deliver_many(burst)

    def on_delivery(ev: Any) -> None:
        # The daemon drains node events synchronously inside publish/subscribe, which the
        # service calls: defer deliveries to the loop so the service is never re-entered,
        # and hand those of one loop turn over together (a run of SENDs delivers a burst).
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            driver.deliver(ev.subscription, ev.descriptor, ev.payload)
            return
        waiting.append((ev.subscription, ev.descriptor, ev.payload))
        if len(waiting) == 1:
            loop.call_soon(drain)

    host.set_delivery_handler(on_delivery)
    service.start(host.now())
    return driver


def as_gateway_host(obj: Any) -> GatewayHost:
    """Accept a GatewayHost as is, or adapt the daemon's ServiceHost."""
    if hasattr(obj, "service") and hasattr(obj, "poke"):
        return obj  # type: ignore[no-any-return]
    if hasattr(obj, "set_delivery_handler") and hasattr(obj, "publish"):
        return from_daemon_host(obj)
    raise TypeError(
        "serve() needs a GatewayHost (.service, .now(), .poke(), .add_wakeup()) "
        "or the daemon's ServiceHost (.publish, .subscribe, .set_delivery_handler)"
    )
