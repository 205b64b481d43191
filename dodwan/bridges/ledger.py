"""The broker-side ledger of a binding: which batch the broker last committed.

A batch is sent in a broker transaction (STOMP, AMQP). The same transaction writes one
ledger message — the DoDWAN ids of the batch — to a private durable queue of the binding
(:func:`queue_name`). So the broker holds, atomically with the messages themselves, the
record of the last batch it took. When the connection breaks after the commit was sent and
before its answer came (the broker stopped, the gateway was killed), the gateway cannot
tell whether the batch is on the broker; after reconnecting it reads the ledger, marks the
batch sent if the ledger names it, and sends it again only if not. That makes delivery to
the broker exactly once across broker and gateway restarts, not just at least once.

Only the newest ledger message matters: older ones are removed (STOMP: acknowledged in the
next transaction; AMQP: a queue holding one message). MQTT has no transactions: there the
binding's own subscription serves as the ledger (see :mod:`.mqtt`).

A ledger message names the binding *instance* that wrote it (a token kept in the outbox,
the same across restarts and ``--replace``, new after ``bridge rm``) and its destination,
and is trusted only by that instance for that destination: an entry written by a removed
binding of the same name, for another destination, by another gateway, or by a version
that wrote bare id lists, names nothing (the batch in doubt is sent again: a copy at worst,
never a loss).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from .ids import pair_digest

if TYPE_CHECKING:
    from .uri import BindingSpec

HEADER = "dodwan-ledger"
"""Header (STOMP) / AMQP ``type`` marking a ledger message."""

_PLAIN_HOST = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""Host ids the first form of the names keeps as they are (it splits one way only)."""


def _host(host_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", host_id)[:64]


def queue_name(host_id: str, binding: str) -> str:
    """The binding's ledger queue (one per gateway host and binding name).

    ``dodwan.ledger.HOST.NAME`` when the host id holds only letters, digits, ``_`` and
    ``-`` (the name of earlier versions, kept: HOST has no '.', so the name splits one way
    only). Otherwise, where earlier versions turned '.' and other characters into '_'
    (hosts ``a.b`` and ``a_b`` shared a ledger), ``dodwan.ledger-HASH.HOST.NAME`` with a
    hash of the pair: the '-' after ``ledger`` keeps it apart from every name of the
    first form."""
    if _PLAIN_HOST.match(host_id):
        return f"dodwan.ledger.{host_id}.{binding}"
    return f"dodwan.ledger-{pair_digest(host_id, binding)}.{_host(host_id)}.{binding}"


def topic_name(host_id: str, binding: str) -> str:
    """MQTT: the topic of the binding's ledger probes, ``dodwan-ledger/HOST/NAME``, or
    ``dodwan-ledger/HOST/NAME/HASH`` (one level more) when HOST is not kept as it is."""
    if _PLAIN_HOST.match(host_id):
        return f"dodwan-ledger/{host_id}/{binding}"
    return f"dodwan-ledger/{_host(host_id)}/{binding}/{pair_digest(host_id, binding)}"


def _destination(spec: BindingSpec) -> str:
    return f"{spec.endpoint.scheme}:{spec.endpoint.path}"


def encode(spec: BindingSpec, ids: list[str]) -> bytes:
    """The ledger message of a batch of ``spec``'s binding instance."""
    entry = {"binding": spec.instance, "to": _destination(spec), "ids": ids}
    return json.dumps(entry, separators=(",", ":")).encode()


def decode(spec: BindingSpec, body: bytes) -> set[str]:
    """The ids a ledger message names, when ``spec``'s binding instance wrote it for its
    destination (empty otherwise: not one of ours, or not this binding's)."""
    try:
        entry: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return set()
    if not (
        isinstance(entry, dict)
        and spec.instance
        and entry.get("binding") == spec.instance
        and entry.get("to") == _destination(spec)
        and isinstance(entry.get("ids"), list)
    ):
        return set()
    return {i for i in entry["ids"] if isinstance(i, str) and i}
