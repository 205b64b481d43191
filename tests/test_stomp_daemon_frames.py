"""Client frames the gateway of a real ``dodwan daemon --stomp`` must handle as the STOMP
specs say: those before a malformed frame in one read."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
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
