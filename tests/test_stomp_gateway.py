"""The STOMP 1.2 gateway driven by stomp.py, a real third-party STOMP client."""

from __future__ import annotations

import queue
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
from joms_support import LoopThread, start_hosts, wait_for

from joms.runtime import HostConfig, LoopbackHost
from joms.service import ServiceConfig


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.errors: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_error(self, frame: Any) -> None:
        self.errors.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers["receipt-id"])

    def get(self, timeout: float = 5.0) -> Any:
        return self.messages.get(timeout=timeout)

    def none(self, timeout: float = 0.5) -> bool:
        try:
            self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        return False


@pytest.fixture()
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture()
def host(loop: LoopThread) -> Iterator[LoopbackHost]:
    [h] = start_hosts(loop, 1)
    yield h
    loop.call(h.stop())


def connect(h: LoopbackHost, client_id: str | None = None, **kw: Any) -> tuple[Any, Listener]:
    c = stomp.Connection12([h.stomp_address], **kw)
    lst = Listener()
    c.set_listener("t", lst)
    headers = {"client-id": client_id} if client_id else {}
    c.connect(wait=True, headers=headers)
    return c, lst


def sync(c: Any, lst: Listener, rid: str = "sync") -> None:
    """Round-trip a receipt so everything sent before has been handled."""
    c.send("/topic/__sync", "", headers={"receipt": rid})
    assert lst.receipts.get(timeout=5) == rid


def test_selector_header_filters_and_properties_round_trip(host: LoopbackHost) -> None:
    c, lst = connect(host)
    c.subscribe("/topic/chat", id="1", headers={"selector": "language IN ('English','French')"})
    sync(c, lst)
    c.send("/topic/chat", "hello", headers={"language": "English", "room": "a"})
    c.send("/topic/chat", "hallo", headers={"language": "German"})
    c.send("/topic/chat", "salut", headers={"language": "French"})
    got = [lst.get() for _ in range(2)]
    assert [f.body for f in got] == ["hello", "salut"]
    assert got[0].headers["room"] == "a"
    assert got[0].headers["destination"] == "/topic/chat"
    assert got[0].headers["message-id"].startswith("ID:h1-")
    assert lst.none()
    c.disconnect()


def test_typed_properties_and_numeric_selector(host: LoopbackHost) -> None:
    c, lst = connect(host)
    c.subscribe("/topic/t", id="1", headers={"selector": "count > 2 AND price < 10.5"})
    sync(c, lst)
    c.send(
        "/topic/t",
        "a",
        headers={"count": "3", "price": "9", "joms-types": "count:int,price:double"},
    )
    c.send("/topic/t", "b", headers={"count": "3", "price": "9"})  # strings: no numeric match
    c.send(
        "/topic/t",
        "c",
        headers={"count": "1", "price": "1", "joms-types": "count:int,price:double"},
    )
    f = lst.get()
    assert f.body == "a"
    # (JMSXDeliveryCount: set by the provider on every MESSAGE, docs/joms.md)
    assert f.headers["joms-types"] == "JMSXDeliveryCount:int,count:int,price:double"
    assert f.headers["JMSXDeliveryCount"] == "1"
    assert lst.none()
    c.disconnect()


def test_receipts_and_binary_bodies(host: LoopbackHost) -> None:
    c, lst = connect(host, auto_decode=False)
    c.subscribe("/topic/bin", id="b1", headers={"receipt": "sub-1"})
    assert lst.receipts.get(timeout=5) == "sub-1"
    body = bytes(range(256)) * 40 + b"\x00\x00end"
    c.send("/topic/bin", body, content_type="application/octet-stream", headers={"receipt": "s1"})
    assert lst.receipts.get(timeout=5) == "s1"
    f = lst.get()
    assert f.body == body
    assert f.headers["joms-body-type"] == "bytes"
    c.disconnect()


def test_durable_subscription_keeps_messages_while_disconnected(host: LoopbackHost) -> None:
    sub, sl = connect(host, "app1")
    sub.subscribe("/topic/news", id="d", headers={"durable-subscription-name": "n1"})
    sync(sub, sl)
    sub.disconnect()
    pub, pl = connect(host)
    for i in range(3):
        pub.send("/topic/news", f"m{i}")
    sync(pub, pl)
    sub, sl = connect(host, "app1")
    sub.subscribe("/topic/news", id="d", headers={"durable-subscription-name": "n1"})
    assert sorted(sl.get().body for _ in range(3)) == ["m0", "m1", "m2"]
    sub.disconnect()
    # messages waiting for a deleted durable subscription are dropped with it
    pub.send("/topic/news", "waiting")
    sync(pub, pl)
    admin, al = connect(host, "app1")
    admin.unsubscribe("d", headers={"durable-subscription-name": "n1"})
    sync(admin, al)
    admin.disconnect()
    # DTN semantics: a new subscription gets what is still travelling, but not what the
    # deleted one had already taken
    pub.send("/topic/news", "late")
    sync(pub, pl)
    sub, sl = connect(host, "app1")
    sub.subscribe("/topic/news", id="d", headers={"durable-subscription-name": "n1"})
    assert sl.get().body == "late"
    assert sl.none(0.3)
    sub.disconnect()
    pub.disconnect()


def test_durable_subscription_hands_back_a_producers_messages_in_order(loop: LoopThread) -> None:
    """40 messages of one producer on another host, stored for an absent durable
    subscriber (batches from the network are stored at one instant), come back in order."""
    h1, h2 = start_hosts(loop, 2)
    try:
        sub, sl = connect(h2, "reader")
        sub.subscribe("/topic/ord", id="d", headers={"durable-subscription-name": "o"})
        sync(sub, sl)
        sub.disconnect()
        pub, pl = connect(h1)
        for i in range(40):
            pub.send("/topic/ord", str(i))
        sync(pub, pl)
        pub.disconnect()
        svc = h2.service
        assert svc is not None

        def stored() -> int:
            return len(loop.run(lambda: svc.store.items("dpending")))

        assert wait_for(lambda: stored() == 40)  # state the daemon sends no event about
        sub, sl = connect(h2, "reader")
        sub.subscribe("/topic/ord", id="d", headers={"durable-subscription-name": "o"})
        assert [int(sl.get().body) for _ in range(40)] == list(range(40))
        sub.disconnect()
    finally:
        for h in (h1, h2):
            loop.call(h.stop())


def test_durable_subscription_survives_daemon_restart(loop: LoopThread, tmp_path: Path) -> None:
    h = loop.call(LoopbackHost(HostConfig("r1", state_dir=tmp_path)).start())
    sub, sl = connect(h, "keeper")
    sub.subscribe("/topic/log", id="d", headers={"durable-subscription-name": "k"})
    sync(sub, sl)
    sub.disconnect()
    pub, pl = connect(h)
    pub.send("/topic/log", "before restart")
    sync(pub, pl)
    pub.disconnect()
    loop.call(h.stop())
    h2 = loop.call(LoopbackHost(HostConfig("r1", state_dir=tmp_path)).start())
    try:
        sub, sl = connect(h2, "keeper")
        sub.subscribe("/topic/log", id="d", headers={"durable-subscription-name": "k"})
        assert sl.get().body == "before restart"
        sub.disconnect()
    finally:
        loop.call(h2.stop())


def test_client_ack_is_cumulative_and_unacked_are_redelivered(host: LoopbackHost) -> None:
    c, lst = connect(host, "acker")
    c.subscribe("/topic/work", id="w", ack="client", headers={"durable-subscription-name": "w"})
    sync(c, lst)
    for i in range(3):
        c.send("/topic/work", f"j{i}")
    frames = [lst.get() for _ in range(3)]
    assert [f.body for f in frames] == ["j0", "j1", "j2"]
    c.ack(frames[1].headers["ack"])  # acknowledges j0 and j1
    sync(c, lst)
    c.disconnect()
    c, lst = connect(host, "acker")
    c.subscribe(
        "/topic/work", id="w", ack="client-individual", headers={"durable-subscription-name": "w"}
    )
    f = lst.get()
    assert f.body == "j2"
    assert f.headers.get("redelivered") == "true"
    assert lst.none(0.3)
    c.disconnect()


def test_queue_message_left_unacked_by_a_closed_subscription_is_redelivered_six_times(
    host: LoopbackHost,
) -> None:
    """Received, then neither acked nor nacked before UNSUBSCRIBE and DISCONNECT: that was
    its first delivery. Refused every time after, it comes max_redeliveries (6) more times
    before it goes to the dead-letter queue."""
    dlq, dl = connect(host)
    dlq.subscribe("/queue/DLQ", id="dlq")
    c, lst = connect(host)
    c.subscribe("/queue/poison", id="q", ack="client-individual")
    sync(c, lst)
    c.send("/queue/poison", "p")
    assert "redelivered" not in lst.get().headers
    c.unsubscribe("q")
    c.disconnect()
    c, lst = connect(host)
    c.subscribe("/queue/poison", id="q", ack="client-individual")
    for _ in range(6):
        f = lst.get()
        assert f.headers.get("redelivered") == "true"
        c.nack(f.headers["ack"])
    dead = dl.get()
    assert dead.body == "p"
    assert dead.headers["dlq-reason"] == (
        "redelivered 6 times and refused again (max_redeliveries = 6)"
    )
    assert lst.messages.empty()
    c.disconnect()
    dlq.disconnect()


def test_transactions_hold_sends_and_abort_redelivers(host: LoopbackHost) -> None:
    c, lst = connect(host, "txer")
    c.subscribe("/topic/tx", id="1", ack="client-individual")
    sync(c, lst)
    tx = c.begin()
    c.send("/topic/tx", "t1", transaction=tx)
    c.send("/topic/tx", "t2", transaction=tx)
    sync(c, lst)
    assert lst.none(0.3)
    c.commit(tx)
    got = [lst.get(), lst.get()]
    assert [f.body for f in got] == ["t1", "t2"]
    tx2 = c.begin()
    c.send("/topic/tx", "dropped", transaction=tx2)
    c.ack(got[0].headers["ack"], transaction=tx2)
    c.abort(tx2)
    f = lst.get()
    assert f.body == "t1"
    assert f.headers.get("redelivered") == "true"
    assert lst.none(0.3)
    c.disconnect()


def test_no_local_hides_own_messages(host: LoopbackHost) -> None:
    c, lst = connect(host)
    c.subscribe("/topic/nl", id="1", headers={"no-local": "true"})
    other, _ol = connect(host)
    sync(c, lst)
    c.send("/topic/nl", "mine")
    other.send("/topic/nl", "theirs")
    assert lst.get().body == "theirs"
    assert lst.none(0.3)
    c.disconnect()
    other.disconnect()


def raw_exchange(h: LoopbackHost, data: bytes) -> bytes:
    with socket.create_connection(h.stomp_address, timeout=5) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"CONNECT\naccept-version:1.2\n\n\x00GARBAGE\n\n\x00", b"unknown command"),
        (
            b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/topic/x\nbad\\qescape:1\n\n\x00",
            b"escape",
        ),
        (b"SEND\ndestination:/topic/x\n\nno connect\x00", b"CONNECT"),
        (
            b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/nowhere/x\n\n\x00",
            b"unknown destination",
        ),
        (
            b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/topic/x\ncontent-length:99\n\nshort\x00xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            b"content-length",
        ),
        (
            b"CONNECT\naccept-version:1.2\n\n\x00SUBSCRIBE\ndestination:/topic/x\nid:1\nselector:a = = 1\n\n\x00",
            b"selector",
        ),
        (
            b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/topic/x\npersistent:maybe\n\n\x00",
            b"persistent",
        ),
        (
            b"CONNECT\naccept-version:1.2\n\n\x00SUBSCRIBE\ndestination:/queue/zzz@*\nid:1\n\n\x00",
            b"joms-exception:InvalidDestinationException",
        ),
    ],
)
def test_malformed_frames_get_error_and_close_others_unaffected(
    host: LoopbackHost, data: bytes, needle: bytes
) -> None:
    good, gl = connect(host)
    good.subscribe("/topic/ok", id="1")
    sync(good, gl)
    reply = raw_exchange(host, data)
    assert b"ERROR" in reply
    assert needle.lower() in reply.lower()
    good.send("/topic/ok", "still here")
    assert gl.get().body == "still here"
    good.disconnect()


def test_client_id_in_use_is_refused(host: LoopbackHost) -> None:
    c, _ = connect(host, "dup")
    reply = raw_exchange(host, b"CONNECT\naccept-version:1.2\nclient-id:dup\n\n\x00")
    assert b"ERROR" in reply and b"already connected" in reply
    c.disconnect()


def test_login_required_when_configured(loop: LoopThread) -> None:
    h = loop.call(LoopbackHost(HostConfig("l1", login="u", passcode="p")).start())
    try:
        reply = raw_exchange(h, b"CONNECT\naccept-version:1.2\nlogin:u\npasscode:x\n\n\x00")
        assert b"ERROR" in reply and b"login refused" in reply
        c = stomp.Connection12([h.stomp_address])
        c.connect("u", "p", wait=True)
        assert c.is_connected()
        c.disconnect()
    finally:
        loop.call(h.stop())


def test_nondurable_refused_when_configured(loop: LoopThread) -> None:
    h = loop.call(
        LoopbackHost(HostConfig("n1", service=ServiceConfig(nondurable="refuse"))).start()
    )
    try:
        reply = raw_exchange(
            h,
            b"CONNECT\naccept-version:1.2\n\n\x00SUBSCRIBE\ndestination:/topic/x\nid:1\n\n\x00",
        )
        assert b"ERROR" in reply and b"durable subscription" in reply
    finally:
        loop.call(h.stop())


def test_heartbeats_are_negotiated(host: LoopbackHost) -> None:
    reply = raw_exchange(
        host,
        b"CONNECT\naccept-version:1.2\nheart-beat:1000,2000\n\n\x00DISCONNECT\nreceipt:bye\n\n\x00",
    )
    assert b"CONNECTED" in reply
    # the client sends every 1 s and wants ours every 2 s: it gets exactly that (sx=2000
    # >= cy, sy=1000 >= cx), not a fixed period of the server's choosing
    assert b"heart-beat:2000,1000" in reply
    assert b"RECEIPT\nreceipt-id:bye" in reply


def test_topic_across_two_hosts(loop: LoopThread) -> None:
    a, b = start_hosts(loop, 2, prefix="x")
    try:
        sub, sl = connect(b)
        sub.subscribe("/topic/far", id="1", headers={"selector": "kind = 'news'"})
        sync(sub, sl)
        pub, _pl = connect(a)
        pub.send("/topic/far", "over the air", headers={"kind": "news"})
        pub.send("/topic/far", "filtered", headers={"kind": "ads"})
        f = sl.get(10)
        assert f.body == "over the air"
        assert f.headers["message-id"].startswith("ID:x1-")
        assert sl.none(0.5)
        # the selector's string part was pushed into b's profile
        assert wait_for(lambda: any(p.get("kind") == "news" for p in b.node.profile()["own"]))
        sub.disconnect()
        pub.disconnect()
    finally:
        for h in (a, b):
            loop.call(h.stop())


def test_queue_lookup_by_name_through_the_directory(loop: LoopThread) -> None:
    a, b = start_hosts(loop, 2, prefix="dir")
    try:
        ca, al = connect(a)
        ca.subscribe("/queue/orders", id="1")  # creates orders@dir1, advertised
        sync(ca, al)
        cb, bl = connect(b)

        def known() -> bool:
            return loop.run(lambda: b.service.lookup_queue("orders")) == ["orders@dir1"]

        assert wait_for(known, 10)
        cb.send("/queue/orders@*", "found you", headers={"receipt": "s"})
        assert bl.receipts.get(timeout=5) == "s"
        f = al.get(10)
        assert f.body == "found you"
        assert f.headers["destination"] == "/queue/orders@dir1"
        reply = raw_exchange(
            b, b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/queue/nope@*\n\n\x00"
        )
        assert b"not known" in reply
        ca.disconnect()
        cb.disconnect()
    finally:
        for h in (a, b):
            loop.call(h.stop())


def test_silent_client_is_disconnected_after_missing_heartbeats(loop: LoopThread) -> None:
    h = loop.call(LoopbackHost(HostConfig("hb1", heartbeat_ms=200)).start())
    try:
        with socket.create_connection(h.stomp_address, timeout=5) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nheart-beat:100,100\n\n\x00")
            data = b""
            while b"ERROR" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        assert b"heart-beat:200,200" in data
        assert b"\n\n\x00\n" in data  # the server's own EOL heart-beat arrived
        assert b"heart-beat timeout" in data
    finally:
        loop.call(h.stop())


def test_expires_header_drops_expired_messages(host: LoopbackHost) -> None:
    import time as _time

    c, lst = connect(host, "exp")
    c.subscribe("/topic/e", id="d", headers={"durable-subscription-name": "e"})
    sync(c, lst)
    c.disconnect()
    p, pl = connect(host)
    soon = int((_time.time() + 0.3) * 1000)
    p.send("/topic/e", "short-lived", headers={"expires": str(soon)})
    p.send("/topic/e", "kept")
    sync(p, pl)
    _time.sleep(0.5)  # let the first message's JMSExpiration pass (no event exists for it)
    c, lst = connect(host, "exp")
    c.subscribe("/topic/e", id="d", headers={"durable-subscription-name": "e"})
    f = lst.get()
    assert f.body == "kept"
    assert lst.none(0.3)
    c.disconnect()
    p.disconnect()


def test_nack_redelivers(host: LoopbackHost) -> None:
    c, lst = connect(host)
    c.subscribe("/queue/nq", id="1", ack="client-individual")
    sync(c, lst)
    c.send("/queue/nq", "again")
    f = lst.get()
    c.nack(f.headers["ack"])
    g = lst.get()
    assert g.body == "again" and g.headers.get("redelivered") == "true"
    c.ack(g.headers["ack"])
    c.disconnect()


def test_prefetch_bounds_unacknowledged_messages(host: LoopbackHost) -> None:
    c, lst = connect(host)
    c.subscribe(
        "/queue/pf", id="1", ack="client-individual", headers={"activemq.prefetchSize": "1"}
    )
    sync(c, lst)
    for i in range(3):
        c.send("/queue/pf", f"p{i}")
    first = lst.get()
    assert first.body == "p0"
    assert lst.none(0.4)  # the window is full until p0 is acknowledged
    c.ack(first.headers["ack"])
    second = lst.get()
    assert second.body == "p1"
    c.ack(second.headers["ack"])
    assert lst.get().body == "p2"
    c.disconnect()


@pytest.mark.parametrize(
    ("body_type", "body"),
    [
        ("map", b"notjson"),
        ("map", b'{"a": {"t": "int", "v": "zz"}}'),
        ("map", b'{"a": {"t": "byte", "v": 300}}'),
        ("map", b'{"a": {"t": "bytes", "v": "%%%"}}'),
        ("stream", b'{"a": 1}'),
        ("stream", b'[{"t": "nosuchtype", "v": 1}]'),
    ],
)
def test_send_of_a_malformed_typed_body_is_refused(
    host: LoopbackHost, body_type: str, body: bytes
) -> None:
    c, lst = connect(host)
    c.subscribe("/topic/typed", id="1")
    sync(c, lst)
    reply = raw_exchange(
        host,
        b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/topic/typed\nreceipt:r1\n"
        + b"joms-body-type:"
        + body_type.encode()
        + b"\ncontent-length:%d\n\n" % len(body)
        + body
        + b"\x00",
    )
    assert b"ERROR" in reply and b"RECEIPT" not in reply
    assert b"joms-exception:MessageFormatException" in reply
    c.send("/topic/typed", '{"a": {"t": "int", "v": 5}}', headers={"joms-body-type": "map"})
    assert lst.get().body == '{"a": {"t": "int", "v": 5}}'  # only the good one came
    c.disconnect()


def test_stomp_11_cr_escape_is_an_error(host: LoopbackHost) -> None:
    reply = raw_exchange(
        host,
        b"CONNECT\naccept-version:1.1\nhost:x\n\n\x00"
        b"SEND\ndestination:/topic/cr11\nreceipt:r1\npath:a\\rb\n\n\x00",
    )
    # (with 1.2 agreed the same SEND gets its RECEIPT: test_stomp_frame)
    assert b"ERROR" in reply and b"RECEIPT" not in reply and b"undefined escape" in reply


def _frames_until(s: socket.socket, command: bytes, data: bytes = b"") -> tuple[bytes, bytes]:
    """Read until a whole ``command`` frame arrived: (that frame, what came after it)."""
    while True:
        start = data.find(command + b"\n")
        end = data.find(b"\x00", start) if start >= 0 else -1
        if end >= 0:
            return data[start:end], data[end + 1 :]
        chunk = s.recv(65536)
        assert chunk, f"closed: {data!r}"
        assert b"ERROR" not in data + chunk, data + chunk
        data += chunk


def test_a_stomp_10_client_gets_its_message_id_raw_when_another_header_needs_escapes(
    host: LoopbackHost,
) -> None:
    """STOMP 1.0 has no escapes: a header it cannot carry (a line break in a property sent
    by a 1.2 client) goes escaped, that header alone; the message id and the ack id stay
    as they are, so the 1.0 client's ACK names the message."""
    with socket.create_connection(host.stomp_address, timeout=10) as old:
        old.sendall(b"CONNECT\naccept-version:1.0\nhost:h\n\n\x00")
        old.sendall(b"SUBSCRIBE\ndestination:/topic/v10nl\nid:1\nack:client\nreceipt:s\n\n\x00")
        _, rest = _frames_until(old, b"RECEIPT")
        raw_exchange(
            host,
            b"CONNECT\naccept-version:1.2\n\n\x00"
            b"SEND\ndestination:/topic/v10nl\nnote:two\\nlines\nreceipt:p\n\nbody\x00"
            b"DISCONNECT\nreceipt:d\n\n\x00",
        )
        message, rest = _frames_until(old, b"MESSAGE", rest)
        headers = dict(line.split(b":", 1) for line in message.split(b"\n")[1:] if b":" in line)
        assert headers[b"note"] == b"two\\nlines"  # escaped: the only way 1.0 can carry it
        mid, tag = headers[b"message-id"], headers[b"ack"]
        assert b"\\" not in mid and b":" in mid, mid  # as the service named it
        old.sendall(b"ACK\nmessage-id:" + tag + b"\nreceipt:a\n\n\x00")  # docs/stomp.md
        receipt, _ = _frames_until(old, b"RECEIPT", rest)
        assert b"receipt-id:a" in receipt


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("command", ["ACK", "NACK"])
def test_stomp_10_and_11_clients_acknowledge_by_message_id(
    host: LoopbackHost, version: str, command: str
) -> None:
    """STOMP 1.0 and 1.1 name the message to ACK or NACK by its ``message-id`` (1.1 adds
    ``subscription``), as stomp.py and other clients of those versions do; 1.2 uses the
    MESSAGE's ``ack`` header."""
    dest = f"/queue/byid{version.replace('.', '')}{command}"
    with socket.create_connection(host.stomp_address, timeout=10) as s:
        s.sendall(f"CONNECT\naccept-version:{version}\nhost:h\n\n\x00".encode())
        s.sendall(f"SUBSCRIBE\ndestination:{dest}\nid:7\nack:client-individual\n\n\x00".encode())
        s.sendall(f"SEND\ndestination:{dest}\nreceipt:p\n\none\x00".encode())
        message, rest = _frames_until(s, b"MESSAGE")
        headers = dict(line.split(b":", 1) for line in message.split(b"\n")[1:] if b":" in line)
        mid = headers[b"message-id"]
        s.sendall(b"%s\nmessage-id:%s\nsubscription:7\nreceipt:a\n\n\x00" % (command.encode(), mid))
        want = [b"RECEIPT\nreceipt-id:a\n"]
        if command == "NACK":  # given back: delivered again, marked so
            want.append(b"message-id:" + mid)
        data = rest
        while not all(w in data for w in want) or (
            command == "NACK" and b"redelivered:true" not in data
        ):
            chunk = s.recv(65536)
            assert chunk and b"ERROR" not in data + chunk, data + chunk
            data += chunk


def test_message_group_properties_are_client_properties_with_their_jms_types(
    host: LoopbackHost,
) -> None:
    """JMS 1.1 §3.5.9: JMSXGroupID (string) and JMSXGroupSeq (int) are set by the client
    and every provider supports them. Every name starting JMS was once refused, so a raw
    STOMP SEND carrying them got an ERROR. A STOMP client need not type them (their JMS
    type is known); a value that is not of that type is refused."""
    c, lst = connect(host)
    c.subscribe("/topic/grp", id="1", headers={"selector": "JMSXGroupSeq > 1"})
    sync(c, lst)
    for seq in ("1", "2"):
        c.send("/topic/grp", f"m{seq}", headers={"JMSXGroupID": "order-7", "JMSXGroupSeq": seq})
    f = lst.get()
    assert f.body == "m2" and f.headers["JMSXGroupID"] == "order-7"
    assert f.headers["JMSXGroupSeq"] == "2" and "JMSXGroupSeq:int" in f.headers["joms-types"]
    assert lst.none()
    for bad in (b"JMSXGroupSeq:first\n", b"JMSXGroupSeq:2\njoms-types:JMSXGroupSeq:string\n"):
        reply = raw_exchange(
            host,
            b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/topic/grp\nreceipt:r1\n"
            + bad
            + b"\n\x00",
        )
        assert b"ERROR" in reply and b"RECEIPT" not in reply and b"JMSXGroupSeq" in reply
    assert lst.none()
    c.disconnect()
