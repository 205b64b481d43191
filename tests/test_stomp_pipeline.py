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
