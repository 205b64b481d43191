"""Names a binding gives itself at the broker, one per (gateway host, binding name).

A broker-side name that must survive restarts (an MQTT persistent session's client id, a
durable STOMP subscription's client id and name) is made from the host id and the binding
name. Joined with '-' they are ambiguous when either holds a '-' (host ``a-b``'s binding
``c`` and host ``a``'s binding ``b-c``), and generated host ids always do; two gateways
must never share such a name (they would take the session or subscription from each
other, and the broker would delete what waited in it). The same holds for AMQP queue
names joined with '.' (:func:`inbound_queue`) and the ledgers (:mod:`.ledger`): each keeps
the plain form where it splits one way only and adds :func:`pair_digest` otherwise.
"""

from __future__ import annotations

import hashlib


def pair_digest(host_id: str, name: str) -> str:
    """A hash of the pair (16 hex digits), the same at every start."""
    return hashlib.sha256(f"{host_id}\0{name}".encode()).hexdigest()[:16]


def client_base(host_id: str, name: str) -> str:
    """The stem of a binding's broker-side names: one per (host, binding), the same at
    every start.

    ``dodwan-HOST-NAME`` when neither holds a '-' and it is short enough (the form of
    earlier versions, whose sessions and subscriptions are kept): it splits one way only.
    Otherwise a hash of the pair follows (``dodwan-h2-z-cl`` was host h2-z's binding cl and
    host h2's z-cl): such an id has at least four '-'-separated parts, so it is never an id
    of the first form either. At most 96 characters."""
    plain = f"dodwan-{host_id}-{name}"
    if "-" not in host_id and "-" not in name and len(plain) <= 96:
        return plain
    return f"{plain[:79]}-{pair_digest(host_id, name)}"


def inbound_queue(host_id: str, name: str) -> str:
    """The durable queue an AMQP exchange binding consumes from: one per (host, binding),
    the same at every start (what the exchange routes while the gateway is away waits there).

    ``dodwan.HOST.NAME`` when neither holds a '.' (the form of earlier versions, whose
    queues are kept): it splits one way only. Otherwise a hash of the pair follows
    (``dodwan.a.b.c`` was host a.b's binding c and host a's binding b.c): such a name has
    at least four '.'-separated parts, so it is never a name of the first form either."""
    plain = f"dodwan.{host_id}.{name}"
    if "." not in host_id and "." not in name and len(plain.encode()) <= 200:
        return plain
    host = host_id.encode()[:100].decode("utf-8", "ignore") or "_"
    return f"dodwan.{host}.{name}.{pair_digest(host_id, name)}"
