"""The bridge adapter of a daemon: its bindings, their outbox, and the DoDWAN side of both.

Runs on the daemon's event loop. Each outbound binding holds a core subscription keyed
``bridge:NAME`` whose deliveries are written to the durable outbox (committed at once) and
sent by the binding's thread. Messages received from a broker are published here with the
binding's attributes, a deadline ``ttl`` seconds away (or the remote expiry, if sooner), an
id derived from the remote message id when the broker gives one (so two gateways bridging
the same destination publish the same DoDWAN message), and the origin mark that keeps any
binding from sending them out again.

Bindings come from ``[[bridges]]`` in the config file (applied at every start) and from the
admin API (kept in the outbox database across restarts). Replacing one is make-before-break:
the new binding is connected (its outbound side paused) before the old one stops sending and
disconnects; unsent messages stay in the outbox for whichever binding is current.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..core import CacheFullError, MessageDelivered, PatternError, Profile
from .binding import Binding, InboundHandler, Link
from .mapping import (
    DEADLINE_HEADER,
    GATEWAY_HEADER,
    INSTANCE_HEADER,
    ORIGIN_MARK,
    Inbound,
    content_digest,
    inbound_attributes,
    inbound_id,
)
from .outbox import Outbox
from .selection import descriptor_values, inbound_values
from .uri import BindingSpec, SpecError, hashed_name, without_credentials

log = logging.getLogger("dodwan.bridges")

T = TypeVar("T")

KEY_PREFIX = "bridge:"
CONNECT_WAIT = 15.0
RETIRE_WAIT = 10.0
"""How long a replacement waits for the old link's connection attempt in flight (the
links' own connection timeout): with the new link's CONNECT_WAIT, within the admin
client's 30 s."""
PURGE_PERIOD = 60.0


class BridgeError(Exception):
    """A bridge request the daemon refuses (``status`` is the HTTP status to answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BridgeHost(Protocol):
    """What the bridges need from the daemon (all called on its event loop)."""

    host_id: str
    state_dir: Path

    @property
    def max_ttl(self) -> float:
        """The node's ``limits.max_ttl``: the longest deadline a publication may have."""

    @property
    def max_payload(self) -> int:
        """The largest payload a publication may carry."""

    def publish(
        self, attributes: Mapping[str, str], payload: bytes, deadline: float, priority: int
    ) -> str: ...
    def subscribe(self, key: str, patterns: list[dict[str, str]]) -> None: ...
    def unsubscribe(self, key: str) -> None: ...
    def subscription_keys(self) -> list[str]: ...
    def cached(self) -> list[tuple[dict[str, str], Callable[[], bytes | None]]]: ...


def make_link(spec: BindingSpec, host_id: str, on_message: InboundHandler) -> Link:
    """The protocol client of a binding (imported on demand)."""
    scheme = spec.endpoint.scheme
    try:
        if scheme == "mqtt":
            from .mqtt import MqttLink

            return MqttLink(spec, host_id, on_message)
        if scheme == "stomp":
            from .stomp import StompLink

            return StompLink(spec, host_id, on_message)
        from .amqp import AmqpLink

        return AmqpLink(spec, host_id, on_message)
    except ImportError as exc:  # pragma: no cover - the clients are dependencies
        raise SpecError(f"{scheme} bindings need a client library: {exc}") from None


class BridgeManager:
    def __init__(
        self, host: BridgeHost, configured: list[dict[str, Any]], synchronous: str = "NORMAL"
    ) -> None:
        self.host = host
        self.synchronous = synchronous
        self.configured = configured
        self.outbox: Outbox | None = None
        self._bindings: dict[str, Binding] = {}
        self._invalid: dict[str, tuple[dict[str, Any], str]] = {}
        """Bindings kept from a previous run that this version refuses (an older one
        accepted them), by name: (stored spec, reason). Kept with their outbox rows, not
        run, until replaced or removed."""
        self._loops_prevented: dict[str, int] = {}
        self._expired = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._purge_handle: asyncio.TimerHandle | None = None
        self._busy = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.outbox = Outbox(self.host.state_dir, self.synchronous)
        specs: dict[str, tuple[BindingSpec, str]] = {}
        for name, data, source in self.outbox.bindings():
            if source == "api":
                try:
                    specs[name] = (BindingSpec.from_dict(data), "api")
                except SpecError as exc:
                    # Not dropped: its spec and unsent messages are the operator's.
                    reason = str(exc)  # parse_uri shows the URI without its credentials
                    self._invalid[name] = (data, reason)
                    log.error(
                        "bridge %s kept from a previous run is refused by this version (%s): "
                        "not run; its %d unsent message(s) are kept until it is replaced "
                        "('dodwan bridge add URI --name %s --replace ...') or removed",
                        name,
                        reason,
                        self.outbox.marks(name)["backlog"],
                        name,
                    )
        for data in self.configured:
            spec = BindingSpec.from_dict(data)  # validated at config load already
            specs[spec.name] = (spec, "config")
        for name, _data, _source in self.outbox.bindings():
            if name not in specs and name not in self._invalid:
                self.outbox.drop_binding(name)
        for key in self.host.subscription_keys():
            name = key[len(KEY_PREFIX) :]
            if key.startswith(KEY_PREFIX) and (name not in specs or not specs[name][0].outbound):
                self.host.unsubscribe(key)
        for spec, source in specs.values():
            self.outbox.put_binding(spec.name, spec.as_dict(), source)
            spec = self._instance(spec)
            self._recover(spec)
            self._launch(spec)
            if spec.outbound:
                self.host.subscribe(KEY_PREFIX + spec.name, spec.patterns())
        self._purge_handle = self._loop.call_later(PURGE_PERIOD, self._purge)

    def _instance(self, spec: BindingSpec) -> BindingSpec:
        """``spec`` with the token of its binding instance (see :mod:`.ledger`)."""
        assert self.outbox is not None
        return dataclasses.replace(spec, instance=self.outbox.instance(spec.name))

    def _recover(self, spec: BindingSpec) -> None:
        """Cached messages the binding should send that the outbox does not have: at
        start-up, those the core delivered but the outbox never got (a kill between the
        core's commit and the outbox's); at ``bridge add``, all of them (after ``bridge rm``
        the core does not deliver them again to the same subscription key). Held off like
        any other (a standby binding)."""
        if not spec.outbound:
            return
        assert self.outbox is not None
        known = self.outbox.known(spec.name)
        profile = Profile.from_patterns(spec.patterns())
        now = time.time()
        n = 0
        for descriptor, payload_of in self.host.cached():
            msg_id = descriptor.get("id", "")
            if msg_id in known or ORIGIN_MARK in descriptor or not profile.matches(descriptor):
                continue
            if not spec.selects(descriptor_values(descriptor)):
                continue
            deadline = float(descriptor.get("deadline", "0") or 0)
            payload = payload_of()
            if deadline <= now or payload is None:
                continue
            n += self.outbox.enqueue(
                spec.name, msg_id, descriptor, payload, deadline, now + spec.holdoff
            )
        if n:
            log.info("bridge %s: %d cached message(s) recovered into the outbox", spec.name, n)

    def _launch(self, spec: BindingSpec, paused: bool = False) -> Binding:
        assert self.outbox is not None
        host_id = self.host.host_id
        b = Binding(
            spec,
            self.outbox,
            lambda s, cb: make_link(s, host_id, cb),
            self._from_thread,
            paused=paused,
        )
        if not paused:
            self._bindings[spec.name] = b
        b.start()
        return b

    async def close(self) -> None:
        if self._purge_handle is not None:
            self._purge_handle.cancel()
        loop = asyncio.get_running_loop()
        bindings = list(self._bindings.values())
        self._bindings.clear()
        await asyncio.gather(*(loop.run_in_executor(None, b.stop) for b in bindings))
        if self.outbox is not None:
            self.outbox.close()
            self.outbox = None

    def _purge(self) -> None:
        if self.outbox is not None:
            self._expired += self.outbox.purge(time.time())
        assert self._loop is not None
        self._purge_handle = self._loop.call_later(PURGE_PERIOD, self._purge)

    # ------------------------------------------------------------------ DoDWAN -> broker

    def deliver(self, ev: MessageDelivered) -> None:
        """A delivery for ``bridge:NAME``: into the outbox (committed), then wake the thread."""
        name = ev.subscription[len(KEY_PREFIX) :]
        b = self._bindings.get(name)
        if b is None or self.outbox is None:
            return
        d = ev.descriptor
        if ORIGIN_MARK in d:  # came in through some bridge: never out again
            self._loops_prevented[name] = self._loops_prevented.get(name, 0) + 1
            return
        if not b.spec.selects(descriptor_values(d)):
            b.filtered += 1
            return
        now = time.time()
        try:
            deadline = float(d.get("deadline", "0"))
        except ValueError:
            deadline = now + 3600
        not_before = now + b.spec.holdoff
        try:
            added = self.outbox.enqueue(
                name, d.get("id", ""), dict(d), ev.payload, deadline, not_before
            )
        except sqlite3.Error as exc:  # e.g. disk full: recovered from the cache at restart
            b.record_error(exc)
            log.error("bridge %s: cannot write the outbox: %s", name, exc)
            return
        if added:
            b.wake()

    # ------------------------------------------------------------------ broker -> DoDWAN

    def _from_thread(self, binding: Binding, msg: Inbound) -> bool:
        """Called on a binding's thread: publish on the loop and wait for the outcome."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False

        async def run() -> bool:
            return self._inbound(binding, msg)

        try:
            return asyncio.run_coroutine_threadsafe(run(), loop).result(30.0)
        except Exception as exc:
            binding.record_error(exc)
            return False

    def _inbound(self, binding: Binding, msg: Inbound) -> bool:
        spec = binding.spec
        if self.outbox is None:
            return False
        echo = msg.dodwan_id
        if echo is not None:
            # It went to the broker from a DoDWAN gateway (maybe this one): it is in the
            # field already. A binding that has not sent it yet need not.
            binding.echoes += 1
            if msg.elsewhere:
                # From a destination the binding does not send to (MQTT: a deeper topic its
                # filter covers, where another binding sends, or a subscription the session
                # kept from a removed or replaced binding of this name): whether there or
                # not, the message is not on this binding's destination yet.
                return True
            if (
                spec.outbound
                and msg.headers.get(GATEWAY_HEADER) == f"{self.host.host_id}/{spec.name}"
            ):
                # Sent by a binding of this gateway and name. This very instance's message,
                # taken by the broker: sent (MQTT's ledger). One a removed binding of the
                # same name sent (its echo waited in the session the new one took over), or
                # an earlier version (no instance), says nothing about this instance's
                # rows: they are sent (again), a copy at worst, never a loss.
                if spec.instance and msg.headers.get(INSTANCE_HEADER) == spec.instance:
                    seqs = self.outbox.pending_seqs(spec.name, {echo})
                    binding.sent += self.outbox.mark_sent(spec.name, seqs)
            elif spec.outbound:
                try:
                    keep = float(msg.headers.get(DEADLINE_HEADER, ""))
                except ValueError:
                    keep = time.time() + 86400
                self.outbox.mark_echoed(spec.name, echo, keep)
            return True
        if not spec.selects(inbound_values(msg)):
            binding.filtered += 1
            return True  # acknowledged: the binding does not want it
        ep = spec.endpoint
        if len(msg.body) > self.host.max_payload:
            # It never fits: counted and logged, and acknowledged, or it would come back for
            # ever (and, in order, hold back what follows it).
            exc = ValueError(
                f"payload of {len(msg.body)} bytes larger than {self.host.max_payload}"
            )
            binding.record_error(exc)
            log.error("bridge %s: message dropped: %s", spec.name, exc)
            return True
        now = time.time()
        # Capped: a binding kept from before the daemon's max_ttl was lowered.
        deadline = now + min(spec.ttl, self.host.max_ttl)
        if msg.expires is not None:
            if msg.expires <= now:
                return True  # expired on the way: nothing to deliver
            deadline = min(deadline, msg.expires)
        left_out: list[str] = []
        attrs = inbound_attributes(msg, spec.attributes, ep.display, left_out)
        if spec.joms:  # a JMS BytesMessage for the daemon's JOMS clients
            attrs.setdefault("jms_body", "bytes")
            attrs.setdefault("jms_timestamp", str(int(now * 1000)))
        digest = None
        if msg.remote_id:
            attrs["id"] = inbound_id(f"{ep.scheme}:{ep.path}", msg.remote_id)
        else:
            # No id to derive the DoDWAN id from: a redelivery of a message published
            # already (its acknowledgement lost) is recognised by its content.
            digest = content_digest(f"{ep.scheme}:{ep.path}", msg)
            if msg.redelivered and self.outbox.seen(spec.name, digest):
                binding.duplicates += 1
                return True
        priority = 4 if msg.priority is None else min(9, max(0, msg.priority))
        # Refusals: the payload's size and the deadline are checked above, so a ValueError
        # or TypeError here is about the attributes (for good: the message is acknowledged
        # and dropped, counted and logged). Anything else -- a full cache (CacheFullError),
        # storage -- may pass later: not acknowledged, the broker keeps the message.
        try:
            try:
                self._publish_mapped(spec, msg, attrs, left_out, deadline, priority)
            except CacheFullError:
                raise
            except (TypeError, ValueError) as exc:
                if "already known" in str(exc):
                    binding.duplicates += 1
                    return True
                raise
        except CacheFullError as exc:
            binding.record_error(exc)
            return False  # not acknowledged: the broker keeps it
        except (TypeError, ValueError) as exc:
            binding.record_error(exc)
            log.error("bridge %s: message refused: %s", spec.name, exc)
            return True
        except Exception as exc:
            binding.record_error(exc)
            log.error("bridge %s: message not published (kept by the broker): %s", spec.name, exc)
            return False
        binding.received += 1
        if digest is not None:
            self.outbox.remember(spec.name, digest, deadline)
        self.outbox.add_received(spec.name)
        return True

    def _publish_mapped(
        self,
        spec: BindingSpec,
        msg: Inbound,
        attrs: dict[str, str],
        left_out: list[str],
        deadline: float,
        priority: int,
    ) -> None:
        """Publish ``msg`` with its remote headers, leaving out only those the core refuses.

        Headers that are not valid attributes one by one are left out already; when the
        core still refuses (the descriptor over ``limits.max_descriptor_bytes``), the largest
        remote header goes, then the next, the correlation id and type last (a few more tries
        at most: :data:`MAX_MAPPED` headers are mapped). Raises what the core raises
        without any of them (then the attributes are refused for good),
        or a refusal that is not about attributes (e.g. a full cache) at once."""
        fixed = set(spec.attributes) | {ORIGIN_MARK, "id"}
        remote = sorted(
            (k for k in attrs if k in msg.headers and k not in fixed),
            key=lambda k: len(k) + len(attrs[k]),
            reverse=True,
        )
        # Last, what the remote side's own fields gave (as when every header went).
        remote += [k for k in ("jms_correlation_id", "jms_type") if k in attrs and k not in fixed]
        remote = list(dict.fromkeys(remote))
        while True:
            try:
                self.host.publish(attrs, msg.body, deadline, priority)
                break
            except CacheFullError:  # a ValueError, but not about the attributes
                raise
            except (TypeError, ValueError) as exc:
                if "already known" in str(exc) or not remote:
                    raise
                log.debug("bridge %s: %s; header %r left out", spec.name, exc, remote[0])
                attrs = {k: v for k, v in attrs.items() if k != remote[0]}
                left_out.append(remote.pop(0))
        if left_out:
            more = f" and {len(left_out) - 8} more" if len(left_out) > 8 else ""
            log.warning(
                "bridge %s: remote header(s) %s%s not valid as attributes: left out",
                spec.name,
                ", ".join(repr(n) for n in left_out[:8]),
                more,
            )

    # ------------------------------------------------------------------ run-time changes

    @staticmethod
    def _stored(name: str, what: str, outcome: str, write: Callable[[], T]) -> T:
        """``write()`` to the outbox database, made before the change it records: when it
        fails (disk full) nothing has changed, and the answer is a 507 naming it (one log
        line, no traceback): the running bindings stay what a restart would bring back."""
        try:
            return write()
        except sqlite3.Error as exc:
            message = f"cannot store {what} {name!r} ({exc}); {outcome}"
            log.warning("bridge %s: %s", name, message)
            raise BridgeError(507, message) from None

    async def add(self, data: Any, replace: bool = False) -> dict[str, Any]:
        try:
            spec = BindingSpec.from_dict(data, self.host.max_ttl)
            if spec.outbound:
                Profile.from_patterns(spec.patterns())
        except (SpecError, PatternError) as exc:
            raise BridgeError(400, str(exc)) from None
        # No name given: the one made from the URI, unless a binding of another URI has it.
        derived = isinstance(data, dict) and not data.get("name")
        hint = " (a name made from the URI: give this one another with --name)" if derived else ""
        async with self._busy:
            if derived and self._named_for_another(spec):
                spec = dataclasses.replace(spec, name=hashed_name(spec.name, spec.endpoint))
            old = self._bindings.get(spec.name)
            if old is not None and not replace:
                raise BridgeError(
                    409, f"binding {spec.name!r} exists{hint}; use replace to change it"
                )
            if spec.name in self._invalid and not replace:
                raise BridgeError(
                    409,
                    f"binding {spec.name!r} kept from a previous run is invalid "
                    f"({self._invalid[spec.name][1]}){hint}; use replace to change it",
                )
            outbox = self.outbox
            assert outbox is not None
            if old is None:
                # Stored first (with a new instance: a binding added after `bridge rm` of
                # the same name is a new one, the old one's ledger is not its own).
                spec = dataclasses.replace(
                    spec,
                    instance=self._stored(
                        spec.name,
                        "binding",
                        "not added",
                        lambda: outbox.add_binding(spec.name, spec.as_dict(), "api"),
                    ),
                )
                # The cached matching messages go out, as at start-up: the core hands them
                # over to a new subscription, but not again to one of the same key (a
                # binding removed and added again).
                try:
                    self._recover(spec)
                except sqlite3.Error as exc:  # recovered at the next start (see _recover)
                    log.warning(
                        "bridge %s: cached messages not put in the outbox (%s); they are at "
                        "the next start",
                        spec.name,
                        exc,
                    )
                self._launch(spec)  # first: the core hands the cached messages over at once
                self._bind(spec)
                self._invalid.pop(spec.name, None)  # replaced: its outbox rows are this one's
            else:
                # A replacement keeps the instance (and the outbox rows).
                spec = self._stored(
                    spec.name,
                    "the replacement of binding",
                    "the old one stays",
                    lambda: self._instance(spec),
                )
                await self._replace(old, spec)
        return self.binding_status(spec.name)

    def _named_for_another(self, spec: BindingSpec) -> bool:
        """Whether a binding of another URI (credentials aside) has ``spec``'s name."""
        b = self._bindings.get(spec.name)
        if b is not None:
            return b.spec.endpoint.display != spec.endpoint.display
        if spec.name in self._invalid:
            stored = str(self._invalid[spec.name][0].get("uri", ""))
            return without_credentials(stored) != without_credentials(spec.uri)
        return False

    def _store_replacement(self, spec: BindingSpec) -> None:
        assert self.outbox is not None
        outbox = self.outbox
        self._stored(
            spec.name,
            "the replacement of binding",
            "the old one stays",
            lambda: outbox.put_binding(spec.name, spec.as_dict(), "api"),
        )

    def _bind(self, spec: BindingSpec) -> None:
        """The core subscription of a binding just stored. (Its own writes to the core's
        database are not checked: the outbox database says which bindings there are, and
        each start subscribes and unsubscribes ``bridge:NAME`` keys to match it.)"""
        key = KEY_PREFIX + spec.name
        if spec.outbound:
            self.host.subscribe(key, spec.patterns())
        elif key in self.host.subscription_keys():
            self.host.unsubscribe(key)

    async def _replace(self, old: Binding, spec: BindingSpec) -> None:
        if _exclusive(old.spec) and _exclusive(spec):
            await self._replace_exclusive(old, spec)
            return
        loop = asyncio.get_running_loop()
        # The old link must not reconnect (it could take the new one's session over), nor
        # be connecting: its attempt would reach the broker after the new one's.
        await loop.run_in_executor(None, old.retire, RETIRE_WAIT)
        new = self._launch(spec, paused=True)
        await loop.run_in_executor(None, new.tried.wait, CONNECT_WAIT)
        if not new.ready.is_set():
            reason = new.last_error or "no answer"
            await loop.run_in_executor(None, new.stop)
            old.unretire()
            raise BridgeError(
                502, f"new binding {spec.name!r} did not connect ({reason}); the old one stays"
            )
        try:
            self._store_replacement(spec)
        except BridgeError:
            await loop.run_in_executor(None, new.stop)
            old.unretire()
            raise
        old.pause()
        await loop.run_in_executor(None, old.wait_idle, 30.0)
        self._bindings[spec.name] = new
        self._bind(spec)
        await loop.run_in_executor(None, old.stop)
        new.resume()
        log.info("bridge %s replaced (%s)", spec.name, spec.endpoint.display)
        await self._forget_remote(old.spec, spec)

    async def _replace_exclusive(self, old: Binding, spec: BindingSpec) -> None:
        """Break-before-make, for links that cannot coexist (a STOMP durable topic
        subscription: one client id, one connection). Nothing is lost in between: the
        outbox keeps the outgoing messages, the broker the incoming ones."""
        loop = asyncio.get_running_loop()
        old.pause()
        await loop.run_in_executor(None, old.wait_idle, 30.0)
        await loop.run_in_executor(None, old.stop)
        new = self._launch(spec, paused=True)
        # Retried until then: the broker may take a moment to release the client id.
        await loop.run_in_executor(None, new.ready.wait, CONNECT_WAIT)
        if not new.ready.is_set():
            reason = new.last_error or "no answer"
            await loop.run_in_executor(None, new.stop)
            self._launch(old.spec)  # back as it was
            raise BridgeError(
                502, f"new binding {spec.name!r} did not connect ({reason}); the old one stays"
            )
        try:
            self._store_replacement(spec)
        except BridgeError:
            await loop.run_in_executor(None, new.stop)
            self._launch(old.spec)  # back as it was
            raise
        self._bindings[spec.name] = new
        self._bind(spec)
        new.resume()
        log.info("bridge %s replaced, break-before-make (%s)", spec.name, spec.endpoint.display)

    async def _forget_remote(self, old: BindingSpec, new: BindingSpec | None) -> None:
        """After ``bridge rm`` (``new`` None) or a replacement: delete what the old binding
        kept on its broker that nothing will read any more and that would fill for ever,
        an AMQP exchange binding's inbound queue (unless the new binding consumes from it:
        inbound from an exchange of the same broker, which rebinds it, see
        :meth:`.amqp.AmqpLink._unbind_stale`). Best effort: a failure is logged."""
        o = old.endpoint
        if not (o.scheme == "amqp" and o.kind == "exchange" and old.inbound):
            return
        if new is not None:
            n = new.endpoint
            if (n.scheme, n.kind, n.host, n.port) == (o.scheme, o.kind, o.host, o.port) and (
                new.inbound
            ):
                return
        from .amqp import remove_inbound_queue

        loop = asyncio.get_running_loop()
        why = await loop.run_in_executor(None, remove_inbound_queue, old, self.host.host_id)
        if why:
            log.warning("bridge %s: %s; delete it on the broker", old.name, why)

    async def remove(self, name: str) -> dict[str, Any]:
        async with self._busy:
            b = self._bindings.get(name)
            if b is None and name in self._invalid:
                outbox = self.outbox
                assert outbox is not None
                unsent = self._stored(
                    name, "the removal of binding", "it is kept", lambda: outbox.drop_binding(name)
                )
                del self._invalid[name]
                return {"removed": name, "unsent_dropped": unsent}
            if b is None:
                raise BridgeError(404, f"no binding {name!r}")
            # Its link is stopped first (nothing goes out or comes in while its rows go);
            # it stays the current binding, whose deliveries the outbox takes, until they
            # are gone: if that cannot be stored, it is started again as it was.
            await asyncio.get_running_loop().run_in_executor(None, b.stop)
            outbox = self.outbox
            assert outbox is not None
            try:
                unsent = self._stored(
                    name, "the removal of binding", "it is kept", lambda: outbox.drop_binding(name)
                )
            except BridgeError:
                self._launch(b.spec)
                raise
            del self._bindings[name]
            self._invalid.pop(name, None)
            key = KEY_PREFIX + name
            if key in self.host.subscription_keys():
                self.host.unsubscribe(key)
            self._loops_prevented.pop(name, None)
            await self._forget_remote(b.spec, None)
        if unsent:
            log.warning("bridge %s removed with %d unsent message(s)", name, unsent)
        return {"removed": name, "unsent_dropped": unsent}

    # ------------------------------------------------------------------ status

    def binding_status(self, name: str) -> dict[str, Any]:
        b = self._bindings[name]
        assert self.outbox is not None
        out = b.spec.as_dict(secrets=False)
        out.update(b.status())
        out.update(self.outbox.marks(name))
        out["loops_prevented"] = self._loops_prevented.get(name, 0)
        return out

    def status(self) -> list[dict[str, Any]]:
        rows = [self.binding_status(n) for n in self._bindings]
        rows += [self._invalid_status(n) for n in self._invalid if n not in self._bindings]
        return sorted(rows, key=lambda r: str(r["name"]))

    def _invalid_status(self, name: str) -> dict[str, Any]:
        """A binding kept from a previous run that this version refuses: its stored spec
        (credentials left out), the reason, its outbox figures."""
        assert self.outbox is not None
        data, reason = self._invalid[name]
        out = {k: v for k, v in data.items() if k in _SHOWN_WHEN_INVALID}
        out.update(
            name=name,
            uri=without_credentials(str(data.get("uri", ""))),
            state="invalid",
            connected=False,
            errors=0,
            last_error=f"refused by this version: {reason}",
        )
        out.setdefault("direction", "both")
        out.update(self.outbox.marks(name))
        return out

    def metrics(self) -> list[str]:
        rows = self.status()
        lines: list[str] = []
        for metric, field, kind, help_text in (
            ("dodwan_bridge_connected", "connected", "gauge", "1 while the binding is connected."),
            ("dodwan_bridge_backlog", "backlog", "gauge", "Messages waiting in the outbox."),
            ("dodwan_bridge_sent_total", "sent_total", "counter", "Messages the broker confirmed."),
            (
                "dodwan_bridge_received_total",
                "received_total",
                "counter",
                "Messages published in DoDWAN from the broker.",
            ),
            ("dodwan_bridge_errors_total", "errors", "counter", "Link errors since the start."),
        ):
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
            for r in rows:
                lines.append(f'{metric}{{binding="{r["name"]}"}} {int(r[field])}')
        lines += [
            "# HELP dodwan_bridge_expired_total Outbox messages whose deadline passed unsent.",
            "# TYPE dodwan_bridge_expired_total counter",
            f"dodwan_bridge_expired_total {self._expired}",
        ]
        return lines


_SHOWN_WHEN_INVALID = frozenset({"direction", "attributes", "filter", "selector", "ttl", "holdoff"})


def _exclusive(spec: BindingSpec) -> bool:
    """A binding whose link cannot run beside its replacement's (same durable identity)."""
    ep = spec.endpoint
    return ep.scheme == "stomp" and ep.kind == "topic" and spec.inbound
