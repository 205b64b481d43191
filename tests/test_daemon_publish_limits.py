"""What ``POST /publish`` accepts at its edges, against a real daemon: ``max_payload`` in
/status is the largest payload it accepts (fragments, body size and cache all counted),
and its numeric fields refuse what they cannot mean (booleans, more digits than shown)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group

from dodwan.daemon.admin import MAX_BODY
from dodwan.daemon.client import ClientError


def _config(tmp_path: Path, text: str) -> str:
    f = tmp_path / "c.toml"
    f.write_text(text)
    return str(f)


def test_max_payload_is_accepted_and_one_byte_more_is_refused_with_it(
    daemons, tmp_path: Path
) -> None:
    """With few fragments allowed, max_payload once counted only the cache: publishing it
    failed with "payload needs too many fragments"."""
    conf = _config(tmp_path, "[node.limits]\nmax_fragments = 64\n")
    a = daemons("a", "--group", random_group(), "--config", conf, "--host-id", "pa")
    c = a.client()
    biggest = c.get("/status")["max_payload"]
    assert 0 < biggest <= 64 * 1400
    msg = c.publish_bytes(os.urandom(biggest), attributes={"topic": "big"}, ttl=600)
    assert c.get("/cache/" + msg["id"])["size"] == biggest
    with pytest.raises(ClientError) as info:
        c.publish_bytes(os.urandom(biggest + 1), attributes={"topic": "big"}, ttl=600)
    assert f"the largest publication is {biggest} bytes" in str(info.value)


def test_max_payload_counts_the_body_limit_and_fragments(daemons, tmp_path: Path) -> None:
    """With a large cache and max_message_size, max_payload (134,201,344) was more than
    the admin API reads in one body (96 MiB) and than 65,536 fragments hold; the body
    limit's 413 then named, as the largest publication, more than it refused."""
    conf = _config(
        tmp_path,
        "[node]\ncache_capacity = 268435456\n[node.limits]\nmax_message_size = 134217728\n",
    )
    a = daemons("a", "--group", random_group(), "--config", conf, "--host-id", "pa")
    c = a.client()
    biggest = c.get("/status")["max_payload"]
    assert biggest <= MAX_BODY
    assert biggest <= 65536 * 1400
    size = MAX_BODY + 1
    with pytest.raises(ClientError) as info:
        c.publish_bytes(bytes(size), attributes={"topic": "big"}, ttl=600)
    named = [int(n) for n in re.findall(r"largest publication is (\d+) bytes", str(info.value))]
    assert named == [biggest], str(info.value)
    assert biggest < size


def test_publish_refuses_booleans_and_shows_the_ttl_as_given(daemons) -> None:
    a = daemons("a", "--group", random_group())
    c = a.client()
    for field in ("ttl", "priority"):
        with pytest.raises(
            ClientError, match=f"{field} must be (a number|an integer from 0 to 9), not a boolean"
        ):
            c.post("/publish", {"attributes": {"topic": "t"}, "text": "x", field: True})
    with pytest.raises(ClientError) as info:
        c.post("/publish", {"attributes": {"topic": "t"}, "text": "x", "ttl": 604800.5})
    assert "time to live 604800.5 s is longer than the maximum, 604800 s" in str(info.value)
    ok = c.post("/publish", {"attributes": {"topic": "t"}, "text": "x", "ttl": 604800})
    assert ok["id"]
