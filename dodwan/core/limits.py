"""Bounds on everything a peer (or a local caller) can make this node hold or compute.

Remote input is hostile: every size, count and length that arrives on the wire is checked
against these limits before anything is allocated or matched.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard limits; exceeding one drops the datagram (remote) or raises (local)."""

    max_attributes: int = 64
    """Attributes in one descriptor."""

    max_attribute_name: int = 64
    """Characters in an attribute name."""

    max_descriptor_bytes: int = 8192
    """Bytes of an encoded (uncompressed) descriptor."""

    max_message_size: int = 64 * 1024 * 1024
    """Bytes of an uncompressed payload; a decompression that would exceed the size the
    descriptor declares (itself bounded by this) is refused before it inflates."""

    max_fragments: int = 65536
    """Fragments in one message."""

    max_patterns: int = 1024
    """Selection patterns in one profile (local subscriptions or a peer's). A profile is
    not limited by a datagram: it travels in profile pieces (see ``max_profile_pieces``)."""

    max_profile_pieces: int = 64
    """Profile pieces (datagrams) one profile may span."""

    max_profile_assemblies: int = 64
    """Profiles of other hosts being assembled from pieces at once; past that the oldest
    assembly is dropped (it is asked again at the next announcement)."""

    max_pattern_attributes: int = 16
    """Attributes constrained by one pattern."""

    max_regex_length: int = 256
    """Characters in one regular expression."""

    max_remote_memory: int = 64 * 1024 * 1024
    """Bytes of state peers' datagrams make this host keep, all peers together: decoded
    descriptors of offers, compiled profiles (each RE2 expression charged its memory
    ceiling, ``REGEX_MEMORY``), profile pieces being assembled, and the offers each
    neighbour made. Charged to the source address each came from; past the budget the
    address holding the most gives up its oldest state first (see ``dodwan/core/ledger.py``).
    Messages themselves are governed by the cache (``cache_capacity``, ``max_partial_bytes``)."""

    max_neighbours: int = 256
    """Neighbours tracked at once; a newcomer past that displaces the one heard least
    recently (each neighbour holds offers, profiles and queued requests)."""

    max_regex_program: int = 4096
    """RE2 instructions one compiled expression may take (what it costs in memory and
    matching). Typical expressions take 5-150 (``[0-9a-f]{64}``: 132); counted repetitions
    are what grows them: ``.{999}`` takes ~8,000 and is refused."""

    max_profile_program: int = 65536
    """RE2 instructions all the expressions of one profile (own or a peer's) may take."""

    max_relayed_profiles: int = 64
    """Profiles of other hosts kept per neighbour (horizon relay)."""

    max_catalog_entries: int = 512
    """Entries in one received catalog datagram."""

    max_request_entries: int = 256
    """Messages in one received request."""

    max_requests_per_second: float = 2000.0
    """Fragments (and profile pieces) one source address may ask us to send per second
    (token bucket): every sender name behind one socket shares it."""

    max_served_per_second: float = 8000.0
    """Fragments and profile pieces all neighbours together may ask us to send per second,
    so ever new source addresses cannot make a host send without bound."""

    max_descriptor_decodes: float = 1000.0
    """Descriptors not seen before that one source address may make this node decode per
    second, offered in catalogs or carried by unrequested fragments (token bucket). Decoding,
    checking and matching one costs tens of microseconds; past the budget an offer is
    ignored until it is offered again (offers are repeated), so a flood of offers costs a
    bounded share of a core whatever its datagrams hold."""

    max_descriptor_decodes_total: float = 4000.0
    """The same for all source addresses together."""

    max_partial_bytes: int = 32 * 1024 * 1024
    """Bytes held in incomplete messages (reassembly memory) before new partial sets are refused."""

    max_partial_share: float = 0.5
    """Fraction of ``max_partial_bytes`` the transfers from one source address may hold,
    so one neighbour (whatever names it uses) cannot take the whole reassembly memory with
    messages it never finishes: a neighbour arriving later still gets the rest."""

    max_ttl: float = 7 * 86400.0
    """Longest lifetime of a message, in seconds: a local publication may not ask for more,
    and a peer's descriptor whose deadline lies further ahead than this (plus an hour for
    clock skew) is refused, so nothing a peer sends is carried, retried or remembered for
    ever."""

    max_inflation_per_origin: int = 256 * 1024 * 1024
    """Bytes the messages of one remote origin may grow by when inflated for delivery
    (uncompressed size beyond compressed size), per hour, bursting to that. A message past
    the allowance stays cached and is delivered when it has refilled (counter
    ``deliveries_deferred_inflation``), so a few KB of fragments of all-zero messages cannot
    make a host write gigabytes to its sinks. Messages published here are exempt."""

    max_inflation_total: int = 1024 * 1024 * 1024
    """The same for all remote origins together, per hour (origin names are free)."""

    max_origin_share: float = 0.5
    """Fraction of the cache capacity the messages of one remote origin may occupy, so a
    flooding peer cannot take the whole cache (messages published here are exempt)."""
