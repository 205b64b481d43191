"""Names a binding gives itself at the broker, one per (gateway host, binding name).

A broker-side name that must survive restarts (an MQTT persistent session's client id, a
durable STOMP subscription's client id and name) is made from the host id and the binding
name. Joined with '-' they are ambiguous when either holds a '-' (host ``a-b``'s binding
``c`` and host ``a``'s binding ``b-c``), and generated host ids always do; two gateways
must never share such a name (they would take the session or subscription from each
other, and the broker would delete what waited in it).
"""

from __future__ import annotations

import hashlib


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
    digest = hashlib.sha256(f"{host_id}\0{name}".encode()).hexdigest()[:16]
    return f"{plain[:79]}-{digest}"
