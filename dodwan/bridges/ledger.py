"""The broker-side ledger of a binding: which batch the broker last committed.

A batch is sent in a broker transaction (STOMP, AMQP). The same transaction writes one
ledger message — the DoDWAN ids of the batch — to a private durable queue of the binding,
``dodwan.ledger.HOST.NAME``. So the broker holds, atomically with the messages themselves,
the record of the last batch it took. When the connection breaks after the commit was sent
and before its answer came (the broker stopped, the gateway was killed), the gateway cannot
tell whether the batch is on the broker; after reconnecting it reads the ledger, marks the
batch sent if the ledger names it, and sends it again only if not. That makes delivery to
the broker exactly once across broker and gateway restarts, not just at least once.

Only the newest ledger message matters: older ones are removed (STOMP: acknowledged in the
next transaction; AMQP: a queue holding one message). MQTT has no transactions: there the
binding's own subscription serves as the ledger (see :mod:`.mqtt`).
"""

from __future__ import annotations

import json
import re

HEADER = "dodwan-ledger"
"""Header (STOMP) / AMQP ``type`` marking a ledger message."""


def _host(host_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", host_id)[:80]


def queue_name(host_id: str, binding: str) -> str:
    """The binding's ledger queue (one per gateway host and binding name)."""
    return f"dodwan.ledger.{_host(host_id)}.{binding}"


def topic_name(host_id: str, binding: str) -> str:
    """MQTT: the topic of the binding's ledger probes."""
    return f"dodwan-ledger/{_host(host_id)}/{binding}"


def encode(ids: list[str]) -> bytes:
    return json.dumps(ids, separators=(",", ":")).encode()


def decode(body: bytes) -> set[str]:
    """The ids a ledger message names (empty when it is not one of ours)."""
    try:
        ids = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return set()
    if not isinstance(ids, list):
        return set()
    return {i for i in ids if isinstance(i, str) and i}
