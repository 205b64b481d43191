"""STOMP 1.2 frame codec: round trips, escaping, bodies, heart-beats, limits, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joms.stomp.frame import Frame, FrameLimits, FrameParser, ProtocolError, encode


def parse_all(data: bytes, chunk: int | None = None, limits: FrameLimits | None = None):
    p = FrameParser(limits)
    out: list[Frame] = []
    if chunk is None:
        return p.feed(data)
    for i in range(0, len(data), chunk):
        out += p.feed(data[i : i + chunk])
    return out


def test_send_frame_with_escaped_headers_round_trips() -> None:
    f = Frame("SEND", {"destination": "/topic/a", "we:ird": "line1\nline2\\x\r"}, b"hi")
    [g] = parse_all(encode(f))
    assert g.command == "SEND"
    assert g.headers["we:ird"] == "line1\nline2\\x\r"
    assert g.headers["content-length"] == "2"
    assert g.body == b"hi"


def test_connect_headers_are_not_unescaped() -> None:
    [f] = parse_all(b"CONNECT\naccept-version:1.2\nlogin:a\\nb\n\n\x00")
    assert f.headers["login"] == "a\\nb"


def test_binary_body_with_nuls_needs_content_length() -> None:
    body = bytes(range(256)) * 3
    data = encode(Frame("SEND", {"destination": "/queue/q"}, body))
    for chunk in (1, 7, 1000):
        [f] = parse_all(data, chunk)
        assert f.body == body


def test_nul_terminated_body_and_crlf_lines_and_heartbeats() -> None:
    data = b"\n\r\nSEND\r\ndestination:/topic/x\r\n\r\nhello\x00\n\nDISCONNECT\n\n\x00"
    p = FrameParser()
    frames = p.feed(data)
    assert [f.command for f in frames] == ["SEND", "DISCONNECT"]
    assert frames[0].body == b"hello"
    assert frames[0].headers == {"destination": "/topic/x"}
    assert p.heartbeats == 4


def test_repeated_header_first_wins() -> None:
    [f] = parse_all(b"SEND\nfoo:1\nfoo:2\n\n\x00")
    assert f.headers["foo"] == "1"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"BOGUS\n\n\x00", "unknown command"),
        (b"SEND\nfoo:a\\tb\n\n\x00", "undefined escape"),
        (b"SEND\nnocolon\n\n\x00", "header line"),
        (b"SEND\ncontent-length:abc\n\n\x00", "content-length"),
        (b"SEND\ncontent-length:2\n\nabc\x00", "content-length"),
        (b"SEND\nfoo:\xff\n\n\x00", "UTF-8"),
        (b"SEND\nfoo:bar\x00", "blank line"),
    ],
)
def test_malformed_frames_raise_protocol_error(data: bytes, needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        parse_all(data)


def test_limits_are_enforced() -> None:
    lim = FrameLimits(max_headers=2, max_body=10, max_header_line=20)
    with pytest.raises(ProtocolError, match="headers"):
        parse_all(b"SEND\na:1\nb:2\nc:3\n\n\x00", limits=lim)
    with pytest.raises(ProtocolError, match="limit"):
        parse_all(b"SEND\ncontent-length:11\n\n" + b"x" * 11 + b"\x00", limits=lim)
    with pytest.raises(ProtocolError, match="limit"):
        parse_all(b"SEND\n\n" + b"x" * 11, chunk=3, limits=lim)
    with pytest.raises(ProtocolError, match="longer"):
        parse_all(b"SEND\nh:" + b"x" * 30 + b"\n\n\x00", limits=lim)


def test_parser_stays_failed_after_an_error() -> None:
    p = FrameParser()
    with pytest.raises(ProtocolError):
        p.feed(b"NOPE\n\n\x00")
    with pytest.raises(ProtocolError):
        p.feed(b"SEND\n\n\x00")


def test_the_error_carries_the_frames_completed_before_the_bad_one() -> None:
    p = FrameParser()
    with pytest.raises(ProtocolError) as first:
        p.feed(
            b"CONNECT\naccept-version:1.2\n\n\x00SEND\nreceipt:r\n\nok\x00SEND\nbad:\\q\n\n\x00SEND\n\n\x00"
        )
    assert [(f.command, f.body) for f in first.value.frames] == [("CONNECT", b""), ("SEND", b"ok")]
    with pytest.raises(ProtocolError) as again:  # (those were handed out once)
        p.feed(b"SEND\n\n\x00")
    assert again.value.frames == [] and str(again.value) == str(first.value)


_txt = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
headers_st = st.dictionaries(
    st.text(_txt, min_size=1, max_size=10), st.text(_txt, max_size=20), max_size=5
).filter(lambda d: "content-length" not in d)


@given(
    st.sampled_from(["SEND", "MESSAGE", "SUBSCRIBE", "ERROR"]),
    headers_st,
    st.binary(max_size=200),
    st.integers(1, 50),
)
@settings(max_examples=60)
def test_round_trip_any_headers_and_body(cmd: str, headers: dict, body: bytes, chunk: int) -> None:
    data = encode(Frame(cmd, headers, body)) * 2
    frames = parse_all(data, chunk)
    assert len(frames) == 2
    for f in frames:
        assert f.command == cmd
        assert f.body == body
        for k, v in headers.items():
            assert f.headers[k] == v


@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(1, 40))
def test_fuzz_only_protocol_error_escapes(data: bytes, chunk: int) -> None:
    p = FrameParser(FrameLimits(max_body=100, max_headers=5, max_header_line=50))
    try:
        for i in range(0, len(data), chunk):
            for f in p.feed(data[i : i + chunk]):
                assert isinstance(f.body, bytes)
    except ProtocolError as exc:
        assert str(exc)


@settings(max_examples=200)
@given(
    st.lists(
        st.sampled_from(
            [b"SEND\n", b"a:b\n", b"\n", b"\x00", b"content-length:3\n", b"\\", b"\r", b"xyz"]
        ),
        max_size=30,
    )
)
def test_fuzz_structured_fragments(parts: list[bytes]) -> None:
    p = FrameParser()
    try:
        frames = p.feed(b"".join(parts))
    except ProtocolError as exc:
        assert str(exc)
    else:
        assert all(f.command == "SEND" for f in frames)


def test_large_nul_terminated_body_in_small_chunks_is_linear() -> None:
    import time

    body = b"y" * (2 * 1024 * 1024)
    data = b"SEND\ndestination:/topic/x\n\n" + body + b"\x00"
    p = FrameParser()
    t = time.perf_counter()
    frames = []
    for i in range(0, len(data), 1024):
        frames += p.feed(data[i : i + 1024])
    elapsed = time.perf_counter() - t
    assert len(frames) == 1 and frames[0].body == body
    assert elapsed < 2.0  # rescanning the whole buffer each time would take minutes


_pieces = st.sampled_from(
    [b"SEND", b"CONNECT", b"MESSAGE", b"BOGUS", b"\n", b"\r\n", b"\r", b":", b"a", b"b:c",
     b"\\n", b"\\t", b"\\", b"\x00", b"content-length:3", b"accept-version:1.0",
     b"accept-version:1.2", b"\xc3\xa9", b"\xff", b"x" * 40, b"y" * 70]
)  # fmt: skip


def _outcome(parser: FrameParser, data: bytes, chunk: int) -> tuple[object, ...]:
    out: list[tuple[str, dict[str, str], bytes]] = []
    try:
        for i in range(0, len(data), chunk):
            out += [(f.command, f.headers, f.body) for f in parser.feed(data[i : i + chunk])]
    except ProtocolError as exc:
        return ("error", out, str(exc))
    return ("ok", out, parser.heartbeats, parser.version)


@settings(max_examples=400)
@given(st.lists(_pieces, max_size=30), st.booleans(), st.integers(1, 64), st.booleans())
def test_header_blocks_parsed_in_one_go_read_as_line_by_line(
    parts: list[bytes], send_first: bool, chunk: int, tight: bool
) -> None:
    """The parser reads a plain header block in one go (``_fast_head``) and anything else
    line by line; both give the same frames and the same errors."""
    data = (b"SEND\n" if send_first else b"") + b"".join(parts)
    limits = FrameLimits(max_headers=2, max_header_line=20, max_body=10, max_command_line=8)
    lim = limits if tight else None
    slow = FrameParser(lim)
    slow._fast_head = lambda *a: None  # type: ignore[method-assign]
    assert _outcome(FrameParser(lim), data, chunk) == _outcome(slow, data, chunk)


def _encode_line_by_line(frame: Frame, version: str = "1.2") -> bytes:
    """The serialisation rules spelt out one header at a time (the reference)."""
    table = {"\\": "\\\\", "\n": "\\n", ":": "\\c"} | ({} if version == "1.1" else {"\r": "\\r"})
    lines = [frame.command]
    headers = dict(frame.headers)
    if frame.body and "content-length" not in headers:
        headers["content-length"] = str(len(frame.body))
    for name, value in headers.items():
        if "\x00" in name + value:
            raise ValueError(f"header {name!r} contains a NUL character")
        lines.append("".join(table.get(c, c) for c in name) + ":" +
                     "".join(table.get(c, c) for c in value))  # fmt: skip
    return ("\n".join(lines) + "\n\n").encode() + frame.body + b"\x00"


@settings(max_examples=300)
@given(
    st.sampled_from(["SEND", "MESSAGE", "RECEIPT", "ERROR"]),
    st.dictionaries(
        st.text("ab:\\\r\n\x00é", max_size=4), st.text("ab:\\\r\n\x00é", max_size=6), max_size=4
    ),
    st.sampled_from([b"", b"x", b"\x00y"]),
    st.sampled_from(["1.1", "1.2"]),
)
def test_encode_matches_the_rules_header_by_header(
    cmd: str, headers: dict[str, str], body: bytes, version: str
) -> None:
    frame = Frame(cmd, headers, body)
    try:
        want: bytes | str = _encode_line_by_line(frame, version)
    except ValueError as exc:
        want = str(exc)
    try:
        got: bytes | str = encode(frame, version=version)
    except ValueError as exc:
        got = str(exc)
    assert got == want


def test_stomp_11_has_no_cr_escape() -> None:
    data = b"SEND\ndestination:/topic/x\npath:a\\rb\n\n\x00"
    p = FrameParser()
    p.version = "1.1"
    with pytest.raises(ProtocolError, match="undefined escape"):
        p.feed(data)
    [f] = parse_all(data)  # 1.2 has it
    assert f.headers["path"] == "a\rb"
    p11 = FrameParser()
    p11.version = "1.1"
    [g] = p11.feed(b"SEND\nh:a\\nb\\cc\\\\d\n\n\x00")  # the escapes 1.1 does have
    assert g.headers["h"] == "a\nb:c\\d"
