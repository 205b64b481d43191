"""MQTT 5 links (paho-mqtt): ``mqtt://HOST:PORT/TOPIC/#``.

Two client connections per binding, each with its own session:

* outbound: QoS 1 by default (QoS 2 with ``qos = 2``), a fresh clean session at every
  connection. MQTT has no transaction to write a ledger in, so the binding's own
  subscription is its ledger: the inbound connection (a persistent session) also
  subscribes to the outbound topic, and every message this binding sends carries
  ``dodwan-gateway`` = HOST/NAME and ``dodwan-instance`` = the binding instance's token
  (only this instance's echoes count as sent: the session outlives ``bridge rm``, and a
  binding of the same name added again takes it over). After a reconnection, the binding publishes a probe on
  its private topic ``dodwan-ledger/HOST/NAME`` and waits for it to come back: the broker
  delivers a session's messages in order, so by then every message it took before the
  link broke has come back too, and is marked sent. Only the others are sent again (by
  the outbox, not by paho's session, which would resend blindly). The price: the binding
  receives what it sends;
* inbound: a persistent session (fixed client id, clean start off, long session expiry),
  so what the broker gets for the binding's topic while the gateway is away waits there;
  messages are acknowledged manually, after their DoDWAN publication is committed (QoS 2:
  PUBREC goes only then, see :class:`_Paho`). One the daemon cannot take yet (its cache
  full) is left unacknowledged, and so is every later one (but echoes, see below): MQTT
  delivers them again, in order, only on a new connection, which the link makes after a
  back-off (:data:`REDELIVER_MIN`). A replacing binding takes this session over (MQTT's own
  make-before-break).

Application attributes travel as MQTT 5 user properties; the deadline as the message expiry
interval; ``jms_correlation_id`` as correlation data.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MessageState, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from . import ledger
from .binding import InboundHandler, LinkError, Refused
from .ids import client_base as client_base  # importable here, as before
from .mapping import GATEWAY_HEADER, INSTANCE_HEADER, Inbound, deadline_of, user_properties
from .outbox import OutRow
from .uri import BindingSpec

log = logging.getLogger("dodwan.bridges")

CONNECT_TIMEOUT = 10.0
CONFIRM_TIMEOUT = 30.0
SESSION_EXPIRY = 7 * 24 * 3600
MAX_INFLIGHT = 64
"""Most QoS 1/2 messages awaiting the broker's answer (less if the broker says so)."""
REDELIVER_MIN = 1.0
REDELIVER_MAX = 30.0
"""Seconds after the daemon refused an incoming message for now (a full cache) before the
inbound connection is made again, so that the broker delivers it again (MQTT resends what
was not acknowledged only on a new connection); doubled while the refusals go on."""


def _confirmed(info: Any, timeout: float) -> bool:
    """Whether paho got the broker's PUBACK/PUBCOMP for ``info``, waiting up to ``timeout``.

    (paho's own ``wait_for_publish`` raises for a message queued while disconnected, which
    paho nevertheless sends after the reconnect; its condition and flag tell the truth.)
    """
    with info._condition:
        if not info._published:
            info._condition.wait(timeout)
        return bool(info._published)


class _Paho(paho.Client):
    """paho's client, but a PUBREC with a failure reason code ends the QoS 2 exchange as
    MQTT 5 says (paho ignores the code, sends PUBREL, and reports the PUBCOMP's success);
    and with manual acknowledgement, an incoming QoS 2 message is handed over at its
    PUBLISH and answered with PUBREC only by :meth:`ack`. (paho sends PUBREC at once and
    hands the message over at PUBREL: after PUBREC the broker only sends PUBREL again, so a
    message the application could not take yet was lost.)"""

    def _handle_publish(self) -> MQTTErrorCode:
        header = self._in_packet["command"]
        if not self._manual_ack or (header & 0x06) >> 1 != 2:
            return super()._handle_publish()
        packet = bytes(self._in_packet["packet"])
        (length,) = struct.unpack("!H", packet[:2])
        topic = packet[2 : 2 + length]
        (mid,) = struct.unpack("!H", packet[2 + length : 4 + length])
        rest = packet[4 + length :]
        with self._in_message_mutex:
            taken = mid in self._in_messages
        if taken:  # answered with PUBREC already: the same message again, not delivered
            return self._send_pubrec(mid)
        message = paho.MQTTMessage(mid, topic)
        message.dup = bool(header & 0x08)
        message.qos = 2
        message.retain = bool(header & 0x01)
        if self._protocol == paho.MQTTv5:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            _, used = props.unpack(rest)  # type: ignore[no-untyped-call]
            message.properties = props
            rest = rest[used:]
        message.payload = rest
        message.timestamp = time.monotonic()
        self._handle_on_message(message)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def ack(self, mid: int, qos: int) -> MQTTErrorCode:
        if qos != 2 or not self._manual_ack:
            return super().ack(mid, qos)
        taken = paho.MQTTMessage(mid)
        taken.qos = 2
        taken.state = MessageState.MQTT_MS_WAIT_FOR_PUBREL
        with self._in_message_mutex:  # kept across a reconnection, as paho keeps its own
            self._in_messages[mid] = taken
        return self._send_pubrec(mid)

    def _handle_pubrel(self) -> MQTTErrorCode:
        if not self._manual_ack:
            return super()._handle_pubrel()
        (mid,) = struct.unpack("!H", bytes(self._in_packet["packet"][:2]))
        with self._in_message_mutex:  # handed over at its PUBLISH already
            self._in_messages.pop(mid, None)
        return self._send_pubcomp(mid)

    failed: Callable[[BaseException], None] | None = None
    """Told when paho's network thread ends with an exception (set by :class:`_Client`)."""

    def _thread_main(self) -> None:
        # Whatever ends paho's thread is the link's error, not a traceback in the daemon log.
        try:
            super()._thread_main()
        except Exception as exc:
            if self.failed is not None:
                self.failed(exc)

    def _handle_pubrec(self) -> MQTTErrorCode:
        packet = self._in_packet["packet"]
        if self._protocol == paho.MQTTv5 and len(packet) > 2 and packet[2] >= 0x80:
            (mid,) = struct.unpack("!H", packet[:2])
            with self._out_message_mutex:
                if mid in self._out_messages:
                    reason = ReasonCode(PacketTypes.PUBREC, identifier=packet[2])
                    return self._do_on_publish(mid, reason, Properties(PacketTypes.PUBREC))  # type: ignore[no-untyped-call]
        return super()._handle_pubrec()


class _Client:
    """One paho client driven by its own network thread; connection state as events."""

    def __init__(self, client_id: str, clean_start: Any, spec: BindingSpec) -> None:
        self.spec = spec
        self.client_id = client_id
        self.up = threading.Event()
        self.lost = threading.Event()
        self.down = threading.Event()
        self.refused = ""
        self.failure = ""
        """A refusal that is not the connection's (a subscription): the whole message."""
        self.rejected: dict[int, str] = {}
        """mid -> the failure reason code of the PUBACK/PUBREC that answered it."""
        self.client = _Paho(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            reconnect_on_failure=False,
            manual_ack=True,
        )
        ep = spec.endpoint
        if ep.user:
            self.client.username_pw_set(ep.user, ep.password)
        self.inflight = MAX_INFLIGHT
        self.lowered = False
        self.client.max_queued_messages_set(0)
        self.client.failed = self.fail
        self.client.on_connect = self.guarded(self._on_connect)
        self.client.on_disconnect = self.guarded(self._on_disconnect)
        self.client.on_publish = self.guarded(self._on_publish)
        self._clean_start = clean_start
        self._started = False

    def fail(self, exc: BaseException) -> None:
        """An exception in paho's thread: the connection is lost, with it as the reason."""
        self.failure = self.failure or f"MQTT client error: {type(exc).__name__}: {exc}"
        self.lost.set()

    def guarded(self, callback: Callable[..., None]) -> Callable[..., None]:
        """``callback`` for paho: an exception it raises is the link's error (:meth:`fail`);
        paho would print it with its traceback in the daemon log and end its thread."""

        def run(*args: Any) -> None:
            try:
                callback(*args)
            except Exception as exc:
                self.fail(exc)

        return run

    def _on_connect(self, _c: Any, _u: Any, _flags: Any, reason: Any, props: Any) -> None:
        if self.accept(reason, props):
            self.up.set()

    def accept(self, reason: Any, props: Any) -> bool:
        """Whether the CONNACK gives a connection to use (else ``lost`` is set)."""
        # The broker says how many QoS 1/2 messages may await its answer (mosquitto: 20);
        # paho does not enforce it, and messages beyond it are lost.
        # So a lower limit than ours means: reconnect with that limit.
        receive_max = int(getattr(props, "ReceiveMaximum", None) or MAX_INFLIGHT)
        if not reason.is_failure and receive_max < self.inflight:
            self.inflight = receive_max
            self.lowered = True
            self.lost.set()
            return False
        if reason.is_failure:
            self.refused = str(reason)
            self.lost.set()
            return False
        return True

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _props: Any) -> None:
        # Called before paho marks the message published: the code is there by then.
        if reason.is_failure:
            self.rejected[mid] = str(reason)

    def _on_disconnect(self, _c: Any, _u: Any, flags: Any, reason: Any, _props: Any) -> None:
        self.down.set()
        self.up.clear()
        self.lost.set()
        if getattr(reason, "value", None) == 0x8E:  # MQTT 5 "session taken over"
            text = f"session taken over by another connection with client id {self.client_id}"
        elif reason.is_failure and not getattr(flags, "is_disconnect_packet_from_server", True):
            # No DISCONNECT: paho says "Unspecified error". Mosquitto 2.0 closes a
            # connection this way when another one takes its client id over, too.
            text = "closed by the broker or the network"
        else:
            text = str(reason)
        self.refused = self.refused or text

    def connect(self) -> None:
        if self._connect_once():
            self.drop()
            self._connect_once()  # again, within the broker's receive maximum

    def drop(self) -> None:
        """Disconnect and wait until paho has closed the socket (the session stays)."""
        self.down.clear()
        with contextlib.suppress(Exception):
            self.client.disconnect()
        self.down.wait(5.0)

    def _connect_once(self) -> bool:
        """Connect; True when the broker's receive maximum asks for another try."""
        self.up.clear()
        self.lost.clear()
        self.refused = ""
        self.failure = ""
        self.lowered = False
        ep = self.spec.endpoint
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = SESSION_EXPIRY
        try:
            if self.client.max_inflight_messages != self.inflight:  # only when closed
                self.client.max_inflight_messages_set(self.inflight)
            if not self._started:
                self.client.connect(
                    ep.host, ep.port, keepalive=15, clean_start=self._clean_start, properties=props
                )
                self.client.loop_start()
                self._started = True
            else:  # the same client: paho resends what the broker has not confirmed
                self.client.loop_stop()
                self.client.reconnect()
                self.client.loop_start()
        except (OSError, RuntimeError) as exc:
            raise LinkError(f"cannot connect to {ep.host}:{ep.port}: {exc}") from None
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while not self.up.is_set():
            if self.lowered:
                return True
            if self.lost.is_set():
                raise LinkError(
                    self.failure or f"MQTT connection refused: {self.refused or 'closed'}"
                )
            if time.monotonic() > deadline:
                raise LinkError("MQTT connection timed out")
            self.up.wait(0.05)
        return False

    def check(self) -> None:
        if self.lost.is_set() or not self.up.is_set():
            raise LinkError(self.failure or f"MQTT connection lost: {self.refused or 'closed'}")

    def close(self) -> None:
        try:
            if self.up.is_set():
                self.client.disconnect()
            if self._started:
                self.client.loop_stop()
        except Exception:
            pass


class MqttLink:
    def __init__(self, spec: BindingSpec, host_id: str, on_message: InboundHandler) -> None:
        self.spec = spec
        self.on_message = on_message
        self._base = client_base(host_id, spec.name)
        self.gateway = f"{host_id}/{spec.name}"
        self.marks = [(GATEWAY_HEADER, self.gateway), (INSTANCE_HEADER, spec.instance)]
        """The user properties that make a message's echo this binding instance's own."""
        self.ledger_topic = ledger.topic_name(host_id, spec.name)
        self.out: _Client | None = None
        self._probe = threading.Event()
        self._nonces: set[bytes] = set()
        self._held = 0
        """Messages of the current inbound connection left unacknowledged: the first one
        the daemon refused for now, and every one after it (but echoes and QoS 0)."""
        self._again_at = 0.0
        """When the inbound connection is made again for the broker to resend them."""
        self._again_wait = REDELIVER_MIN
        # The inbound session is also the outbound side's ledger (see above).
        self.inb = _Client(f"{self._base}-in", False, spec)
        self.inb.client.on_message = self.inb.guarded(self._on_message)
        self.inb.client.on_connect = self.inb.guarded(self._on_connect_in)
        self.inb.client.on_subscribe = self.inb.guarded(self._on_subscribe)
        self._topics: list[str] = []
        ep = spec.endpoint
        self._filter = ep.destination if spec.inbound else ep.out_target
        """What the binding's own subscription (besides the ledger probes) covers."""
        self._echo_topic = ep.out_target if spec.outbound else None
        """The one topic an echo must come from to say the binding's message is on the
        broker: where it sends, not any topic its filter covers (``hq/#`` also gets what
        another binding of the gateway sends to ``hq/sub``, which is not on ``hq``)."""

    def _on_connect_in(self, c: Any, _u: Any, _flags: Any, reason: Any, props: Any) -> None:
        """Subscribe; the inbound side is up once the broker granted every subscription."""
        if not self.inb.accept(reason, props):
            return
        self._held = 0  # what was left unacknowledged comes again now, first
        ep = self.spec.endpoint
        topics = [(self.ledger_topic, 1)] if self.spec.outbound else []
        if self.spec.inbound:  # its filter covers the outbound topic
            topics.append((ep.destination, self.spec.qos))
        elif self.spec.outbound:
            topics.append((ep.out_target, 1))
        self._topics = [t for t, _ in topics]
        # A topic's retained message is sent only to a new subscription (not to the one
        # the persistent session already holds): imported once, not at every connection.
        new_only = SubscribeOptions.RETAIN_SEND_IF_NEW_SUB
        c.subscribe([(t, SubscribeOptions(qos=q, retainHandling=new_only)) for t, q in topics])

    def _on_subscribe(self, _c: Any, _u: Any, _mid: int, codes: Any, _props: Any) -> None:
        refused = [
            f"{topic!r} ({code})"
            for topic, code in zip(self._topics, codes, strict=False)
            if code.is_failure
        ]
        if refused:
            self.inb.failure = f"MQTT subscription refused: {', '.join(refused)}"
            self.inb.lost.set()
        else:
            self.inb.up.set()

    def _on_message(self, client: Any, _u: Any, msg: Any) -> None:
        if msg.topic == self.ledger_topic:
            if bytes(msg.payload) in self._nonces:
                self._probe.set()
            client.ack(msg.mid, msg.qos)
            return
        headers: dict[str, str] = {}
        expires = None
        correlation = None
        props = getattr(msg, "properties", None)
        if props is not None:
            for k, v in getattr(props, "UserProperty", None) or []:
                headers[str(k)] = str(v)
            interval = getattr(props, "MessageExpiryInterval", None)
            if interval:
                expires = time.time() + float(interval)
            data = getattr(props, "CorrelationData", None)
            if data:
                correlation = bytes(data).decode("utf-8", "replace")
        headers.setdefault("mqtt_topic", msg.topic)
        inbound = Inbound(
            body=bytes(msg.payload),
            headers=headers,
            remote_id=headers.get("message-id"),
            expires=expires,
            correlation_id=correlation,
            # A retained message may come again (a new session, the binding added again):
            # like a redelivery, it is recognised by its content while its copy lives.
            redelivered=bool(msg.dup or msg.retain),
            elsewhere=(
                msg.topic != self._echo_topic
                if self._echo_topic is not None
                else not paho.topic_matches_sub(self._filter, msg.topic)
            ),
        )
        if not self.spec.inbound and inbound.dodwan_id is None:
            client.ack(msg.mid, msg.qos)  # the ledger subscription of an outbound binding
            return
        published = inbound.dodwan_id is None  # an echo is only looked at, never published
        if self._held and published and msg.qos:
            # Behind one the daemon refused: left unacknowledged, not offered, so that the
            # broker delivers them again after it, in their order.
            self._held += 1
            return
        if self.on_message(inbound):
            client.ack(msg.mid, msg.qos)
            if published:
                self._again_wait = REDELIVER_MIN
        elif msg.qos == 0:
            log.warning(
                "bridge %s: a QoS 0 message on %r was not taken (see last_error) and is "
                "dropped: MQTT cannot deliver it again",
                self.spec.name,
                msg.topic,
            )
        else:
            # Refused for now (a full cache): the broker keeps it, unacknowledged, and
            # resends it on the next connection, made after a back-off (see poll).
            if not self._held:
                self._again_at = time.monotonic() + self._again_wait
                self._again_wait = min(REDELIVER_MAX, self._again_wait * 2)
            self._held += 1

    def connect(self) -> None:
        if self.spec.outbound:
            if self.out is not None:
                self.out.close()
            # A fresh session: what the broker may not have is sent again from the outbox
            # once the ledger has been read, never blindly by paho.
            self.out = _Client(f"{self._base}-o{secrets.token_hex(3)}", True, self.spec)
        for c in (self.out, self.inb):
            if c is not None:
                c.connect()

    def left_out(self) -> list[tuple[str, list[str], str]]:
        """Nothing: every application attribute crosses (see :meth:`.binding.Link.left_out`)."""
        return []

    def committed(self) -> set[str]:
        """Wait until a probe comes back through the ledger subscription: everything the
        broker took before the link broke has come back before it (and been marked sent).
        Returns no ids: the echoes did the marking."""
        out = self.out
        if out is None:
            return set()
        self._probe.clear()
        self._nonces.clear()
        deadline = time.monotonic() + CONFIRM_TIMEOUT
        while True:
            nonce = secrets.token_hex(8).encode()
            self._nonces.add(nonce)
            info = out.client.publish(self.ledger_topic, nonce, qos=1)
            if self._probe.wait(1.0):
                return set()
            if info.mid in out.rejected:
                raise LinkError(
                    f"MQTT broker refused the ledger probe on {self.ledger_topic!r}: "
                    f"{out.rejected.pop(info.mid)}"
                )
            out.check()
            self.inb.check()
            if time.monotonic() > deadline:
                raise LinkError("MQTT ledger probe did not come back in time")

    def send(self, rows: list[OutRow]) -> None:
        assert self.out is not None
        topic = self.spec.endpoint.out_target
        self.out.rejected.clear()
        infos = []
        for row in rows:
            d = row.descriptor
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.UserProperty = [*user_properties(d).items(), *self.marks]
            left = deadline_of(d, time.time() + 3600) - time.time()
            props.MessageExpiryInterval = max(1, int(left))
            if d.get("jms_correlation_id"):
                props.CorrelationData = d["jms_correlation_id"].encode()
            info = self.out.client.publish(topic, row.payload, qos=self.spec.qos, properties=props)
            if info.rc != paho.MQTT_ERR_SUCCESS:
                raise LinkError(f"MQTT publish failed: {paho.error_string(info.rc)}")
            infos.append(info)
        deadline = time.monotonic() + CONFIRM_TIMEOUT
        for info in infos:
            while not _confirmed(info, 0.05):
                self.out.check()
                if time.monotonic() > deadline:
                    raise LinkError("MQTT broker did not confirm in time")
        # A PUBACK/PUBREC with a failure code (e.g. 0x87 not authorized): the broker did not
        # take the message. Nothing of the batch is marked sent (the others of the batch
        # went through: their echoes mark them sent); its messages go one at a time, and
        # one refused alone is held back and tried again later (see .refusals).
        refused = [
            self.out.rejected.pop(info.mid) for info in infos if info.mid in self.out.rejected
        ]
        if refused:
            raise Refused(
                f"MQTT broker refused {len(refused)} message(s) on {topic!r}: {refused[0]}"
            )

    def poll(self, timeout: float, wake: threading.Event) -> None:
        end = time.monotonic() + timeout
        while True:
            for c in (self.out, self.inb):
                if c is not None:
                    c.check()
            if self._held and time.monotonic() >= self._again_at:
                self._redeliver()
            left = end - time.monotonic()
            if left <= 0 or wake.wait(min(left, 0.1)):
                return

    def _redeliver(self) -> None:
        """Connect the inbound side again (its session kept): the broker then resends, in
        order, what this connection left unacknowledged."""
        log.info(
            "bridge %s: %d incoming message(s) not taken yet; reconnecting for the broker to "
            "deliver them again",
            self.spec.name,
            self._held,
        )
        self.inb.drop()
        self.inb.connect()

    def disconnect(self) -> None:
        """After a failure: the clients stay (their sessions continue on reconnect)."""
        for c in (self.out, self.inb):
            if c is not None and c.up.is_set():
                c.drop()

    def close(self) -> None:
        for c in (self.out, self.inb):
            if c is not None:
                c.close()
