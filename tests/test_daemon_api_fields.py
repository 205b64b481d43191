"""The admin API's JSON bodies against a real daemon: a field it does not know (a misspelt
``"tll"``) is refused with a 400 naming it, never ignored with its default used instead; the
payload is given once; a field of the wrong type is named with what it must be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

from dodwan.daemon.client import AdminClient, ClientError


def _refused(c: AdminClient, path: str, body: dict[str, Any]) -> str:
    with pytest.raises(ClientError) as info:
        c.post(path, body)
    return str(info.value)


def test_unknown_fields_and_two_payloads_are_refused_by_name(daemons, tmp_path: Path) -> None:
    a = daemons("a", "--group", random_group())
    c = a.client()
    pub = {"attributes": {"topic": "t"}, "text": "x"}
    # both payload fields: the text was dropped in silence, the base64 one published
    err = _refused(c, "/publish", {**pub, "payload_b64": "QjY0"})
    assert "give the payload once" in err and "'text' and 'payload_b64'" in err, err
    with pytest.raises(ClientError, match="an application/octet-stream body and 'text'"):
        c.publish_bytes(b"raw", attributes={"topic": "t"}, text="x")
    # misspelt fields: the default deadline and priority were used in silence
    err = _refused(c, "/publish", {**pub, "tll": 60})
    assert "unknown field 'tll' (did you mean 'ttl'?) in POST /publish" in err, err
    assert "its fields are attributes, text, payload_b64, ttl, priority, persistent" in err
    err = _refused(c, "/publish", {**pub, "priorty": 9, "zzz": 1})
    assert "unknown fields 'priorty' (did you mean 'priority'?), 'zzz' in" in err, err
    with pytest.raises(ClientError, match=r"unknown field 'tll' \(did you mean 'ttl'\?\)"):
        c.publish_bytes(b"raw", attributes={"topic": "t"}, tll=60)  # X-Dodwan-Publish form
    many = {**pub, **{f"{'x' * 100}{i}": 1 for i in range(8)}}
    err = _refused(c, "/publish", many)
    assert err.count("…'") == 5 and "and 3 more" in err and "x" * 65 not in err, err
    assert c.get("/cache") == []  # nothing was published

    out = str(tmp_path / "out")
    sub = {"patterns": {"topic": "t"}, "sink": {"kind": "dir", "target": out}}
    err = _refused(c, "/subscribe", {**sub, "kye": "news"})
    assert "unknown field 'kye' (did you mean 'key'?) in POST /subscribe" in err, err
    err = _refused(c, "/subscribe", {**sub, "sink": {"kind": "dir", "target": out, "trget": 1}})
    assert "unknown field 'trget' (did you mean 'target'?) in the sink of" in err, err
    with pytest.raises(ClientError, match="unknown field 'sink' in POST /follow"):
        next(iter(c.stream("/follow", sub)))
    bridge = {"uri": "stomp://127.0.0.1:1/topic/x", "name": "b1"}
    err = _refused(c, "/bridges", {**bridge, "replce": True})
    assert "unknown field 'replce' (did you mean 'replace'?) in POST /bridges" in err, err
    err = _refused(c, "/bridges", {**bridge, "replace": "no"})
    assert err == "replace must be true or false, not a string ('no')", err
    assert c.get("/subscriptions") == [] and c.get("/bridges") == []
    # what is right is still accepted
    assert c.post("/subscribe", {**sub, "key": "news"})["key"] == "news"
    assert c.post("/publish", {**pub, "ttl": 60, "priority": 9, "persistent": False})["id"]


def test_publish_type_errors_name_the_field_and_what_it_must_be(daemons) -> None:
    """The core's own TypeError came through: ``bool object expected; got str``."""
    a = daemons("a", "--group", random_group())
    c = a.client()
    pub = {"attributes": {"topic": "t"}, "text": "x"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"persistent": "no"}, "persistent must be true or false, not a string ('no')"),
        ({"persistent": 1}, "persistent must be true or false, not 1"),
        ({"priority": 4.0}, "priority must be an integer from 0 to 9, not 4.0"),
        ({"priority": 10}, "priority must be an integer from 0 to 9, not 10"),
        ({"priority": None}, "priority must be an integer from 0 to 9, not null"),
        ({"ttl": "60"}, "ttl must be a number, not a string ('60')"),
        ({"ttl": [60]}, "ttl must be a number, not a list"),
        ({"text": 5}, "text must be a string, not 5"),
    ]
    for extra, message in cases:
        assert _refused(c, "/publish", {**pub, **extra}) == message
    err = _refused(c, "/publish", {"attributes": {"topic": "t"}, "payload_b64": {"a": 1}})
    assert err == "payload_b64 must be a string (base64), not an object"
    assert c.get("/cache") == []


def test_exec_sink_sets_no_variable_that_two_attributes_share(daemons, tmp_path: Path) -> None:
    """docs/admin-api.md promises DODWAN_ATTR_<NAME>: attributes a-b, a.b, 'a b' and A_B
    all became DODWAN_ATTR_A_B, holding whichever came last."""
    a = daemons("a", "--group", random_group())
    c = a.client()
    out = tmp_path / "env.out"
    cmd = f"env | grep ^DODWAN_ATTR | sort > {out}.tmp && mv {out}.tmp {out}"
    c.post("/subscribe", {"patterns": {"topic": "exc"}, "sink": {"kind": "exec", "target": cmd}})
    attrs = {"topic": "exc", "a-b": "1", "a.b": "2", "a b": "3", "A_B": "4", "lone-one": "5"}
    c.post("/publish", {"attributes": attrs, "text": "x"})
    wait_for(out.exists, what="the exec sink's output")
    lines = out.read_text().splitlines()
    assert 'DODWAN_ATTRS_OMITTED=["A_B", "a b", "a-b", "a.b"]' in lines, lines
    assert "DODWAN_ATTR_LONE_ONE=5" in lines and "DODWAN_ATTR_TOPIC=exc" in lines, lines
    assert not [x for x in lines if x.startswith("DODWAN_ATTR_A_B=")], lines
