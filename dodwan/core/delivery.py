"""Local subscriptions and the delivery of complete messages to them (each at most once per
subscription, signed by a trusted key when the subscription asks for it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mypy_extensions import trait

from . import message as m
from .cache import Cached
from .errors import WireError
from .events import MessageDelivered
from .node_state import NodeState
from .patterns import PatternError, Profile, ProfileIndex, normalise_specs
from .profiles import split


@dataclass(slots=True)
class Subscription:
    key: str
    profile: Profile
    trusted: frozenset[str] | None = None
    """Hex Ed25519 public keys one of which must have signed a message (None: any message)."""

    def accepts(self, descriptor: Mapping[str, str]) -> bool:
        if self.trusted is not None and descriptor.get(m.SIGKEY) not in self.trusted:
            return False
        return self.profile.matches(descriptor)


_NONE: frozenset[str] = frozenset()

_TRUSTED = "#trusted"
"""Subscription options travel to the store as a final one-entry dict with this key."""


def split_options(
    specs: list[dict[str, str]],
) -> tuple[list[dict[str, str]], frozenset[str] | None]:
    if specs and _TRUSTED in specs[-1]:
        keys = specs[-1][_TRUSTED]
        return specs[:-1], frozenset(k for k in keys.split(",") if k)
    return specs, None


def check_public_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError("trusted keys are hex strings")
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raise ValueError(f"trusted key {key!r} is not hex") from None
    if len(raw) != 32:
        raise ValueError(f"trusted key {key!r} is not a 32-byte Ed25519 public key")
    return raw.hex()


_INFLATION_RETRY = 10.0  # seconds between looks at deliveries waiting for an allowance


@trait
class DeliveryMixin(NodeState):
    """The subscription and delivery part of :class:`~dodwan.core.node.Node`."""

    _sub_index: ProfileIndex | None = None
    """Built at the first delivery after a change of the subscriptions (None: to build)."""

    def subscribe(
        self,
        patterns: Mapping[str, str] | Sequence[Mapping[str, str]],
        now: float,
        key: str | None = None,
        trusted_keys: Sequence[str] | None = None,
    ) -> str:
        """Add (or replace, when ``key`` exists) a subscription; returns its key.

        ``patterns`` is one mapping attribute -> regex, or a list of them (an OR). Cached
        complete messages that match are delivered at once (each at most once per key).
        With ``trusted_keys`` (hex Ed25519 public keys), only messages signed by one of
        them are delivered.
        """
        specs = normalise_specs(patterns)
        trusted: frozenset[str] | None = None
        if trusted_keys is not None:
            if isinstance(trusted_keys, str | bytes):
                raise TypeError("trusted_keys is a sequence of hex public keys")
            trusted = frozenset(check_public_key(k) for k in trusted_keys)
            if not trusted:
                raise ValueError("trusted_keys must name at least one key")
        try:
            profile = Profile.from_patterns(specs, self._limits)
        except PatternError as exc:
            raise ValueError(str(exc)) from None
        if key is None:
            while True:
                self._sub_counter += 1
                key = f"sub-{self._sub_counter}"
                if key not in self._subs:
                    break
        elif not isinstance(key, str) or not key or len(key) > 128:
            raise ValueError("subscription key must be a non-empty str of at most 128 characters")
        others = [s.profile for k, s in self._subs.items() if k != key]
        merged = Profile([p for prof in [*others, profile] for p in prof.patterns])
        if len(merged.patterns) > self._limits.max_patterns:
            raise ValueError(f"the host profile would exceed {self._limits.max_patterns} patterns")
        if merged.cost > self._limits.max_profile_program:  # a peer would drop it whole
            raise ValueError(
                "the host profile's expressions would be too complex: more than "
                f"limits.max_profile_program ({self._limits.max_profile_program}) RE2 "
                "instructions with the other subscriptions; use fewer or simpler patterns"
            )
        if len(split(merged, self._piece_room())) > self._limits.max_profile_pieces:
            raise ValueError(
                f"the host profile would span more than {self._limits.max_profile_pieces} "
                "profile pieces; use fewer or shorter patterns"
            )
        sub = Subscription(key, profile, trusted)
        self._subs[key] = sub
        self._sub_index = None
        options = [] if trusted is None else [{_TRUSTED: ",".join(sorted(trusted))}]
        self._store.put_subscription(key, specs + options)
        self._rebuild_own_profile()
        self._schedule_basics(now)
        self._prompt(now)
        for c in list(self._cache.values()):
            if c.complete and sub.accepts(c.descriptor):
                self._deliver(c, now, only=key)
        self._store.commit()
        return key

    def unsubscribe(self, key: str, now: float) -> None:
        """Remove a subscription; unknown keys raise ``KeyError``."""
        if key not in self._subs:
            raise KeyError(f"no subscription {key!r}")
        del self._subs[key]
        self._sub_index = None
        self._store.delete_subscription(key)
        self._rebuild_own_profile()
        self._prompt(now)
        self._store.commit()

    def subscriptions(self) -> dict[str, list[dict[str, str]]]:
        """Local subscriptions: key -> patterns."""
        return {k: s.profile.specs() for k, s in self._subs.items()}

    def trusted_keys(self, key: str) -> list[str] | None:
        """The public keys a subscription requires (None when it accepts unsigned messages)."""
        trusted = self._subs[key].trusted
        return None if trusted is None else sorted(trusted)

    def subscription_accepts(self, key: str, msg_id: str) -> bool:
        """Whether subscription ``key`` exists and would be delivered the complete cached
        message ``msg_id``: its patterns match and, when it names trusted keys, one of them
        signed it (what a delivery redone outside the core must check)."""
        s = self._subs.get(key)
        c = self._cache.get(msg_id)
        return s is not None and c is not None and c.complete and s.accepts(c.descriptor)

    def _inflation_allowed(self, c: Cached, now: float) -> bool:
        """Charge what inflating ``c`` adds (its size beyond its compressed size) to its
        origin's allowance and to the total; when either is spent the delivery waits: the
        message stays cached and :meth:`_retry_inflation` delivers it once they refill."""
        h = c.header
        extra = h.size - h.zsize
        if extra <= 0 or c.meta.local:
            return True
        budget = self._inflation
        need = min(extra, budget.capacity)  # one message larger than any allowance: when full
        if budget.available(h.origin, now) >= need:
            budget.spend(h.origin, need)
            self._inflation_waiting.pop(h.msg_id, None)
            return True
        self._inflation_denials += 1
        if h.msg_id not in self._inflation_waiting:
            self._inflation_waiting[h.msg_id] = None
            self._count("deliveries_deferred_inflation")
        if self._inflation_retry_at is None:
            self._inflation_retry_at = now + _INFLATION_RETRY
        return False

    def _retry_inflation(self, now: float) -> None:
        """Deliver the messages that waited for their origin's inflation allowance, in the
        order they came, as far as the allowances have refilled."""
        self._inflation_retry_at = None
        for msg_id in list(self._inflation_waiting):
            c = self._cache.get(msg_id)
            if c is None or not c.complete or c.header.deadline <= now:
                del self._inflation_waiting[msg_id]
                continue
            denials = self._inflation_denials
            self._deliver(c, now)  # delivered: it leaves the list; refused again: it stays
            if msg_id in self._inflation_waiting and self._inflation_denials == denials:
                del self._inflation_waiting[msg_id]  # no subscription wants it any more

    def _deliver(
        self,
        c: Cached,
        now: float,
        only: str | None = None,
        payload: bytes | None = None,
        chunks: list[bytes] | None = None,
    ) -> None:
        """Deliver a complete message to each matching subscription not yet served
        (``chunks``: its fragments, already verified)."""
        msg_id = c.header.msg_id
        done = self._history.get(msg_id, _NONE)
        desc = c.descriptor
        subs = self._subs
        if only is not None:
            s = subs.get(only)
            keys = [only] if s is not None and only not in done and s.accepts(desc) else []
        else:
            index = self._sub_index  # None after a change of the subscriptions
            if index is None:
                index = self._sub_index = ProfileIndex((k, sub.profile) for k, sub in subs.items())
            keys = [k for k in index.candidates(desc) if k not in done and subs[k].accepts(desc)]
        if not keys:
            return
        if payload is None:
            if not self._inflation_allowed(c, now):
                return
            z = b"".join(chunks) if chunks is not None else self._assemble(c)
            try:
                if z is None:
                    raise WireError("missing fragment")
                payload = m.inflate_payload(z, c.header, verified=chunks is not None)
            except WireError:
                self._count("corrupt_messages")
                self._drop(msg_id, now, "corrupt")
                return
        for k in keys:
            self._add_history(msg_id, k, c.header.deadline)
            self._events.append(MessageDelivered(k, dict(c.descriptor), payload))
            self._count("messages_delivered")
            self._tr(now, "message_delivered", msg_id, c.header.size, c.meta.hops, k)
        self._ack_delivered(c, now)
