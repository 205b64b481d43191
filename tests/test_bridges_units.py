"""Bridge parts without a broker: URIs, settings, the outbox; and the daemon's refusals."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import stomp
from brokers import _ephemeral_range, free_port
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.bridges.binding import LinkError
from dodwan.bridges.mapping import ORIGIN_MARK, Inbound, inbound_attributes, inbound_id
from dodwan.bridges.outbox import Outbox
from dodwan.bridges.selection import descriptor_values, inbound_values
from dodwan.bridges.stomp import StompLink
from dodwan.bridges.uri import BindingSpec, SpecError, parse_uri, without_credentials
from dodwan.daemon import config as cfg
from dodwan.daemon.client import ClientError


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        # digits then a raw '/' looked like HOST:PORT/PATH and came back whole
        ("amqp://u:12/3@h/x", "amqp://h/x"),
        ("amqp://u:12/3@h:5672/ex/key", "amqp://h:5672/ex/key"),
        ("mqtt://alice@h:1883/t/#", "mqtt://h:1883/t/#"),  # user only
        ("stomp://u:p@ss@h/queue/q", "stomp://h/queue/q"),  # '@' in the password
        ("amqp://u:a:b:1@h/x", "amqp://h/x"),  # ':' in the password
        ("amqp://u:1/2/3@[::1]:5672/x", "amqp://[::1]:5672/x"),  # '/' in it, IPv6 host
        ("amqp://u:p?q#r@h/x", "amqp://h/x"),  # '?' and '#' in it
        ("amqp://[::1]:5672/x", "amqp://[::1]:5672/x"),  # nothing to hide
        ("mqtt://h:1883/t/#", "mqtt://h:1883/t/#"),
        ("u:p@h", "u:h"),  # no '//': the password still goes
    ],
)
def test_uri_shown_without_credentials(uri: str, shown: str) -> None:
    assert without_credentials(uri) == shown
    for secret in ("12/3", "1/2/3", "p@ss", "a:b:1", "p?q#r", "alice"):
        if secret in uri:
            assert secret not in without_credentials(uri)


def test_uris_of_the_three_protocols() -> None:
    e = parse_uri("mqtt://127.0.0.1:1883/field/reports/#")
    assert (e.scheme, e.port, e.destination, e.out_target) == (
        "mqtt",
        1883,
        "field/reports/#",
        "field/reports",
    )
    e = parse_uri("stomp://user:p%40ss@hq.example:61613/queue/field.reports")
    assert (e.kind, e.destination, e.user, e.password) == ("queue", "field.reports", "user", "p@ss")
    assert e.display == "stomp://hq.example:61613/queue/field.reports"  # no secrets
    e = parse_uri("amqp://127.0.0.1/hq/field.#")
    assert (e.port, e.kind, e.destination, e.routing_key, e.out_target) == (
        5672,
        "exchange",
        "hq",
        "field.#",
        "field",
    )
    assert parse_uri("amqp://127.0.0.1/queue/orders").kind == "queue"


@pytest.mark.parametrize(
    ("uri", "target"),
    [
        ("mqtt://h/a/", "a/"),  # was 'a': another topic
        ("mqtt://h/b//#", "b/"),  # was 'b'
        ("mqtt://h/c/#", "c"),
        ("mqtt://h/c", "c"),
        ("mqtt://h/#", ""),  # refused outbound (no topic)
        ("amqp://h/ex/a.", "a."),  # was 'a'
        ("amqp://h/ex/b..#", "b."),  # was 'b'
        ("amqp://h/ex/c.#", "c"),
        ("amqp://h/ex/#", ""),
        ("amqp://h/ex", ""),
    ],
)
def test_only_a_last_wildcard_level_is_dropped_from_the_outbound_target(
    uri: str, target: str
) -> None:
    assert parse_uri(uri).out_target == target


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("http://127.0.0.1/x", "unsupported URI scheme"),
        ("stomp://127.0.0.1/x/y", "topic/NAME or /queue/NAME"),
        ("stomp://127.0.0.1/topic/", "topic/NAME or /queue/NAME"),
        ("mqtt://127.0.0.1", "names a topic"),
        ("mqtt://127.0.0.1/a/#/b", "'#' only as the last level"),
        ("mqtt://:1883/a", "names no host"),
        ("mqtt://127.0.0.1:99999/a", "invalid port"),
        ("amqp://127.0.0.1/queue/", "needs a queue name"),
        ("mqtt://127.0.0.1/a?qos=1", "binding settings, not in the URI"),
        ("mqtt://[::1/a", "not a valid URI"),
        ("mqtt://127.0.0.1:1/nul%00x", "NUL"),
        ("stomp://u%00:p@127.0.0.1/topic/x", "NUL"),
        ("mqtt://127.0.0.1:0/a", "invalid port"),
        ("mqtt://h/%2Fabs", "empty first level"),
        ("mqtt://h//abs", "empty first level"),
        # MQTT strings: at most 65535 UTF-8 bytes, no control character (Mosquitto closes
        # the connection: "Malformed packet"), no non-character; earlier accepted, then
        # the binding failed for ever (a traceback in paho's thread for the long one)
        pytest.param("mqtt://h/" + "L" * 65536, "topic is 65536 bytes long", id="long"),
        pytest.param("mqtt://h/" + "é" * 32768, "MQTT allows at most 65535", id="long-utf8"),
        ("mqtt://h/c%01d", "topic holds U+0001, a control character"),
        ("mqtt://h/c\x1fd", "U+001F"),
        ("mqtt://h/c%7Fd", "U+007F"),
        ("mqtt://h/c%C2%9Fd", "U+009F"),
        ("mqtt://h/c%EF%BF%BFd", "U+FFFF, a control character or non-character"),
        ("mqtt://h/c%EF%B7%90d", "U+FDD0"),
        ("mqtt://u%0A:p@h/x", "user name holds U+000A"),
        # not UTF-8 once percent-decoded: earlier each bad sequence became U+FFFD
        ("mqtt://h/u%FFv", "the path is not valid UTF-8 once percent-decoded (%FF)"),
        ("mqtt://h/s%ED%A0%80", "not valid UTF-8 once percent-decoded (%ED)"),  # a surrogate
        ("stomp://h/queue/a%C3", "path is not valid UTF-8"),  # cut short
        ("amqp://h/ex/k%E9", "path is not valid UTF-8"),  # Latin-1
        ("amqp://u%FF:p@h/x", "the user name is not valid UTF-8"),
        ("stomp://u:p%FF@h/queue/q", "the password is not valid UTF-8 once percent-decoded"),
        ("mqtt://h/a\ud800", "is not valid Unicode text (it holds a lone surrogate)"),
    ],
)
def test_bad_uris_are_refused_with_the_reason(uri: str, reason: str) -> None:
    with pytest.raises(SpecError, match=re.escape(reason)):
        parse_uri(uri)


def test_mqtt_strings_at_the_limits_are_taken() -> None:
    assert parse_uri("mqtt://h/" + "L" * 65535).destination == "L" * 65535
    assert parse_uri("mqtt://h/a\xa0b%E2%82%AC/%F0%9F%98%80").destination == "a\xa0b€/😀"
    assert parse_uri("mqtt://u:p%01@h/x").password == "p\x01"  # binary data in MQTT


def test_binding_settings_are_checked() -> None:
    ok = BindingSpec.from_dict({"uri": "mqtt://h/field/#", "attributes": {"topic": "r.1"}})
    assert ok.name == "mqtt-field" and ok.direction == "both"
    assert ok.patterns() == [{"topic": r"r\.1"}]  # attributes select exactly
    with pytest.raises(SpecError, match="needs attributes, a filter or a selector"):
        BindingSpec.from_dict({"uri": "mqtt://h/field/#", "direction": "out"})
    assert BindingSpec.from_dict({"uri": "mqtt://h/+/x", "direction": "in"}).inbound
    with pytest.raises(SpecError, match="without wildcards"):
        BindingSpec.from_dict({"uri": "mqtt://h/+/x", "attributes": {"a": "b"}})
    with pytest.raises(SpecError, match="unknown binding setting"):
        BindingSpec.from_dict({"uri": "mqtt://h/x", "attributes": {"a": "b"}, "colour": 1})
    with pytest.raises(SpecError, match="direction must be"):
        BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "sideways"})
    with pytest.raises(SpecError, match="ttl must be positive"):
        BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "in", "ttl": 0})
    with pytest.raises(SpecError, match="qos must be 1 or 2"):
        BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "in", "qos": 0})
    standby = BindingSpec.from_dict(
        {"uri": "mqtt://h/x", "attributes": {"a": "b"}, "standby": True}
    )
    assert standby.holdoff == 30.0 and ok.holdoff == 0.0  # a sane default for a standby
    assert BindingSpec.from_dict({**standby.as_dict(), "holdoff": 5}).holdoff == 5.0
    with pytest.raises(SpecError, match="standby binding needs direction both"):
        BindingSpec.from_dict(
            {"uri": "mqtt://h/x", "direction": "out", "attributes": {"a": "b"}, "standby": True}
        )
    with pytest.raises(SpecError, match="standby must be true or false"):
        BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "in", "standby": "yes"})
    for uri in ("stomp://h/queue/q", "amqp://h/queue/q"):
        with pytest.raises(SpecError, match="a queue is one way"):
            BindingSpec.from_dict({"uri": uri, "attributes": {"a": "b"}})
        assert BindingSpec.from_dict({"uri": uri, "attributes": {"a": "b"}, "direction": "out"})
    with pytest.raises(SpecError, match="binding name"):
        BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "in", "name": "a b"})


def test_a_jms_selector_is_a_binding_filter() -> None:
    """The selector is JOMS's own (errors, three-valued logic, network patterns)."""
    base = {"uri": "stomp://h/topic/reports", "name": "hq"}
    spec = BindingSpec.from_dict(
        {**base, "selector": "topic LIKE 'field.%' AND severity IN ('high', 'critical')"}
    )
    # No attributes and no filter: the subscription comes from the selector.
    assert spec.patterns() == [{"topic": r"(?s)field\..*", "severity": "(?:critical|high)"}]
    values = descriptor_values({"id": "m1", "topic": "field.a", "severity": "high", "date": "5"})
    assert spec.selects(values) and values["JMSTimestamp"] == 5000
    assert not spec.selects(descriptor_values({"topic": "field.a", "severity": "low"}))
    assert spec.as_dict()["selector"].startswith("topic LIKE")
    # Typed JOMS properties keep their type; JMS header fields come from the descriptor.
    spec = BindingSpec.from_dict(
        {**base, "attributes": {"topic": "t"}, "selector": "level > 3 AND JMSPriority >= 7"}
    )
    assert spec.patterns() == [{"topic": "t"}]  # the attributes still choose what to fetch
    typed = {"topic": "t", "level": "5", "jms_types": "level:int", "priority": "8"}
    assert spec.selects(descriptor_values(typed))
    # A plain attribute is a string: JMS compares it with a number as UNKNOWN.
    assert not spec.selects(descriptor_values({**typed, "jms_types": ""}))
    assert not spec.selects(descriptor_values({**typed, "priority": "4"}))
    # Incoming: remote headers are string properties, with the protocol's JMS fields.
    inbound = BindingSpec.from_dict({**base, "direction": "in", "selector": "JMSType = 'order'"})
    assert inbound.selects(inbound_values(Inbound(b"", jms_type="order")))
    assert not inbound.selects(inbound_values(Inbound(b"", headers={"JMSType": "x"})))
    with pytest.raises(SpecError, match=r"binding hq: invalid selector 'a = = 1'"):
        BindingSpec.from_dict({**base, "attributes": {"topic": "t"}, "selector": "a = = 1"})
    with pytest.raises(SpecError, match="this selector alone does not say"):
        BindingSpec.from_dict({**base, "selector": "level > 3"})
    with pytest.raises(SpecError, match="selector must be a string"):
        BindingSpec.from_dict({**base, "direction": "in", "selector": 3})


def test_inbound_mapping_marks_origin_and_keeps_system_attributes_out() -> None:
    msg = Inbound(
        b"x",
        headers={"urgency": "high", "id": "evil", "deadline": "1", "dodwan-id": "z", "": "e"},
        correlation_id="c-1",
    )
    attrs = inbound_attributes(msg, {"topic": "orders"}, "stomp://h:1/topic/orders")
    assert attrs == {
        "urgency": "high",
        "jms_correlation_id": "c-1",
        "topic": "orders",
        ORIGIN_MARK: "stomp://h:1/topic/orders",
    }
    # The same remote message gets the same DoDWAN id on every gateway.
    assert inbound_id("stomp:topic/x", "ID:1") == inbound_id("stomp:topic/x", "ID:1")
    assert inbound_id("stomp:topic/x", "ID:1") != inbound_id("stomp:topic/y", "ID:1")


def test_outbox_sent_flag_high_water_mark_and_echo_placeholder(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    assert (tmp_path / "bridges.db").stat().st_mode & 0o777 == 0o600  # URIs with passwords
    for i in range(5):
        assert box.enqueue("b", f"m{i}", {"id": f"m{i}"}, b"p", 2e9, 0.0)
    assert not box.enqueue("b", "m0", {"id": "m0"}, b"p", 2e9, 0.0)  # never twice
    rows = box.pending("b", 1.0, 3)
    assert [r.msg_id for r in rows] == ["m0", "m1", "m2"]
    box.mark_sent("b", [r.seq for r in rows])
    assert box.mark_echoed("b", "m3", 2e9)  # sent by another gateway: dropped here
    assert not box.mark_echoed("b", "later", 2e9)  # not here yet: a placeholder
    assert not box.enqueue("b", "later", {"id": "later"}, b"p", 2e9, 0.0)
    box.close()
    box = Outbox(tmp_path)  # everything above is durable
    assert [r.msg_id for r in box.pending("b", 1.0, 10)] == ["m4"]
    marks = box.marks("b")
    assert marks["backlog"] == 1 and marks["sent_total"] == 3 and marks["hwm"] == rows[-1].seq
    box.remember("b", "d1", 2e9)  # an incoming message without a remote id, by its content
    box.close()
    box = Outbox(tmp_path)
    assert box.seen("b", "d1") and not box.seen("b", "d2") and not box.seen("c", "d1")
    assert box.purge(3e9) == 1  # m4 expired unsent
    assert box.known("b") == set()
    assert not box.seen("b", "d1")  # forgotten with its deadline


def test_config_file_bridges_are_checked_at_load(tmp_path: Path) -> None:
    f = tmp_path / "d.toml"
    f.write_text('[[bridges]]\nuri = "mqtt://127.0.0.1/x/#"\nattributes = {topic = "x"}\n')
    conf = cfg.load(f)
    assert conf.bridges[0]["uri"] == "mqtt://127.0.0.1/x/#"
    f.write_text('[[bridges]]\nuri = "ftp://127.0.0.1/x"\n')
    with pytest.raises(cfg.ConfigError, match=r"\[\[bridges\]\] #1: unsupported URI scheme"):
        cfg.load(f)
    f.write_text(
        '[[bridges]]\nname = "a"\nuri = "mqtt://h/x"\ndirection = "in"\n'
        '[[bridges]]\nname = "a"\nuri = "mqtt://h/y"\ndirection = "in"\n'
    )
    with pytest.raises(cfg.ConfigError, match="used twice"):
        cfg.load(f)
    f.write_text(  # two URIs that make one name: says how to tell them apart
        '[[bridges]]\nuri = "mqtt://h/x/y"\ndirection = "in"\n'
        '[[bridges]]\nuri = "mqtt://h/x-y"\ndirection = "in"\n'
    )
    with pytest.raises(cfg.ConfigError, match=r"'mqtt-x-y' used twice \(made from the URI"):
        cfg.load(f)
    f.write_text(
        '[[bridges]]\nname = "a"\nuri = "mqtt://h/x"\ndirection = "in"\n'
        '[[bridges]]\nname = "a"\nuri = "mqtt://h/y"\ndirection = "in"\n'
    )
    res = subprocess.run(
        [sys.executable, "-m", "dodwan.cli", "daemon", "--config", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"DODWAN_STATE_DIR": str(tmp_path / "s"), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 1 and "Error: " in res.stderr and "used twice" in res.stderr


def test_admin_api_refuses_bad_bindings_and_keeps_the_daemon_running(
    daemons: Callable[..., DaemonProc],
) -> None:
    d = daemons("gw", "--group", random_group())
    c = d.client()
    with pytest.raises(ClientError, match="unsupported URI scheme"):
        c.post("/bridges", {"uri": "gopher://127.0.0.1/x"})
    with pytest.raises(ClientError, match="no binding 'nope'"):
        c.delete("/bridges/nope")
    # A ttl over the daemon's limits.max_ttl (7 days by default) would refuse every message.
    with pytest.raises(ClientError, match=r"ttl 864000 s is longer than .*limits.max_ttl"):
        c.post("/bridges", {"uri": "mqtt://127.0.0.1/x", "direction": "in", "ttl": 864000})
    # A broker that is not there: the binding is kept and retries, reporting why.
    dead = f"mqtt://127.0.0.1:{free_port()}/field/#"
    c.post("/bridges", {"uri": dead, "name": "hq", "attributes": {"topic": "r"}})
    with pytest.raises(ClientError, match="exists; use replace"):
        c.post("/bridges", {"uri": dead, "name": "hq", "attributes": {"topic": "r"}})
    st = wait_for(lambda: (b := c.get("/bridges")[0])["errors"] and b, 20, what="link errors")
    assert not st["connected"] and "Connection refused" in st["last_error"]
    # Replacing with another unreachable broker fails and keeps the old binding.
    other = f"mqtt://127.0.0.1:{free_port()}/other/#"
    with pytest.raises(ClientError, match="did not connect"):
        c.post(
            "/bridges",
            {"uri": other, "name": "hq", "attributes": {"topic": "r"}, "replace": True},
        )
    assert c.get("/bridges")[0]["uri"] == dead
    # Messages wait in the outbox meanwhile; the bridge's subscription is not the user's.
    c.post("/publish", {"attributes": {"topic": "r"}, "text": "x"})
    wait_for(lambda: c.get("/bridges")[0]["backlog"] == 1, 10, what="backlog of 1")
    with pytest.raises(ClientError, match="belongs to a bridge"):
        c.delete("/subscriptions/bridge:hq")
    out = subprocess.run(
        [sys.executable, "-m", "dodwan.cli", "bridge", "ls", "--state-dir", str(d.state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    assert "hq" in out.stdout and "down" in out.stdout and "Connection refused" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "dodwan.cli", "status", "--state-dir", str(d.state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    bridge_lines = out.stdout.split("\nbridges\n")[1].splitlines()
    assert bridge_lines[0].split()[:4] == ["NAME", "DIR", "LINK", "BACKLOG"]
    assert bridge_lines[1].split()[:4] == ["hq", "both", "down", "1"]
    out = subprocess.run(
        [sys.executable, "-m", "dodwan.cli", "bridge", "rm", "hq", "--state-dir", str(d.state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and "1 unsent message(s) dropped" in out.stdout
    assert c.get("/bridges") == [] and "bridge:hq" not in str(c.get("/subscriptions"))
    assert d.alive


def test_broker_ports_are_drawn_outside_the_ephemeral_range() -> None:
    """A broker's port is chosen before it boots (RabbitMQ: seconds). Drawn from the
    ephemeral range, it could become some connection's source port meanwhile, and the broker
    then failed to listen (``eaddrinuse``, seen in CI); outside it, nothing takes it."""
    lo, hi = _ephemeral_range()
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # drawn at random, not one port for every broker
    for port in ports:
        assert not lo <= port <= hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # and free


def test_an_mqtt_subscription_the_broker_refuses_is_a_link_error() -> None:
    """A SUBACK with a failure code (0x87 not authorized) leaves the binding down, saying why.
    (Mosquitto's own ACLs grant any subscription and filter at delivery; other brokers and
    Mosquitto's plugins refuse it.)"""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    from dodwan.bridges.binding import LinkError
    from dodwan.bridges.mqtt import MqttLink

    spec = BindingSpec.from_dict({"uri": "mqtt://127.0.0.1/denied/#", "direction": "in"})
    link = MqttLink(spec, "gw", lambda _m: True)
    c = link.inb.client
    c.on_connect(c, None, None, ReasonCode(PacketTypes.CONNACK, identifier=0), None)
    assert not link.inb.up.is_set()  # not before the broker answered the subscription
    c.on_subscribe(c, None, 1, [ReasonCode(PacketTypes.SUBACK, identifier=0x87)], None)
    with pytest.raises(LinkError, match=r"subscription refused: 'denied/#' \(Not authorized\)"):
        link.inb.check()
    link.close()


@pytest.mark.parametrize("ttl", [864000, float("nan"), float("inf"), 1e300])
def test_a_ttl_the_daemon_cannot_use_is_refused(ttl: float) -> None:
    base = {"uri": "mqtt://h/x", "direction": "in", "name": "hq"}
    with pytest.raises(SpecError, match=r"binding hq: ttl"):
        BindingSpec.from_dict({**base, "ttl": ttl}, max_ttl=604800.0)
    assert BindingSpec.from_dict({**base, "ttl": 604800}, max_ttl=604800.0).ttl == 604800.0
    with pytest.raises(SpecError, match=r"binding hq: holdoff"):
        BindingSpec.from_dict({**base, "holdoff": float("nan")})


def test_a_ttl_over_max_ttl_is_shown_as_given() -> None:
    # an int in full, not rounded by :g to a figure that reads as the limit itself
    base = {"uri": "mqtt://h/x", "direction": "in", "name": "hq"}
    with pytest.raises(SpecError, match=r"ttl 604801 s is longer"):
        BindingSpec.from_dict({**base, "ttl": 604801}, max_ttl=604800.0)
    with pytest.raises(SpecError, match=r"ttl 604800\.5 s is longer"):
        BindingSpec.from_dict({**base, "ttl": 604800.5}, max_ttl=604800.0)
    with pytest.raises(SpecError, match=r"binding hq: holdoff"):
        BindingSpec.from_dict({**base, "holdoff": float("nan")})


class _FakeHost:
    """A daemon that refuses what the core refuses: payloads over a size, a ttl over a limit,
    and (when ``full``) everything, its cache being full."""

    host_id = "gw"
    max_ttl = 1000.0
    max_payload = 10

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.published: list[tuple[dict[str, str], float]] = []
        self.full = False

    def publish(self, attributes: Any, payload: bytes, deadline: float, priority: int) -> str:
        from dodwan.core import CacheFullError

        if self.full:
            raise CacheFullError("cache full")
        if len(payload) > self.max_payload:
            raise ValueError(f"payload larger than {self.max_payload} bytes")
        if deadline - time.time() > self.max_ttl:
            raise ValueError("time to live is longer than the maximum (limits.max_ttl)")
        self.published.append((dict(attributes), deadline))
        return "m1"

    def subscribe(self, key: str, patterns: list[dict[str, str]]) -> None: ...
    def unsubscribe(self, key: str) -> None: ...
    def subscription_keys(self) -> list[str]:
        return []

    def cached(self) -> list[Any]:
        return []


def test_an_inbound_message_is_acknowledged_only_when_its_refusal_is_for_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A payload over the size limit never fits: counted, logged, acknowledged (else it would
    block the binding). A full cache may pass later: not acknowledged, the broker keeps it.
    A binding kept from before the daemon's max_ttl was lowered: its ttl is capped."""
    from dodwan.bridges.binding import Binding
    from dodwan.bridges.manager import BridgeManager

    host = _FakeHost(tmp_path)
    manager = BridgeManager(host, [])
    manager.outbox = Outbox(tmp_path)
    spec = BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "in", "ttl": 5000})
    b = Binding(spec, manager.outbox, lambda *_a: None, manager._from_thread)  # type: ignore[arg-type,return-value]
    with caplog.at_level("WARNING", logger="dodwan.bridges"):
        assert manager._inbound(b, Inbound(b"ok", headers={"a": "b"}))
        ((_attrs, deadline),) = host.published
        assert deadline - time.time() <= host.max_ttl
        assert manager._inbound(b, Inbound(b"x" * 11))  # too large, for good
        assert b.errors == 1 and "bytes larger than 10" in b.last_error
        host.full = True
        assert not manager._inbound(b, Inbound(b"later"))  # may pass later: kept
        assert b.errors == 2 and "cache full" in b.last_error
    assert b.received == 1
    assert "not mapped" not in caplog.text
    manager.outbox.close()


def test_mqtt_client_ids_of_two_gateways_never_collide() -> None:
    """Host h2-z's binding cl and host h2's binding z-cl were both dodwan-h2-z-cl-in: each
    connection took the other's session over. Ids with no '-' to confuse keep their old
    form (their persistent sessions survive the upgrade)."""
    from dodwan.bridges.mqtt import MqttLink

    def client_id(host: str, name: str) -> str:
        spec = BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "in", "name": name})
        return MqttLink(spec, host, lambda _m: True).inb.client_id

    assert client_id("h2-z", "cl") != client_id("h2", "z-cl")
    long = "n" * 64
    assert client_id("h" * 64, long) != client_id("h" * 64, long[:-1] + "m")
    assert client_id("h2-z", "cl") == client_id("h2-z", "cl")  # stable across restarts
    assert client_id("gw", "hq") == "dodwan-gw-hq-in"  # unambiguous already: unchanged
    assert all(len(client_id(h, n)) <= 100 for h in ("h" * 64, "a-b") for n in (long, "c"))


class _StrictHost(_FakeHost):
    """Refuses attributes as the core does: its own check of each one, and a descriptor
    over ``limits.max_descriptor_bytes`` (approximated by the attributes' total length)."""

    max_payload = 1000

    def publish(self, attributes: Any, payload: bytes, deadline: float, priority: int) -> str:
        from dodwan.core.limits import Limits
        from dodwan.core.message import check_app_attributes

        limits = Limits()
        check_app_attributes(attributes, limits)
        size = sum(len(k) + len(v) for k, v in attributes.items())
        if size > limits.max_descriptor_bytes:
            raise ValueError(f"descriptor of {size} bytes is over limits.max_descriptor_bytes")
        return super().publish(attributes, payload, deadline, priority)


def test_only_the_remote_headers_the_core_refuses_are_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One invalid header (``once: maybe``, a 20 kB value) cost the message every remote
    header; now only that one is left out, with a warning naming it. At most 32 headers
    are taken over, as before."""
    from dodwan.bridges.binding import Binding
    from dodwan.bridges.manager import BridgeManager

    host = _StrictHost(tmp_path)
    manager = BridgeManager(host, [])
    manager.outbox = Outbox(tmp_path)
    spec = BindingSpec.from_dict({"uri": "mqtt://h/x", "direction": "in", "name": "hq"})
    b = Binding(spec, manager.outbox, lambda *_a: None, manager._from_thread)  # type: ignore[arg-type,return-value]
    many = {f"h{i:02d}": "v" for i in range(40)}
    with caplog.at_level("WARNING", logger="dodwan.bridges"):
        assert manager._inbound(b, Inbound(b"1", headers={"once": "maybe", "good": "yes"}))
        assert manager._inbound(b, Inbound(b"2", headers={"big": "B" * 20000, "good": "yes"}))
        assert manager._inbound(b, Inbound(b"3", headers={"once": "maybe", **many}))
        assert manager._inbound(b, Inbound(b"4", headers={"once": "true", "good": "yes"}))
    (a1, _), (a2, _), (a3, _), (a4, _) = host.published
    assert a1["good"] == "yes" and "once" not in a1
    assert a2["good"] == "yes" and "big" not in a2
    assert "once" not in a3 and sum(k.startswith("h") for k in a3) == 32
    assert a4["once"] == "true" and a4["good"] == "yes"
    assert "'once'" in caplog.text and "'big'" in caplog.text
    assert b.received == 4 and b.errors == 0
    manager.outbox.close()


def test_ledger_names_of_two_bindings_never_collide() -> None:
    """Hosts a.b and a_b both wrote ``dodwan.ledger.a_b.hq``: each could take the other's
    ledger entry for its own and mark a message sent that it never sent. Names that were
    unambiguous keep their form (the ledgers of existing gateways)."""
    from dodwan.bridges import ledger

    for name_of in (ledger.queue_name, ledger.topic_name):
        pairs = [("a.b", "hq"), ("a_b", "hq"), ("a b", "hq"), ("a/b", "hq"), ("a", "b.hq")]
        pairs += [("h" * 64, "n" * 64), ("h" * 64, "n" * 63 + "m"), ("é", "hq"), ("_", "hq")]
        names = [name_of(h, n) for h, n in pairs]
        assert len(set(names)) == len(names), names
        assert name_of("a.b", "hq") == name_of("a.b", "hq")  # stable across restarts
        assert all(len(n) <= 200 for n in names)
    assert ledger.queue_name("gw", "hq") == "dodwan.ledger.gw.hq"
    assert ledger.queue_name("a_b-2", "h.q") == "dodwan.ledger.a_b-2.h.q"
    assert ledger.topic_name("gw", "hq") == "dodwan-ledger/gw/hq"


def test_a_ledger_entry_is_trusted_only_by_its_binding_instance(tmp_path: Path) -> None:
    """The token of a binding instance lives in the outbox from `bridge add` (or the first
    start) to `bridge rm`; a ledger entry names it and the destination, and another
    instance, another destination or a bare id list (earlier versions) names nothing."""
    import dataclasses

    from dodwan.bridges import ledger

    box = Outbox(tmp_path)
    token = box.instance("hq")
    assert box.instance("hq") == token and box.instance("other") != token
    box.close()
    box = Outbox(tmp_path)
    assert box.instance("hq") == token  # kept across restarts
    box.drop_binding("hq")  # bridge rm
    assert box.instance("hq") != token
    box.close()

    base = BindingSpec.from_dict(
        {"uri": "amqp://h/queue/q1", "direction": "out", "name": "hq", "attributes": {"t": "x"}}
    )
    spec = dataclasses.replace(base, instance="t1")
    entry = ledger.encode(spec, ["m1", "m2"])
    assert ledger.decode(spec, entry) == {"m1", "m2"}
    assert ledger.decode(dataclasses.replace(spec), entry) == {"m1", "m2"}  # --replace
    assert ledger.decode(dataclasses.replace(base, instance="t2"), entry) == set()
    moved = dataclasses.replace(spec, uri="amqp://h/queue/q2")
    assert ledger.decode(moved, entry) == set()
    assert ledger.decode(base, ledger.encode(base, ["m1"])) == set()  # no instance
    assert ledger.decode(spec, b'["m1","m2"]') == set()
    assert ledger.decode(spec, b"\xff") == set()
    assert "instance" not in spec.as_dict() and spec == base


def test_stomp_durable_subscriptions_of_two_gateways_never_share_a_name() -> None:
    """Host a-b's binding c and host a's binding b-c were both dodwan-a-b-c. Names with no
    '-' to confuse keep their old form (their durable subscriptions survive the upgrade);
    MQTT's client ids come from the same stem, still importable from mqtt."""
    from dodwan.bridges.stomp import durable_name

    def durable(host: str, name: str, uri: str = "stomp://h/topic/t") -> str | None:
        spec = BindingSpec.from_dict({"uri": uri, "name": name, "direction": "in"})
        return durable_name(spec, host)

    assert durable("a-b", "c") != durable("a", "b-c")
    assert durable("a-b", "c") == durable("a-b", "c")  # stable across restarts
    assert durable("gw", "hq") == "dodwan-gw-hq"  # unambiguous already: unchanged
    long = "n" * 64
    assert durable("h" * 64, long) != durable("h" * 64, long[:-1] + "m")
    assert all(len(durable(h, n) or "") <= 96 for h in ("h" * 64, "a-b") for n in (long, "c"))
    assert durable("gw", "hq", "stomp://h/queue/q") is None  # a queue: no subscription
    from dodwan.bridges import mqtt
    from dodwan.bridges.ids import client_base

    assert mqtt.client_base is client_base


def test_a_stomp_connect_the_broker_never_answers_times_out_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """stomp.py waits for CONNECTED without a deadline: a port that takes the connection
    and stays silent held the binding's thread for ever."""
    import threading

    from dodwan.bridges import stomp as stomp_link
    from dodwan.bridges.binding import LinkError

    monkeypatch.setattr(stomp_link, "CONNECT_TIMEOUT", 1.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    uri = f"stomp://127.0.0.1:{silent.getsockname()[1]}/topic/x"
    spec = BindingSpec.from_dict({"uri": uri, "name": "hq", "direction": "in"})
    link = stomp_link.StompLink(spec, "gw", lambda _m: True)
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            link.connect()
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(15)
    silent.close()
    assert not t.is_alive(), "connect() still waiting for the broker"
    assert isinstance(failed[0], LinkError)
    assert "no CONNECTED frame within 1 s" in str(failed[0])
    link.close()


def test_the_messages_of_a_refused_batch_go_alone_and_the_refused_one_is_held() -> None:
    """Which message of a refused batch the broker refuses is found by sending them one at
    a time; it is then left out (kept in the outbox) and tried again later, ever later."""
    from dodwan.bridges.refusals import RETRY_MIN, Refusals

    r = Refusals()
    assert r.batch([1, 2, 3], [1, 2, 3]) == [1, 2, 3]
    r.refused([1, 2, 3], now=0.0)
    assert r.strikes == 1
    assert r.batch([1, 2, 3], [1, 2, 3]) == [1]  # a suspect goes alone
    r.refused([1], now=0.0)  # refused alone: that is the one
    assert r.withheld(1.0) == [1] and r.strikes == 2
    assert r.batch([2, 3, 4], [2, 3, 4]) == [2]
    r.sent([2])
    assert r.strikes == 0
    assert r.batch([3, 4], [3, 4]) == [3]
    r.sent([3])
    assert r.batch([4, 5], [4, 5]) == [4, 5]  # past the refused batch: batches again
    assert r.withheld(RETRY_MIN + 1) == []  # due: sent alone again
    assert r.batch([1, 4], [1, 4]) == [1]
    r.refused([1], now=RETRY_MIN + 1)
    assert r.held[1] == (3 * RETRY_MIN + 1, 2 * RETRY_MIN)  # twice as long
    assert r.withheld(3 * RETRY_MIN + 2) == []
    assert r.batch([4], [4]) == [4] and r.held == {}  # it expired meanwhile: forgotten


def _cli_examples(text: str) -> list[list[str]]:
    """The ``dodwan ...`` command lines of a Markdown text: shell blocks (with ``\\``
    continuations) and inline code spans; a trailing ``...`` stands for more options."""
    import re
    import shlex

    found: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        found += [
            line for line in block.replace("\\\n", " ").splitlines() if line.startswith("dodwan ")
        ]
    found += re.findall(r"`(dodwan [^`]+)`", text)
    return [[a for a in shlex.split(c)[1:] if a != "..."] for c in found]


def test_the_cli_examples_of_the_bridges_doc_are_valid_commands() -> None:
    """docs/bridges.md said ``dodwan publish --attr ...``: publish's option is --attribute
    (-a); only ``bridge add`` has --attr. Every example must parse as the CLI stands."""
    import warnings

    import click

    from dodwan.cli import cli

    text = (Path(__file__).resolve().parent.parent / "docs" / "bridges.md").read_text()
    examples = _cli_examples(text)
    assert any(args[:2] == ["bridge", "add"] for args in examples)
    assert any(args[:1] == ["publish"] for args in examples)
    for args in examples:
        with warnings.catch_warnings():  # Click 8.2 deprecates protected_args, 9 drops it
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx = cli.make_context("dodwan", list(args))
            cmd: click.Command = cli
            rest = [*ctx.protected_args, *ctx.args]
            while isinstance(cmd, click.Group):
                name, sub, rest = cmd.resolve_command(ctx, rest)
                assert sub is not None, args
                ctx = sub.make_context(name or "", rest, parent=ctx)
                cmd, rest = sub, [*ctx.protected_args, *ctx.args]
        assert not rest, (args, rest)


def test_jmsx_headers_a_stomp_broker_sets_on_delivery_do_not_become_attributes(
    daemons: Callable[..., DaemonProc],
) -> None:
    """A JOMS STOMP gateway as the broker adds JMSXDeliveryCount to each MESSAGE (the
    provider's count, not the message's own): it came in as an attribute of every message.
    A real daemon's gateway (``--stomp``) delivers to a real StompLink here."""
    pytest.importorskip("joms.stomp.server", reason="the JOMS STOMP gateway is not available")
    port = free_port()
    daemons("hq", "--group", random_group(), "--stomp", f"127.0.0.1:{port}")
    uri = f"stomp://127.0.0.1:{port}/queue/orders"
    spec = BindingSpec.from_dict({"uri": uri, "name": "hq", "direction": "in"}, 86400.0)
    got: list[Inbound] = []
    came = threading.Event()

    def on_message(msg: Inbound) -> bool:
        got.append(msg)
        came.set()
        return True

    link = StompLink(spec, "gw", on_message)
    wait_for(lambda: _connected(link), 20, what="the link connected to the JOMS gateway")
    try:
        client = stomp.Connection12([("127.0.0.1", port)], auto_decode=False)
        client.connect(wait=True)
        client.send("/queue/orders", b"order", headers={"prio": "high", "receipt": "r"})
        client.disconnect(receipt="bye")
        assert came.wait(20), "nothing delivered"
    finally:
        link.close()
    assert got[0].body == b"order" and got[0].headers.get("prio") == "high", got[0]
    jmsx = [k for k in got[0].headers if k.startswith("JMSX")]
    assert jmsx == [], f"provider-set headers taken as attributes: {jmsx}"


def _connected(link: StompLink) -> bool:
    try:
        link.connect()
    except LinkError:
        return False
    return True


@pytest.mark.parametrize(
    "failure", [stomp.exception.NotConnectedException(), BrokenPipeError(32, "Broken pipe")]
)
def test_a_stomp_send_failing_before_the_link_hears_of_the_close_is_a_dropped_batch(
    failure: Exception,
) -> None:
    """stomp.py forgets the socket (or the kernel refuses the write) before its receiver
    thread reports the close: a send that failed that way was a mere LinkError, so the
    binding sent the same batch again instead of isolating its messages (CI: a broker that
    closes on one message saw the whole batch twice). It is a Dropped batch once the close
    is heard. (The close is reported 0.3 s later here, as a receiver thread would.)"""
    from dodwan.bridges.binding import Dropped
    from dodwan.bridges.outbox import OutRow

    spec = BindingSpec.from_dict(
        {
            "uri": "stomp://127.0.0.1:1/queue/q",
            "name": "hq",
            "direction": "out",
            "attributes": {"topic": "q"},
        }
    )
    link = StompLink(spec, "gw", lambda _m: True)
    generation = link._generation

    class Closed:
        def begin(self, **_kw: Any) -> None:
            threading.Timer(0.3, link._failed, ("connection closed", generation)).start()
            raise failure

    link.conn = Closed()
    row = OutRow(1, "m1", {"topic": "q"}, b"x", time.time() + 60)
    with pytest.raises(Dropped, match="connection lost while sending 1 message"):
        link.send([row])
