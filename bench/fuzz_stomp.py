"""Fuzz the STOMP 1.2 frame parser of the JOMS gateway.

Usage: python bench/fuzz_stomp.py [--seconds 60] [--no-atheris]

The input is cut into chunks (sizes from its first byte) and fed to one ``FrameParser``
with small limits: only ``ProtocolError`` may escape, every frame returned respects the
limits, and the parser's buffer stays bounded. See bench/fuzz_common.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_common import Finding, run

from joms.stomp.frame import Frame, FrameLimits, FrameParser, ProtocolError, encode

LIMITS = FrameLimits(max_header_line=512, max_headers=16, max_body=2048)


def seeds() -> list[bytes]:
    frames = [
        Frame("CONNECT", {"accept-version": "1.2", "host": "h", "login": "u"}, b""),
        Frame("SEND", {"destination": "/queue/q", "we:ird": "a\nb\\c"}, b"body\x00nul"),
        Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "1", "selector": "x > 1"}, b""),
        Frame("MESSAGE", {"message-id": "m", "subscription": "1"}, b"x" * 100),
    ]
    out = [b"\x07" + encode(f) for f in frames]
    out.append(b"\x03\n\n" + encode(frames[1], content_length=False) + b"\r\n")
    return out


def target(data: bytes) -> None:
    if not data:
        return
    chunk = 1 + data[0] % 64
    body = data[1:]
    parser = FrameParser(LIMITS)
    try:
        for i in range(0, len(body), chunk):
            for f in parser.feed(body[i : i + chunk]):
                if len(f.body) > LIMITS.max_body or len(f.headers) > LIMITS.max_headers:
                    raise Finding(f"frame beyond the limits: {f.command}")
    except ProtocolError:
        return
    held = sum(len(x) for x in vars(parser).values() if isinstance(x, bytes | bytearray))
    if held > LIMITS.max_body + LIMITS.max_header_line * (LIMITS.max_headers + 2) + 4096:
        raise Finding(f"parser holds {held} bytes")


if __name__ == "__main__":
    run("stomp", target, seeds(), ["joms.stomp.frame"])
