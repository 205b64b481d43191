"""How the STOMP gateway orders its work for a run of frames (one read from a client): the
store commit, the receipts, the deliveries, and what an ``auto`` consumer counts as
consumed. Driven in the loop with in-memory transports, so the order of writes is exact."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from joms.runtime import HostConfig, LoopbackHost
from joms.stomp.frame import Frame, FrameParser, encode


class FakeTransport(asyncio.Transport):
    """Records what the gateway writes (and counts the writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.writes = 0
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def frames(self) -> list[Frame]:
        return FrameParser().feed(bytes(self.out))


def connect_frame(**headers: str) -> bytes:
    return encode(Frame("CONNECT", {"accept-version": "1.2", "host": "h", **headers}))


def send_frame(dest: str, body: bytes, **headers: str) -> bytes:
    return encode(Frame("SEND", {"destination": dest, **headers}, body))


class Client:
    def __init__(self, host: LoopbackHost, **headers: str) -> None:
        gw = host.server.gateway  # type: ignore[union-attr]
        self.conn = gw.protocol()
        self.t = FakeTransport()
        self.conn.connection_made(self.t)
        self.conn.data_received(connect_frame(**headers))

    def feed(self, data: bytes) -> None:
        self.conn.data_received(data)

    def commands(self) -> list[str]:
        return [f.command for f in self.t.frames()]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_receipts_of_a_run_go_out_before_its_deliveries_are_worked_out(tmp_path: Path) -> None:
    """The producer gets its receipt as soon as the run is stored (it can send the next
    frames) — not after the messages it sent were dispatched to their consumers."""

    async def scenario() -> None:
        h = await LoopbackHost(HostConfig("h1", state_dir=tmp_path)).start()
        try:
            sub = Client(h)
            sub.feed(encode(Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "1"})))
            pub = Client(h)
            at_poke: list[tuple[list[str], list[str]]] = []
            poke = h.driver.poke  # type: ignore[union-attr]

            def spy() -> None:
                at_poke.append((pub.commands(), sub.commands()))
                poke()

            h.driver.poke = spy  # type: ignore[method-assign,union-attr]
            run_of_frames = b"".join(
                send_frame("/topic/t", b"m%d" % i, **({"receipt": "r"} if i == 2 else {}))
                for i in range(3)
            )
            pub.feed(run_of_frames)
            assert at_poke, "the gateway did not poke its host"
            pub_seen, sub_seen = at_poke[0]
            assert pub_seen == ["CONNECTED", "RECEIPT"]  # stored: confirmed at once
            assert sub_seen == ["CONNECTED"]  # dispatched after
            assert sub.commands() == ["CONNECTED", "MESSAGE", "MESSAGE", "MESSAGE"]
            assert [f.body for f in sub.t.frames()[1:]] == [b"m0", b"m1", b"m2"]
        finally:
            await h.stop()

    run(scenario())


def test_non_persistent_messages_are_not_stored_and_do_not_survive_a_restart(
    tmp_path: Path,
) -> None:
    """JMS NON_PERSISTENT is at most once across a provider crash: such a message is kept
    in memory only (delivered, carried, served like the others), a PERSISTENT one is in
    the node's SQLite cache when its receipt comes, and after a restart only it is left."""
    import sqlite3

    def stored_jms_ids() -> set[str]:
        db = sqlite3.connect(tmp_path / "node.sqlite")
        try:
            rows = db.execute("SELECT msg_id FROM messages").fetchall()
        finally:
            db.close()
        return {r[0] for r in rows}

    async def scenario() -> None:
        h = await LoopbackHost(HostConfig("h1", state_dir=tmp_path)).start()
        try:
            sub = Client(h)
            sub.feed(encode(Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "1"})))
            pub = Client(h)
            pub.feed(
                send_frame("/topic/t", b"np", persistent="false", receipt="r1")
                + send_frame("/topic/t", b"p", persistent="true", receipt="r2")
            )
            assert pub.commands() == ["CONNECTED", "RECEIPT", "RECEIPT"]
            assert [f.body for f in sub.t.frames()[1:]] == [b"np", b"p"]
            node = h.node
            assert node is not None
            cached = {e["descriptor"]["jms_message_id"]: e["id"] for e in node.cache_listing()}
            ids = {f.headers["message-id"]: f.body for f in sub.t.frames()[1:]}
            by_body = {body: cached[mid] for mid, body in ids.items()}
            assert stored_jms_ids() & set(by_body.values()) == {by_body[b"p"]}
        finally:
            await h.stop()
        h = await LoopbackHost(HostConfig("h1", state_dir=tmp_path)).start()
        try:
            assert h.node is not None
            left = {e["id"] for e in h.node.cache_listing()}
            assert by_body[b"p"] in left and by_body[b"np"] not in left
        finally:
            await h.stop()

    run(scenario())


class _DaemonLikeHost:
    """The daemon's ServiceHost interface over a core node, delivering as the daemon does:
    node events drained after each call, each handed to the handler from the loop."""

    def __init__(self) -> None:
        import random

        from dodwan import Node, NodeConfig

        self.node = Node(NodeConfig(host_id="d1"), rng=random.Random(1))
        self.host_id = "d1"
        self.state_dir = None
        self.handler: Any = None

    def now(self) -> float:
        import time

        return time.time()

    def _drain(self) -> None:
        from dodwan import MessageDelivered

        loop = asyncio.get_running_loop()
        while (ev := self.node.next_event()) is not None:
            if isinstance(ev, MessageDelivered) and ev.subscription.startswith("joms:"):
                loop.call_soon(self.handler, ev)

    def publish(self, attributes: Any, payload: bytes, deadline: float, priority: int = 4,
                persistent: bool = True) -> str:  # fmt: skip
        mid = self.node.publish(attributes, payload, deadline=deadline, now=self.now(),
                                priority=priority, persistent=persistent)  # fmt: skip
        self._drain()
        return mid

    def subscribe(self, patterns: Any, key: str) -> str:
        k = self.node.subscribe(patterns, now=self.now(), key=key)
        self._drain()
        return k

    def unsubscribe(self, key: str) -> None:
        self.node.unsubscribe(key, self.now())

    def purge(self, msg_id: str) -> None:
        self.node.purge(msg_id, self.now())

    def subscriptions(self) -> dict[str, Any]:
        return self.node.subscriptions()

    def set_delivery_handler(self, handler: Any) -> None:
        self.handler = handler


def test_deliveries_from_the_daemon_reach_the_service_as_one_burst() -> None:
    """Behind the daemon's ServiceHost, the deliveries one run of SENDs causes are fed to
    the service together: one flush, one write to the subscriber (was one each per
    message, with a store commit each)."""
    from joms.stomp.server import serve

    async def scenario() -> None:
        host = _DaemonLikeHost()
        server = await serve(host, "127.0.0.1", 0)
        try:
            gw = server.gateway  # type: ignore[attr-defined]
            driver = gw.host
            sub, st = gw.protocol(), FakeTransport()
            sub.connection_made(st)
            sub.data_received(connect_frame() + encode(Frame("SUBSCRIBE", {
                "destination": "/topic/t", "id": "1"})))  # fmt: skip
            pub, pt = gw.protocol(), FakeTransport()
            pub.connection_made(pt)
            pub.data_received(connect_frame())
            for _ in range(3):
                await asyncio.sleep(0)
            pokes = 0
            poke = driver.poke

            def counting() -> None:
                nonlocal pokes
                pokes += 1
                poke()

            driver.poke = counting
            writes = st.writes
            pub.data_received(b"".join(send_frame("/topic/t", b"m%d" % i) for i in range(20)))
            for _ in range(5):
                await asyncio.sleep(0)
            bodies = [f.body for f in st.frames() if f.command == "MESSAGE"]
            assert bodies == [b"m%d" % i for i in range(20)]
            assert st.writes - writes == 1
            assert pokes < 5  # the run's own, the burst's (was one per message)
        finally:
            server.close()

    run(scenario())


def test_backlog_handed_at_subscribe_is_consumed_only_after_its_frames_are_written(
    tmp_path: Path,
) -> None:
    """A durable subscription's waiting messages, dispatched by a SUBSCRIBE in auto mode,
    are deleted from the store only once their MESSAGE frames are written: a commit made
    before that (the run's own) must still hold them (kill -9 there loses nothing)."""

    async def scenario() -> None:
        h = await LoopbackHost(HostConfig("h1", state_dir=tmp_path)).start()
        try:
            sub_frame = encode(Frame("SUBSCRIBE", {
                "destination": "/topic/t", "id": "1", "activemq.subscriptionName": "d"}))  # fmt: skip
            first = Client(h, **{"client-id": "c1"})
            first.feed(sub_frame)
            first.conn.connection_lost(None)  # away: messages wait in the store
            pub = Client(h)
            pub.feed(b"".join(send_frame("/topic/t", b"w%d" % i) for i in range(3)))
            await asyncio.sleep(0)
            store = h.store
            assert store is not None and len(store.items("dpending")) == 3
            back = Client(h, **{"client-id": "c1"})
            seen: list[tuple[int, int]] = []
            commit = store._commit  # type: ignore[attr-defined]

            def spy() -> None:  # what each commit makes durable, and what was written by then
                commit()
                rows = store._db.execute(  # type: ignore[attr-defined]
                    "SELECT 1 FROM records WHERE tbl = 'dpending'"
                ).fetchall()
                seen.append((back.commands().count("MESSAGE"), len(rows)))

            store._commit = spy  # type: ignore[attr-defined]
            back.feed(sub_frame)
            for _ in range(3):
                await asyncio.sleep(0)
            assert back.commands().count("MESSAGE") == 3
            for messages, stored in seen:  # once committed: written, or still stored
                assert messages == 3 or stored == 3, seen
            store._commit = commit  # type: ignore[attr-defined]
            store.commit()
            assert store.items("dpending") == []
        finally:
            await h.stop()

    run(scenario())
