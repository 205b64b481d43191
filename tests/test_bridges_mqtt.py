"""MQTT bindings against a real Mosquitto where the broker's answers matter: access control
(refused publications), retained messages, client ids of two gateways, the persistent
session a binding removed and added again finds."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
import pytest
from bridge_remotes import MqttRemote
from brokers import Broker
from brokers import mosquitto as mosquitto
from brokers import mosquitto_acl as mosquitto_acl
from cut_proxy import CutProxy
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from test_bridges import ARGS, add_binding, binding, exactly_once, publish, topic_name
from test_bridges import remotes as remotes
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.bridges.binding import LinkError
from dodwan.bridges.mqtt import MqttLink
from dodwan.bridges.uri import BindingSpec
from dodwan.daemon.client import ClientError


@pytest.mark.parametrize("qos", [1, 2])
def test_a_publication_the_broker_refuses_stays_in_the_outbox_and_is_reported(
    qos: int, mosquitto_acl: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """Mosquitto answers a publication alice may not make with PUBACK (QoS 1) or PUBREC
    (QoS 2) 'Not authorized' (0x87): not sent, not lost, and said so."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    topic = topic_name()
    port = mosquitto_acl.port
    gw.client().post(
        "/bridges",
        {
            "uri": f"mqtt://alice:secret@127.0.0.1:{port}/denied/{topic}",
            "name": "hq",
            "direction": "out",
            "attributes": {"topic": topic},
            "qos": qos,
        },
    )
    wait_for(lambda: binding(gw, "hq")["connects"], 30, what="binding connected")
    publish(gw, topic, 1)
    st: dict[str, Any] = wait_for(
        lambda: ((b := binding(gw, "hq"))["errors"] or b["sent_total"]) and b,
        30,
        what="the refusal reported",
    )
    assert "Not authorized" in st["last_error"], st
    assert st["sent_total"] == 0 and st["backlog"] == 1, st
    # held back, as the other bridges do, and tried again later, not at every reconnection
    # (earlier, about five times a second)
    held = wait_for(lambda: (b := binding(gw, "hq"))["refused"] and b, 30, what="held back")
    assert held["sent_total"] == 0 and held["backlog"] == 1, held


def _publish_plain(port: int, topic: str, body: bytes, retain: bool = False, qos: int = 1) -> None:
    """Publish as a plain MQTT client would: no message-id user property."""
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish(topic, body, qos=qos, retain=retain).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def test_a_retained_message_is_imported_once(
    mosquitto: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """The broker sends a topic's retained message to every new subscription; the binding
    subscribes at each connection (two at start-up: the receive maximum's reconnection),
    and used to publish it in DoDWAN again each time, under a new id."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    topic = topic_name()
    port = mosquitto.port
    _publish_plain(port, f"{topic}/state", b"retained", retain=True)
    body = {"uri": mosquitto.url(f"{topic}/#"), "name": "hq", "direction": "in"}
    gw.client().post("/bridges", body)

    def received_after_sentinel(n: int) -> int:
        # The session delivers in order: after the sentinel, any copy came before it.
        _publish_plain(port, f"{topic}/live", f"sentinel {n}".encode())
        st = wait_for(
            lambda: (b := binding(gw, "hq"))["received_total"] >= n and b, 30, what="sentinel"
        )
        return int(st["received_total"])

    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    assert received_after_sentinel(2) == 2  # the retained message and the sentinel
    gw.client().post("/bridges", {**body, "ttl": 7200, "replace": True})  # a new connection
    wait_for(lambda: binding(gw, "hq")["ttl"] == 7200, 30, what="replaced")
    assert received_after_sentinel(3) == 3
    # Retain handling 1 keeps the broker from sending it again, except when the session
    # moves to a new connection while the old still holds it: then that copy is recognised
    # by its content and counted, not imported (the totals above). The session moved twice:
    # the start-up's second connection and the replacement (one copy each seen under load).
    assert binding(gw, "hq")["duplicates"] <= 2


@pytest.mark.parametrize("to", ["the same topic", "another topic"])
def test_echoes_of_a_removed_binding_do_not_mark_the_new_one_s_messages_sent(
    to: str, mosquitto: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """`bridge rm hq` while the echoes of what hq sent still wait in its inbound session
    (the gateway had not taken them in yet), then `bridge add ... --name hq`: the new
    binding takes the same session over (same client id) and gets those echoes, which
    carry the same `dodwan-gateway` HOST/NAME. They marked the new binding's messages sent
    though it never sent them: none of those 5 reached another topic (lost), nor went
    again to the same one (where a binding added again sends the cached messages again)."""
    topic = topic_name()
    port = mosquitto.port
    hq1 = remotes(lambda: MqttRemote(port, f"{topic}a/#"))
    hq2 = remotes(lambda: MqttRemote(port, f"{topic}b/#")) if to == "another topic" else hq1
    proxy = CutProxy(port)
    try:
        gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
        add_binding(gw, f"mqtt://127.0.0.1:{proxy.port}/{topic}a/#", "hq", topic, direction="out")
        # Its echo has come back: the binding read its ledger and serves its inbound session.
        cached = publish(gw, topic, 1)
        wait_for(lambda: binding(gw, "hq")["echoes"] == 1, 30, what="the first echo")
        assert proxy.hold(b"dodwan-gw-hq-in") == 1  # later echoes wait at the broker
        cached += publish(gw, topic, 5, start=1)
        exactly_once(hq1, cached, gw=gw)
        st = wait_for(lambda: (b := binding(gw, "hq"))["sent_total"] == 6 and b, 10, what="6")
        assert st["echoes"] == 1, st
        assert gw.client().delete("/bridges/hq")["unsent_dropped"] == 0
        again = f"{topic}b/#" if to == "another topic" else f"{topic}a/#"
        add_binding(gw, mosquitto.url(again), "hq", topic, direction="out")
        # A sentinel behind the cached messages: whatever is sent goes before it.
        sentinel = publish(gw, topic, 1, start=99)
        want = sorted(cached * (2 if hq2 is hq1 else 1) + sentinel)

        def arrived() -> str:
            return f"{len(hq2.dodwan_ids())} of {len(want)}; gateway: {binding(gw, 'hq')}"

        wait_for(lambda: sentinel[0] in hq2.dodwan_ids(), 30, what=arrived)
        assert sorted(hq2.dodwan_ids()) == want, arrived()
        st = wait_for(lambda: (b := binding(gw, "hq"))["backlog"] == 0 and b, 10, what="sent")
        assert st["sent_total"] == 7 and st["settled"] == 0, st
        assert sorted(hq1.dodwan_ids()) == (want if hq2 is hq1 else sorted(cached))
    finally:
        proxy.close()


def test_an_echo_on_the_removed_binding_s_topic_does_not_count_for_the_new_one(
    mosquitto: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """The persistent session keeps the removed binding's subscription (MQTT cannot list a
    session's subscriptions to drop it): after `bridge rm hq` and `bridge add` of hq to
    another topic, another gateway's message on the old topic still came in, and was taken
    as an echo of the new destination: the new binding never sent that message there."""
    topic = topic_name()
    port = mosquitto.port
    hq1 = remotes(lambda: MqttRemote(port, f"{topic}a/#"))
    hq2 = remotes(lambda: MqttRemote(port, f"{topic}b/#"))
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    add_binding(gw, mosquitto.url(f"{topic}a/#"), "hq", topic, direction="out")
    cached = publish(gw, topic, 3)
    exactly_once(hq1, cached, gw=gw)
    assert gw.client().delete("/bridges/hq")["unsent_dropped"] == 0
    # The cached messages wait 8 s: meanwhile another gateway sends one of them to the
    # old topic.
    add_binding(gw, mosquitto.url(f"{topic}b/#"), "hq", topic, direction="out", holdoff=8.0)
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    hq1.publish(b"report 0", "m0", {"dodwan-id": cached[0], "dodwan-gateway": "gw2/hq"})
    wait_for(lambda: binding(gw, "hq")["echoes"] >= 1, 10, what="the other gateway's echo")
    exactly_once(hq2, cached, timeout=30, gw=gw)


def _upgraded_with_an_invalid_binding(
    daemons: Callable[..., DaemonProc],
) -> tuple[DaemonProc, str, list[str]]:
    """A gateway whose binding 'lead' (3 unsent messages) was stored by an older version
    with a URI this one refuses, restarted."""
    topic = topic_name()
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    add_binding(gw, "mqtt://127.0.0.1:1/placeholder", "lead", topic, direction="out")
    ids = publish(gw, topic, 3)
    wait_for(lambda: binding(gw, "lead")["backlog"] == 3, 30, what="3 in the outbox")
    assert gw.kill(signal.SIGTERM) == 0
    db = sqlite3.connect(gw.state_dir / "bridges.db")
    with db:
        (spec,) = db.execute("SELECT spec FROM bindings WHERE name = 'lead'").fetchone()
        old = {**json.loads(spec), "uri": "mqtt://bob:s3cret@127.0.0.1:1//lead"}
        db.execute("UPDATE bindings SET spec = ? WHERE name = 'lead'", (json.dumps(old),))
    db.close()
    gw.start()
    return gw, topic, ids


def test_a_stored_binding_a_newer_version_refuses_is_kept_with_its_outbox(
    mosquitto: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """An older version accepted `mqtt://HOST:PORT//lead` (an empty first topic level),
    which this one refuses. At the upgrade, the stored binding was deleted with its unsent
    messages (its spec gone, the operator left to guess it). It is now kept, shown as
    invalid with the reason, and can be replaced (its outbox goes out) or removed."""
    gw, topic, ids = _upgraded_with_an_invalid_binding(daemons)
    st = binding(gw, "lead")
    assert st["state"] == "invalid" and "empty first level" in st["last_error"], st
    assert st["backlog"] == 3 and not st["connected"], st
    assert "s3cret" not in json.dumps(gw.client().get("/bridges"))
    metrics = gw.client().request("GET", "/metrics")
    assert 'dodwan_bridge_backlog{binding="lead"} 3' in metrics, metrics
    with pytest.raises(ClientError, match="use replace to change it"):  # not by accident
        add_binding(gw, mosquitto.url(topic), "lead", topic, direction="out")
    hq = remotes(lambda: MqttRemote(mosquitto.port, f"{topic}/#"))
    fixed = add_binding(
        gw, mosquitto.url(f"{topic}/x"), "lead", topic, direction="out", replace=True
    )
    assert fixed.get("state") != "invalid" and fixed["backlog"] <= 3, fixed
    exactly_once(hq, ids, gw=gw)
    assert binding(gw, "lead")["backlog"] == 0


def test_a_stored_binding_a_newer_version_refuses_can_be_removed(
    daemons: Callable[..., DaemonProc],
) -> None:
    gw, _topic, _ids = _upgraded_with_an_invalid_binding(daemons)
    assert gw.client().delete("/bridges/lead") == {"removed": "lead", "unsent_dropped": 3}
    assert gw.client().get("/bridges") == []
    assert gw.kill(signal.SIGTERM) == 0
    gw.start()
    assert gw.client().get("/bridges") == []  # gone for good, as asked


def test_a_replacement_waits_for_the_old_binding_s_connection_in_flight(
    mosquitto: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """A replacement asked for while the binding's connection is under way (just added, or
    started again after a ``bridge rm`` the disk refused) let that connection go on: when it
    reached the broker, it took the new binding's MQTT session over (same client id), and the
    replacement failed with 502 'did not connect (... closed by the broker ...)' or lost its
    connection at once. Now it waits for that attempt, then takes over from it."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    topic = topic_name()
    proxy = CutProxy(mosquitto.port)
    try:
        proxy.stall()  # the first binding's connection attempt takes long
        body = {"uri": f"mqtt://127.0.0.1:{proxy.port}/{topic}", "name": "hq", "direction": "in"}
        gw.client().post("/bridges", body)
        assert proxy.stalled.acquire(timeout=30), "the binding never tried to connect"
        # Replaced by a direct connection while that attempt is in flight; the attempt
        # reaches the broker a moment later (the old code had connected the new one by then).
        threading.Timer(1.5, proxy.release).start()
        gw.client().post("/bridges", {**body, "uri": mosquitto.url(topic), "replace": True})
        st = wait_for(lambda: (b := binding(gw, "hq"))["connected"] and b, 30, what="connected")
        assert st["uri"] == mosquitto.url(topic), st
        _publish_plain(mosquitto.port, topic, b"after")
        st = wait_for(lambda: (b := binding(gw, "hq"))["received_total"] and b, 30, what="received")
        assert st["connects"] == 1 and st["errors"] == 0, st  # never taken over
    finally:
        proxy.release()
        proxy.close()


def _fill_cache(gw: DaemonProc) -> list[str]:
    """Publish the gateway's own messages until its cache takes none, not even an empty one;
    returns their ids."""
    c = gw.client()
    ids: list[str] = []
    for size in (60000, 5000, 500, 20, 0):
        while True:
            assert len(ids) < 200, "the cache never filled"
            try:
                reply = c.publish_bytes(os.urandom(size), attributes={"topic": "filler"}, ttl=600)
            except ClientError as exc:
                assert "does not fit in the cache" in str(exc), exc
                break
            ids.append(reply["id"])
    return ids


def _follow(gw: DaemonProc, topic: str) -> list[str]:
    """The texts of the messages of ``topic`` the gateway publishes, in their order (a
    thread reads the stream until the daemon stops)."""
    texts: list[str] = []
    stream = gw.client().stream("/follow", {"patterns": [{"topic": topic}], "key": "watch"})
    assert next(stream) == {"subscribed": "watch"}

    def read() -> None:
        with contextlib.suppress(ClientError):
            for item in stream:
                texts.append(item["text"])

    threading.Thread(target=read, daemon=True).start()
    return texts


@pytest.mark.parametrize("qos", [1, 2])
def test_incoming_messages_the_full_cache_refused_come_again_in_order(
    qos: int, mosquitto: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """docs/bridges.md promises that an incoming message the daemon cannot take yet (its
    cache full) stays unacknowledged and is delivered again. With QoS 2, paho answered
    PUBREC before the gateway saw the message: A1-A3 were lost for good. With QoS 1 they
    came again only after a reconnection, which a healthy link never made, and B, taken
    once there was room, overtook them."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", "--cache-capacity", "400000")
    topic = topic_name()
    body = {
        "uri": mosquitto.url(f"{topic}/#"),
        "name": "hq",
        "direction": "in",
        "attributes": {"topic": topic},
        "qos": qos,
    }
    gw.client().post("/bridges", body)
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    texts = _follow(gw, topic)
    fillers = _fill_cache(gw)
    for text in ("A1", "A2", "A3"):
        _publish_plain(mosquitto.port, f"{topic}/x", text.encode(), qos=qos)
    st = wait_for(lambda: (b := binding(gw, "hq"))["errors"] and b, 30, what="a refusal")
    assert "CacheFullError" in st["last_error"] and st["received_total"] == 0, st
    for msg_id in fillers:  # room again
        gw.client().delete(f"/cache/{msg_id}")
    _publish_plain(mosquitto.port, f"{topic}/x", b"B", qos=qos)
    wait_for(
        lambda: len(texts) >= 4,
        30,
        what=lambda: f"4 messages in DoDWAN, got {texts}; gateway: {binding(gw, 'hq')}",
    )
    assert texts == ["A1", "A2", "A3", "B"]
    assert binding(gw, "hq")["received_total"] == 4


def test_an_incoming_qos0_message_the_full_cache_refused_is_dropped_and_said_so(
    mosquitto: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """MQTT cannot deliver a QoS 0 message again: refused, it is lost; it used to go with
    no more than the error count, now the log says it was dropped and why."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", "--cache-capacity", "400000")
    topic = topic_name()
    body = {"uri": mosquitto.url(f"{topic}/#"), "name": "hq", "direction": "in"}
    gw.client().post("/bridges", {**body, "attributes": {"topic": topic}})
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    texts = _follow(gw, topic)
    fillers = _fill_cache(gw)
    _publish_plain(mosquitto.port, f"{topic}/x", b"A", qos=0)
    wait_for(
        lambda: f"a QoS 0 message on '{topic}/x' was not taken" in gw.log.read_text(),
        30,
        what="the drop logged",
    )
    st = binding(gw, "hq")
    assert st["errors"] == 1 and "CacheFullError" in st["last_error"], st
    for msg_id in fillers:
        gw.client().delete(f"/cache/{msg_id}")
    _publish_plain(mosquitto.port, f"{topic}/x", b"B")  # a sentinel: A would come before
    wait_for(lambda: texts, 30, what="B in DoDWAN")
    assert texts == ["B"]


def test_an_echo_from_a_deeper_topic_does_not_count_for_the_binding_s_own(
    mosquitto: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """Bindings b1 on TOPIC/# (both ways, sending to TOPIC) and b2 on TOPIC/sub (out) of one
    gateway select the same messages. b2's message came back to b1 through TOPIC/# and was
    taken as one already on TOPIC: b1 never sent it there (lost, no error)."""
    topic = topic_name()
    port = mosquitto.port
    top = remotes(lambda: MqttRemote(port, topic))
    sub = remotes(lambda: MqttRemote(port, f"{topic}/sub"))
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    # b1 holds its messages back 3 s: b2's echo reaches it before it sends.
    add_binding(gw, mosquitto.url(f"{topic}/#"), "b1", topic, holdoff=3.0)
    add_binding(gw, mosquitto.url(f"{topic}/sub"), "b2", topic, direction="out")
    wait_for(
        lambda: binding(gw, "b1")["connected"] and binding(gw, "b2")["connected"],
        30,
        what="b1 and b2 connected",
    )
    ids = publish(gw, topic, 1)
    exactly_once(sub, ids, timeout=30, gw=gw)
    wait_for(lambda: binding(gw, "b1")["echoes"], 10, what="b2's message seen by b1")
    exactly_once(top, ids, timeout=30, gw=gw)
    st = wait_for(lambda: (b := binding(gw, "b1"))["backlog"] == 0 and b, 10, what="sent")
    assert st["sent_total"] == 1 and st["errors"] == 0, st


def test_a_topic_ending_in_a_slash_is_the_topic_messages_go_to(
    mosquitto: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """Only a last level '#' is left out of the topic an outbound binding sends to:
    TOPIC/ sent to TOPIC, and TOPICb//# to TOPICb (both other topics)."""
    topic = topic_name()
    port = mosquitto.port
    slash = remotes(lambda: MqttRemote(port, f"{topic}/"))
    empty = remotes(lambda: MqttRemote(port, f"{topic}b/"))
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    add_binding(gw, mosquitto.url(f"{topic}/"), "slash", f"{topic}1", direction="out")
    add_binding(gw, mosquitto.url(f"{topic}b//#"), "empty", f"{topic}2", direction="out")
    exactly_once(slash, publish(gw, f"{topic}1", 1), timeout=30, gw=gw)
    exactly_once(empty, publish(gw, f"{topic}2", 1), timeout=30, gw=gw)


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        pytest.param("L" * 70000, "topic is 70000 bytes long", id="long"),
        pytest.param("c%01d", "topic holds U+0001", id="control"),
        # earlier bridged as 'u\ufffdv', without a word
        pytest.param("u%FFv", "path is not valid UTF-8 once percent-decoded (%FF)", id="utf8"),
        pytest.param("a\ud800", "lone surrogate", id="surrogate"),
    ],
)
def test_an_mqtt_topic_that_cannot_cross_is_refused_at_bridge_add(
    topic: str, reason: str, mosquitto: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """Such a binding was added, then failed for ever: a traceback in paho's thread and
    'MQTT connection timed out' (the long topic, the lone surrogate), 'MQTT connection
    refused: Malformed packet' (the control character); or bridged another topic than the
    one given ('%FF' taken as U+FFFD)."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    body = {"uri": mosquitto.url(topic), "name": "hq", "direction": "in"}
    with pytest.raises(ClientError, match=re.escape(reason)):
        gw.client().post("/bridges", body)
    assert gw.client().get("/bridges") == []


def test_an_exception_in_paho_s_thread_is_the_link_s_error(
    mosquitto: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic paho will not subscribe (over 65535 bytes: refused by parse_uri now, given
    here behind its back) raised ValueError in paho's thread: its traceback went to the
    daemon log, the thread ended, and the link said 'MQTT connection timed out', for ever.
    An exception in paho's thread is now the link's error, said at once."""
    spec = BindingSpec.from_dict(
        {"uri": mosquitto.url(topic_name()), "name": "hq", "direction": "in"}
    )
    too_long = dataclasses.replace(spec.endpoint, destination="L" * 70000)
    object.__setattr__(spec, "endpoint", too_long)
    uncaught: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    link = MqttLink(spec, "gw", lambda _msg: True)
    try:
        with pytest.raises(LinkError, match="MQTT client error: ValueError"):
            link.connect()
    finally:
        link.close()
    assert uncaught == []


def test_a_name_made_from_the_uri_is_told_apart_from_another_uri_s(
    mosquitto: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """`bridge add mqtt://HOST/T/x/y` and `bridge add mqtt://HOST/T/x-y`, no --name: both
    names are made 'mqtt-T-x-y', and the second was refused with "binding 'mqtt-T-x-y'
    exists; use replace to change it", a name the user never gave."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    c = gw.client()
    topic = topic_name()
    base = f"mqtt-{topic}-x-y"
    slash, dash = mosquitto.url(f"{topic}/x/y"), mosquitto.url(f"{topic}/x-y")
    assert c.post("/bridges", {"uri": slash, "direction": "in"})["name"] == base
    with_user = dash.replace("mqtt://", "mqtt://u:p@")
    second = c.post("/bridges", {"uri": with_user, "direction": "in"})
    assert second["name"].startswith(f"{base}-") and second["uri"] == dash, second
    # The same URI again (credentials aside) is that binding: the answer says how to add
    # another one, and replace replaces it.
    for uri, name in ((slash, base), (dash, second["name"])):
        with pytest.raises(ClientError, match=rf"'{name}' exists \(a name made from the URI"):
            c.post("/bridges", {"uri": uri, "direction": "in"})
    again = c.post("/bridges", {"uri": dash, "direction": "in", "ttl": 60, "replace": True})
    assert again["name"] == second["name"] and again["ttl"] == 60, again
    assert sorted(b["name"] for b in c.get("/bridges")) == sorted([base, second["name"]])
    # A name given is the user's: refused as before.
    with pytest.raises(ClientError, match=rf"^binding '{base}' exists; use replace"):
        c.post("/bridges", {"uri": mosquitto.url(topic), "direction": "in", "name": base})
