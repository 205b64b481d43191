"""What the JOMS service hands the dissemination layer for each message it sends (sans-IO,
a recording port): the DoDWAN id it chooses, and the persistence it asks for."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from typing import Any

import pytest

from dodwan import Limits, Node, NodeConfig
from dodwan.core.message import SYSTEM_ATTRIBUTES
from joms.errors import MessageFormatException
from joms.service import Destination, JomsMessage, JomsService, MemoryServiceStore
from joms.service import model as mdl
from joms.service.core_port import NodePort


class RecordingPort:
    host_id = "h1"

    def __init__(self) -> None:
        self.published: list[tuple[dict[str, str], dict[str, Any]]] = []

    def publish(self, attributes: Mapping[str, str], payload: bytes, **kw: Any) -> str:
        self.published.append((dict(attributes), kw))
        return attributes.get("id", f"h1-random{len(self.published)}")

    def subscribe(self, patterns: list[dict[str, str]], *, key: str) -> str:
        return key

    def unsubscribe(self, key: str) -> None:
        pass

    def drop(self, msg_id: str) -> None:
        pass


def service(seed: int = 1, store: Any = None) -> tuple[JomsService, RecordingPort]:
    port = RecordingPort()
    s = JomsService(port, store=store or MemoryServiceStore(), rng=random.Random(seed))
    s.start(1000.0)
    return s, port


def sent(port: RecordingPort) -> list[dict[str, str]]:
    return [a for a, _ in port.published if a.get(mdl.KIND) == mdl.KIND_MESSAGE]


def test_publications_get_ids_that_grow_within_a_run_and_differ_across_runs() -> None:
    """The service names its publications itself, ``host-<run epoch><counter>``: unique like
    the core's random ids, but growing, so the stores' indexes keyed by message id append
    instead of dirtying a random page per message."""
    store = MemoryServiceStore()
    s, port = service(1, store)
    conn = s.open_connection(1000.0)
    for i in range(300):
        s.send(conn, JomsMessage(Destination("topic", "t"), body=b"%d" % i), 1000.0 + i)
    ids = [a["id"] for a in sent(port)]
    assert len(ids) == 300 and len(set(ids)) == 300
    assert all(i.startswith("h1-") for i in ids)
    # within one width of the counter, each id sorts after the previous one
    runs = [ids[0:1]]
    for a, b in itertools.pairwise(ids):
        if len(b) == len(a):
            assert b > a
        else:
            runs.append([])
        runs[-1].append(b)
    assert len(runs) <= 3
    # a restart on the same store (even with the same seed) never reuses an id
    s2, port2 = service(1, store)
    conn2 = s2.open_connection(2000.0)
    for i in range(300):
        s2.send(conn2, JomsMessage(Destination("topic", "t"), body=b"%d" % i), 2000.0 + i)
    assert not set(ids) & {a["id"] for a in sent(port2)}


def test_a_message_at_the_attribute_limit_keeps_a_core_drawn_id() -> None:
    """``id`` counts as an attribute of its own when given: a message whose properties
    fill DoDWAN's attribute limit is not refused for it, the core draws its id."""
    s, port = service()
    conn = s.open_connection(1000.0)
    s.send(conn, JomsMessage(Destination("topic", "t"), body=b"x"), 1000.0)
    base = len(sent(port)[0]) - 1  # the attributes of a message without properties
    room = Limits().max_attributes - len(SYSTEM_ATTRIBUTES) - base - 1  # - jms_types
    props = {f"p{i}": i for i in range(room)}
    s.send(conn, JomsMessage(Destination("topic", "t"), body=b"y", properties=props), 1000.0)
    full = sent(port)[-1]
    assert "id" not in full
    assert len(full) + len(SYSTEM_ATTRIBUTES) == Limits().max_attributes


def test_a_core_node_accepts_named_publications_up_to_its_attribute_limit() -> None:
    node = Node(NodeConfig(host_id="h1"), rng=random.Random(1))
    s = JomsService(NodePort(node, lambda: 1000.0), rng=random.Random(1))
    s.start(1000.0)
    conn = s.open_connection(1000.0)
    refused = 0
    for n in range(60):  # up to and past the limit: refused only past it
        props = {f"p{i}": i for i in range(n)}
        try:
            s.send(conn, JomsMessage(Destination("topic", "t"), b"z", properties=props), 1000.0)
        except MessageFormatException:
            refused += 1
    # the core takes at most max_attributes minus its own system attributes from a
    # publisher: the service still reaches that (it does not name the fullest ones)
    widest = max(
        len([k for k in e["descriptor"] if k not in SYSTEM_ATTRIBUTES])
        for e in node.cache_listing()
    )
    assert widest == Limits().max_attributes - len(SYSTEM_ATTRIBUTES)
    assert refused > 0


def test_a_publication_whose_chosen_id_the_node_knows_gets_one_from_the_core() -> None:
    """A service started afresh (memory store, same seed) on a node that still caches what
    the previous one published chooses the same ids: the node refuses them, and the
    publication goes out under a core-drawn id instead of failing."""
    node = Node(NodeConfig(host_id="h1"), rng=random.Random(1))
    for _ in range(2):
        s = JomsService(NodePort(node, lambda: 1000.0), rng=random.Random(7))
        s.start(1000.0)
        conn = s.open_connection(1000.0)
        s.send(conn, JomsMessage(Destination("topic", "t"), b"m"), 1000.0)
    cached = [e for e in node.cache_listing() if e["descriptor"].get("jms_kind") == "message"]
    assert len(cached) == 2 and len({e["id"] for e in cached}) == 2


def test_once_is_a_reserved_property_name() -> None:
    # the core reads a descriptor attribute "once" as "done once delivered" (acks purge
    # the copies): a JMS property of that name would silently change how it is delivered
    with pytest.raises(MessageFormatException, match="reserved"):
        mdl.check_property_name("once")
    mdl.check_property_name("once_more")
