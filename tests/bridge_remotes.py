"""Broker-side clients for the bridge tests: what headquarters runs against each broker.

Each :class:`Remote` subscribes to one destination (surviving broker restarts: MQTT with a
persistent session, STOMP through a queue or a durable topic subscription, AMQP through a
durable queue) and records what it receives; it can also publish with a message id.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
import pika
import pika.exceptions
import stomp
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


@dataclass
class Received:
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def dodwan_id(self) -> str | None:
        return self.headers.get("dodwan-id")


class Remote:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()

    def _add(self, r: Received) -> None:
        with self._lock:
            self.received.append(r)

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def _seen(self, dodwan_id: str | None) -> bool:
        return dodwan_id is not None and dodwan_id in self.dodwan_ids()

    def dodwan_ids(self) -> list[str]:
        return [r.dodwan_id for r in self.snapshot() if r.dodwan_id]

    def publish(self, body: bytes, msg_id: str, headers: dict[str, str]) -> None:
        raise NotImplementedError

    def publish_many(self, items: list[tuple[bytes, str, dict[str, str]]]) -> None:
        """(body, message id, headers) each, persistent, over one connection, confirmed;
        an empty id: none (MQTT, AMQP)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class MqttRemote(Remote):
    def __init__(self, port: int, topic: str) -> None:
        super().__init__()
        self.port = port
        self.topic = topic
        self.subscribed = threading.Event()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"hq-{secrets.token_hex(4)}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.reconnect_delay_set(0.1, 1)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", port, clean_start=False, properties=props)
        self.client.loop_start()
        if not self.subscribed.wait(10):
            raise RuntimeError("MQTT remote did not subscribe")

    def _on_connect(self, c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not reason.is_failure:
            c.subscribe(self.topic, qos=2)

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        props = getattr(msg, "properties", None)
        headers = {str(k): str(v) for k, v in (getattr(props, "UserProperty", None) or [])}
        # Mosquitto hands this consumer again (DUP) what it had not acknowledged when the
        # connection broke: not a second copy at the broker.
        if not (msg.dup and self._seen(headers.get("dodwan-id"))):
            self._add(Received(bytes(msg.payload), headers))

    def publish(self, body: bytes, msg_id: str, headers: dict[str, str], topic: str = "") -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("message-id", msg_id), *headers.items()]
        info = self.client.publish(topic or self.topic.rstrip("#/"), body, qos=2, properties=props)
        info.wait_for_publish(10)

    def publish_many(self, items: list[tuple[bytes, str, dict[str, str]]]) -> None:
        infos = []
        for body, msg_id, headers in items:
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("message-id", msg_id)] if msg_id else []
            props.UserProperty += list(headers.items())
            infos.append(
                self.client.publish(self.topic.rstrip("#/"), body, qos=1, properties=props)
            )
            if len(infos) >= 20:  # within mosquitto's receive maximum
                infos.pop(0).wait_for_publish(30)
        for info in infos:
            info.wait_for_publish(30)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class _StompListener(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, remote: StompRemote) -> None:
        self.remote = remote

    def on_message(self, frame: Any) -> None:
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
        self.remote._add(Received(body, {str(k): str(v) for k, v in frame.headers.items()}))

    def on_receipt(self, frame: Any) -> None:
        self.remote.receipts.add(frame.headers.get("receipt-id", ""))


class StompRemote(Remote):
    """Subscribes to ``destination`` (a topic durably), reconnecting when the broker is back."""

    def __init__(self, port: int, destination: str) -> None:
        super().__init__()
        self.port = port
        self.destination = destination
        self.client_id = f"hq-{secrets.token_hex(4)}"
        self.receipts: set[str] = set()
        self._stop = threading.Event()
        self.conn: Any = None
        self._connect()
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _connect(self) -> None:
        conn = stomp.Connection12([("127.0.0.1", self.port)], auto_decode=False)
        conn.set_listener("hq", _StompListener(self))
        conn.connect(wait=True, headers={"client-id": self.client_id})
        headers = {"receipt": "sub"}
        if self.destination.startswith("/topic/"):
            headers["activemq.subscriptionName"] = self.client_id
        self.receipts.discard("sub")
        conn.subscribe(self.destination, id="hq", ack="auto", headers=headers)
        deadline = time.monotonic() + 10
        while "sub" not in self.receipts:
            if time.monotonic() > deadline:
                raise RuntimeError("STOMP remote did not subscribe")
            time.sleep(0.02)
        self.conn = conn

    def _keep(self) -> None:
        while not self._stop.wait(0.2):
            if self.conn is not None and self.conn.is_connected():
                continue
            with contextlib.suppress(Exception):
                self._connect()

    def publish(self, body: bytes, msg_id: str, headers: dict[str, str]) -> None:
        conn = stomp.Connection12([("127.0.0.1", self.port)], auto_decode=False)
        conn.connect(wait=True)
        conn.send(self.destination, body, headers={"app-msg": msg_id, **headers})
        conn.disconnect(receipt="bye")

    def publish_many(self, items: list[tuple[bytes, str, dict[str, str]]]) -> None:
        conn = stomp.Connection12([("127.0.0.1", self.port)], auto_decode=False)
        conn.connect(wait=True)
        for body, msg_id, headers in items:
            extra = {"app-msg": msg_id, "persistent": "true", **headers}
            conn.send(self.destination, body, headers=extra)
        conn.disconnect(receipt="bye")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.disconnect()


class AmqpRemote(Remote):
    """A durable queue bound to the exchange; a consumer thread reconnecting as needed."""

    def __init__(self, port: int, exchange: str, routing_key: str) -> None:
        super().__init__()
        self.port = port
        self.exchange = exchange
        self.routing_key = routing_key
        self.queue = f"hq-{secrets.token_hex(4)}"
        self._stop = threading.Event()
        conn = self._conn()
        ch = conn.channel()
        ch.exchange_declare(exchange, exchange_type="topic", durable=True)
        ch.queue_declare(self.queue, durable=True)
        ch.queue_bind(self.queue, exchange, routing_key=routing_key)
        conn.close()
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()

    def _conn(self) -> Any:
        return pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", self.port, connection_attempts=1, heartbeat=30)
        )

    def _consume(self) -> None:
        while not self._stop.is_set():
            try:
                conn = self._conn()
                ch = conn.channel()
                for method, props, body in ch.consume(self.queue, inactivity_timeout=0.2):
                    if self._stop.is_set():
                        break
                    if method is None:
                        continue
                    headers = {str(k): str(v) for k, v in (props.headers or {}).items()}
                    if props.message_id:
                        headers.setdefault("message_id", props.message_id)
                    # RabbitMQ hands this consumer again what it had not acknowledged when
                    # the connection broke (flagged): not a second copy at the broker.
                    if not (method.redelivered and self._seen(headers.get("dodwan-id"))):
                        self._add(Received(bytes(body), headers))
                    ch.basic_ack(method.delivery_tag)
                with contextlib.suppress(Exception):
                    conn.close()
            except (pika.exceptions.AMQPError, OSError):
                self._stop.wait(0.2)

    def publish(self, body: bytes, msg_id: str, headers: dict[str, str]) -> None:
        conn = self._conn()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish(
            self.exchange,
            self.routing_key,
            body,
            properties=pika.BasicProperties(message_id=msg_id, delivery_mode=2, headers=headers),
        )
        conn.close()

    def publish_many(self, items: list[tuple[bytes, str, dict[str, str]]]) -> None:
        conn = self._conn()
        ch = conn.channel()
        ch.confirm_delivery()
        for body, msg_id, headers in items:
            props = pika.BasicProperties(
                message_id=msg_id or None, delivery_mode=2, headers=headers
            )
            ch.basic_publish(self.exchange, self.routing_key, body, properties=props)
        conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
