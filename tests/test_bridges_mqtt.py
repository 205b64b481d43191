"""MQTT bindings against a real Mosquitto where the broker's answers matter: access control
(refused publications), retained messages, client ids of two gateways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from brokers import Broker
from brokers import mosquitto as mosquitto
from brokers import mosquitto_acl as mosquitto_acl
from test_bridges import ARGS, binding, publish, topic_name
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons


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
