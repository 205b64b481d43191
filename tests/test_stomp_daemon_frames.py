"""Client frames the gateway of a real ``dodwan daemon --stomp`` must handle as the STOMP
specs say: those before a malformed frame in one read, NACK in a transaction, STOMP 1.0's
SUBSCRIBE without an id (with stomp.py's ``Connection10``)."""

from __future__ import annotations

import json
import queue
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import stomp
from stomp_raw import RawStomp
from test_daemon_helpers import DaemonProc, random_group

from joms.stomp.frame import Frame, FrameParser, encode

CONNECT = b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00"


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    d = DaemonProc(
        tmp_path_factory.mktemp("frames") / "d",
        ["--group", random_group(), "--stomp", "127.0.0.1:0"],
    )
    d.start()
    yield int(str(json.loads((d.state_dir / "admin.json").read_text())["stomp"]).rsplit(":")[1])
    d.kill()
    text = d.log.read_text()
    assert "Traceback" not in text, text


def exchange(port: int, data: bytes) -> list[Frame]:
    """Send ``data`` in one write; the frames answered until the daemon closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        parser = FrameParser()
        frames: list[Frame] = []
        while chunk := s.recv(65536):
            frames += parser.feed(chunk)
    return frames


def send(dest: str, body: bytes, **headers: str) -> bytes:
    return encode(
        Frame("SEND", {"destination": dest, "content-type": "text/plain", **headers}, body)
    )


BAD = b"SEND\ndestination:/topic/x\nbad:\\q\n\n\x00"
"""A frame with an escape STOMP 1.2 does not define."""


def test_frames_before_a_malformed_one_in_the_same_read_are_handled_first(port: int) -> None:
    frames = exchange(port, CONNECT + send("/queue/before-bad", b"important", receipt="r1") + BAD)
    assert [f.command for f in frames] == ["CONNECTED", "RECEIPT", "ERROR"], frames
    assert frames[1].headers["receipt-id"] == "r1"
    assert "escape" in frames[2].headers["message"]
    c = RawStomp(port)
    c.send("SUBSCRIBE", {"id": "1", "destination": "/queue/before-bad"})
    cmd, _, body = c.recv()
    assert (cmd, body) == ("MESSAGE", b"important")
    c.close()


def test_a_connect_followed_by_a_malformed_frame_is_answered_then_refused(port: int) -> None:
    frames = exchange(port, CONNECT + BAD)
    assert [f.command for f in frames] == ["CONNECTED", "ERROR"], frames


def _message(c: RawStomp, body: bytes) -> dict[str, str]:
    """Wait for the MESSAGE with ``body``: its headers."""
    *_, (cmd, headers, got) = c.until(lambda f: f[0] != "RECEIPT")
    assert (cmd, got) == ("MESSAGE", body), (cmd, headers, got)
    return headers


def _receipt(c: RawStomp, rid: str) -> None:
    """The next frame is the RECEIPT ``rid`` (nothing came before it)."""
    cmd, headers, _ = c.recv()
    assert (cmd, headers.get("receipt-id")) == ("RECEIPT", rid), (cmd, headers)


def test_a_nack_in_a_transaction_takes_effect_at_commit(port: int) -> None:
    q = "/queue/nack-tx"
    c = RawStomp(port)
    # (prefetch 1: the next message comes once this one is settled)
    c.send("SUBSCRIBE", {"id": "1", "destination": q, "ack": "client-individual",
                         "prefetch": "1", "receipt": "s"})  # fmt: skip
    _receipt(c, "s")
    p = RawStomp(port)
    for body in ("m1", "m2", "m3"):
        p.send("SEND", {"destination": q, "content-type": "text/plain", "receipt": body}, body)
        assert p.recv()[0] == "RECEIPT"
    p.close()
    # a NACK in an open transaction does nothing yet: the message still waits for its ACK
    a1 = _message(c, b"m1")["ack"]
    c.send("BEGIN", {"transaction": "t1"})
    c.send("NACK", {"id": a1, "transaction": "t1", "receipt": "n1"})
    _receipt(c, "n1")
    c.send("ACK", {"id": a1, "receipt": "a1"})
    _receipt(c, "a1")
    c.send("COMMIT", {"transaction": "t1"})
    # COMMIT applies it: the message comes again
    a2 = _message(c, b"m2")["ack"]
    c.send("BEGIN", {"transaction": "t2"})
    c.send("NACK", {"id": a2, "transaction": "t2", "receipt": "n2"})
    _receipt(c, "n2")
    c.send("COMMIT", {"transaction": "t2"})
    again = _message(c, b"m2")
    assert again.get("redelivered") == "true", again
    c.send("ACK", {"id": again["ack"], "receipt": "a2"})
    _receipt(c, "a2")
    # ABORT undoes it as it undoes an ACK: the message is given back (redelivered)
    a3 = _message(c, b"m3")["ack"]
    c.send("BEGIN", {"transaction": "t3"})
    c.send("NACK", {"id": a3, "transaction": "t3", "receipt": "n3"})
    _receipt(c, "n3")
    c.send("ABORT", {"transaction": "t3"})
    assert _message(c, b"m3").get("redelivered") == "true"
    c.close()


@pytest.mark.parametrize("command", ["ACK", "NACK"])
def test_an_ack_or_nack_in_a_transaction_never_begun_is_an_error(port: int, command: str) -> None:
    q = f"/queue/{command.lower()}-no-tx"
    c = RawStomp(port)
    c.send("SUBSCRIBE", {"id": "1", "destination": q, "ack": "client-individual"})
    c.send("SEND", {"destination": q, "content-type": "text/plain"}, "m")
    ack = _message(c, b"m")["ack"]
    c.send(command, {"id": ack, "transaction": "nope", "receipt": "r"})
    cmd, headers, _ = c.recv()
    assert cmd == "ERROR", (cmd, headers)
    assert headers["message"] == "transaction 'nope' was not begun", headers
    assert headers["joms-exception"] == "IllegalStateException"
    assert headers["receipt-id"] == "r"
    c.close()


class Listener(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.frames: queue.Queue[tuple[str, Any]] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.frames.put(("MESSAGE", frame))

    def on_receipt(self, frame: Any) -> None:
        self.frames.put(("RECEIPT", frame))

    def on_error(self, frame: Any) -> None:
        self.frames.put(("ERROR", frame))

    def next(self) -> tuple[str, Any]:
        return self.frames.get(timeout=10)

    def receipt(self, rid: str) -> None:
        kind, frame = self.next()
        assert (kind, frame.headers.get("receipt-id")) == ("RECEIPT", rid), frame.headers


def test_stomp_10_subscribe_without_an_id_and_unsubscribe_by_destination(port: int) -> None:
    c = stomp.Connection10([("127.0.0.1", port)])
    lst = Listener()
    c.set_listener("l", lst)
    c.connect(wait=True)
    c.subscribe("/topic/ten", headers={"receipt": "s"})  # (stomp.py sends no id)
    lst.receipt("s")
    c.unsubscribe(destination="/topic/ten", headers={"receipt": "u"})
    lst.receipt("u")
    c.subscribe("/topic/ten", headers={"receipt": "s2"})  # that destination's id is free
    lst.receipt("s2")
    c.send("/topic/ten", "hello 1.0")
    kind, frame = lst.next()
    assert (kind, frame.body) == ("MESSAGE", "hello 1.0"), frame.headers
    assert frame.headers["subscription"] == "/topic/ten"
    # a subscription with an id can be ended by its destination too
    c.subscribe("/topic/ten.b", id="b", headers={"receipt": "sb"})
    lst.receipt("sb")
    c.unsubscribe(destination="/topic/ten.b", headers={"receipt": "ub"})
    lst.receipt("ub")
    c.subscribe("/topic/ten.b", id="b", headers={"receipt": "sb2"})
    lst.receipt("sb2")
    c.disconnect()


def test_stomp_12_subscribe_still_needs_an_id(port: int) -> None:
    sub = encode(Frame("SUBSCRIBE", {"destination": "/topic/twelve"}))
    frames = exchange(port, CONNECT + sub)
    assert [f.command for f in frames] == ["CONNECTED", "ERROR"], frames
    assert frames[1].headers["message"] == "SUBSCRIBE needs an id header"


def test_a_send_over_the_descriptor_limits_is_refused_naming_the_setting(port: int) -> None:
    # (docs/stomp.md: the frame allows 128 headers of 16 KiB; a SEND's properties are
    # bounded much lower by the descriptor limits of the core, limits.* settings)
    disconnect = encode(Frame("DISCONNECT", {"receipt": "bye"}))
    cases = {
        "limits.max_attributes": {f"p{i}": "v" for i in range(60)},
        "limits.max_descriptor_bytes": {f"q{i}": "v" * 1000 for i in range(10)},
    }
    for setting, props in cases.items():
        frames = exchange(port, CONNECT + send("/topic/props", b"x", receipt="r", **props))
        assert [f.command for f in frames] == ["CONNECTED", "ERROR"], frames
        assert setting in frames[1].headers["message"], frames[1].headers
        assert frames[1].headers["joms-exception"] == "MessageFormatException"
    some = {f"p{i}": "v" for i in range(35)}  # within them
    frames = exchange(port, CONNECT + send("/topic/props", b"x", receipt="r", **some) + disconnect)
    assert [f.command for f in frames] == ["CONNECTED", "RECEIPT", "RECEIPT"], frames
