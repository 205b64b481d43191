"""The STOMP 1.2 gateway: serves the JOMS service to any STOMP client over asyncio TCP.

Owns the mapping of STOMP frames onto service calls, the way ActiveMQ/Artemis map JMS onto
STOMP (destinations ``/topic/N``, ``/queue/N``, ``/queue/N@HOST``, ``/temp-queue/N``;
headers ``selector``, ``persistent``, ``priority``, ``expires``, ``reply-to``,
``correlation-id``, ``type``, ``client-id``, durable subscription names; ack modes, BEGIN /
COMMIT / ABORT, receipts, heart-beats). A malformed frame, or a refused request, gets an
ERROR frame and that connection is closed; nothing a client sends reaches other clients.
See docs/stomp.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import struct
import termios
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from dodwan.daemon.admin import is_loopback_name

from ..errors import InvalidDestinationException, JMSException
from ..service import model as mdl
from ..service.events import MessageDispatched
from ..service.model import Destination, JomsMessage
from ..service.store import StoreWriteError
from .frame import Frame, FrameLimits, FrameParser, ProtocolError, encode, for_stomp_10
from .host import GatewayHost, as_gateway_host

log = logging.getLogger(__name__)

SERVER_NAME = "joms/0.1"
DIRECTORY_DESTINATION = "/joms/destinations"
"""Subscribing here returns one MESSAGE listing the queues and topics this host knows."""
HEARTBEAT_MS = 1_000
"""Shortest heart-beat period the gateway agrees to (ms): a client asking for more often
gets this; a client asking for less often gets what it asked (STOMP 1.2 negotiation)."""
VERSIONS = ("1.2", "1.1", "1.0")
"""STOMP versions served, best first."""
EXCEPTION_HEADER = "joms-exception"
"""ERROR header naming the JMS exception class of a refused request (JOMS extension)."""
ACK_IDS_KEPT = 65_536
"""Message ids a STOMP 1.0/1.1 connection may still ACK by (see ``_ack_of``), at most."""
STOPPING = "the server is stopping"
"""ERROR message every connected client gets when the gateway stops (then it is closed)."""

CONNECT_TIMEOUT = 10.0
"""Seconds a new connection has to send CONNECT (or STOMP) before an ERROR closes it."""
WRITE_WINDOW = 8 * 1024 * 1024
"""Bytes of output a client may leave unread in the gateway (beyond the kernel's socket
buffer): past it writing to it pauses (asyncio's write flow control) and its messages wait
until it has read some, so a consumer that stops reading cannot grow the daemon."""
WRITE_TIMEOUT = 30.0
"""Seconds a client may leave a full write window unread, reading none of it, before it is
disconnected; the messages it was not sent go back (to their queue, or redelivered)."""
WRITE_CHUNK = 256 * 1024
"""Bytes of frames joined into one write (a burst goes out in pieces of about this size,
so writing stops soon after the window is full)."""
WATCH_PERIOD = (0.05, 1.0)
"""Seconds between two looks at a connection whose output waits in its buffer (what left
the buffer for the socket is written: its ``auto`` messages are consumed then; a client
over its window that reads none of it is timed): the first, doubled up to the second while
the client reads nothing."""
HELD_OVERHEAD = 512
"""Bytes counted for the headers of a frame waiting to be written."""

DURABLE_HEADERS = (
    "durable-subscription-name",
    "durable-subscriber-name",
    "activemq.subscriptionName",
)
NO_LOCAL_HEADERS = ("no-local", "activemq.noLocal")
PREFETCH_HEADERS = ("prefetch", "activemq.prefetchSize")
NULL_TEXT_HEADER = "joms-null-text"
"""``true`` on SEND and MESSAGE: a text message whose text is null (the body is empty)."""
_SEND_RESERVED = mdl.STOMP_SEND_HEADERS
"""SEND headers read as the frame's own; every other header is a user property, refused
(ERROR, MessageFormatException) when its name is reserved (``mdl.check_property_name``):
a MESSAGE frame header such as ``message-id`` would be overwritten on delivery."""
_CONTENT_TYPES = {
    "text": "text/plain;charset=utf-8",
    "bytes": "application/octet-stream",
    "map": "application/x-joms-map+json",
    "stream": "application/x-joms-stream+json",
}


class StompError(Exception):
    """A client request the gateway refuses (becomes an ERROR frame)."""


class Gateway:
    """Routes service events to the STOMP connections they belong to."""

    def __init__(
        self,
        host: GatewayHost,
        *,
        login: str | None = None,
        passcode: str | None = None,
        limits: FrameLimits | None = None,
        heartbeat_ms: int = HEARTBEAT_MS,
        connect_timeout: float = CONNECT_TIMEOUT,
        write_window: int = WRITE_WINDOW,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        self.host = host
        self.heartbeat_ms = heartbeat_ms
        self.connect_timeout = connect_timeout
        self.write_window = write_window
        self.write_timeout = write_timeout
        self._written: list[tuple[str, str]] = []
        """(consumer, tag) of ``auto``-mode MESSAGE frames that left a connection's buffer
        for its socket: consumed at the next :meth:`settle`."""
        self.counters: dict[str, int] = {}
        self.service = host.service
        self.login = login
        self.passcode = passcode
        self.limits = limits or FrameLimits()
        self.connections: dict[str, StompConnection] = {}
        self.open: set[StompConnection] = set()
        """Every open client connection, also those not yet CONNECTed."""
        self.closed = False
        host.add_wakeup(self.pump)

    def close(self, message: str = STOPPING) -> None:
        """The server stops (after the listening socket was closed): every client gets an
        ERROR saying so and its connection is closed, its JOMS connection closed now
        (transactions aborted, unacknowledged messages given back); then the service
        publishes what it still holds in memory and its timer stops (``host.close()``).
        Nothing is served afterwards, so the runner may close its stores."""
        if self.closed:
            return
        self.closed = True
        for conn in list(self.open):
            conn.stop(message)
        closer = getattr(self.host, "close", None)
        if closer is not None:
            closer()

    def pump(self) -> None:
        """Hand every pending service event to its connection, and write what each can
        take now (one write per connection, unless a burst is large)."""
        touched: dict[str, StompConnection] = {}
        while (ev := self.service.next_event(confirm=True)) is not None:
            if isinstance(ev, MessageDispatched):
                conn = self.connections.get(ev.connection)
                if conn is not None:
                    conn.deliver(ev)
                    touched[ev.connection] = conn
        for conn in touched.values():
            conn.flush()
        self.settle()

    def settle(self) -> bool:
        """Consume the ``auto``-mode messages whose frames left their connection's buffer for
        the socket — not when dispatched, nor when buffered: a kill before that, or a client
        cut off with them still in its buffer, loses none (they are given back). Whether
        there were any."""
        if not self._written:
            return False
        written, self._written = self._written, []
        batch = getattr(self.host, "batch", None)
        try:
            with batch() if batch is not None else contextlib.nullcontext():
                self.service.settle(self.host.now(), written)
        except JMSException:
            pass  # the store cannot commit (disk full): the host logged it, the service retries
        return True

    def protocol(self) -> StompConnection:
        return StompConnection(self)  # (one made as the server stops: connection_made)


class StompConnection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.service = gateway.service
        self.parser = FrameParser(gateway.limits)
        self.transport: asyncio.Transport | None = None
        self.conn_id: str | None = None
        self.subs: dict[str, str] = {}  # STOMP subscription id -> consumer id
        self.sub_of: dict[str, str] = {}  # consumer id -> STOMP subscription id
        self.sub_durable: dict[str, str] = {}  # STOMP subscription id -> durable name
        self.sub_dest: dict[str, str] = {}  # STOMP subscription id -> destination header
        self.auto: set[str] = set()  # consumers in ack=auto mode (MESSAGE without ack header)
        self.temp: dict[str, Destination] = {}  # /temp-queue/NAME -> real queue
        self.closing = False
        self._last_rx = 0.0
        self._hb_send: asyncio.TimerHandle | None = None
        self._hb_check: asyncio.TimerHandle | None = None
        self._send_every = 0.0
        self._expect_every = 0.0
        self._wrote = False
        self._out: deque[tuple[Frame | MessageDispatched, int]] = deque()
        """Output not written yet, in order, each with the bytes it counts in ``_held``."""
        self._held = 0
        """Bytes of the waiting output the daemon would not keep otherwise (non-durable topic
        messages, receipts and other replies); queue and durable messages wait anyway."""
        self._held_items = 0
        self._set_aside: list[MessageDispatched] = []
        """Messages never written because the connection closed while its client was behind."""
        self._paused = False  # the transport's buffer is over the write window
        self._sent = 0  # bytes handed to the transport
        self._flushed = 0  # of those, bytes seen to have left its buffer for the socket
        self._inflight: deque[tuple[int, str, str, bool]] = deque()
        """(offset of its end, consumer, tag, auto mode) of each MESSAGE frame handed to the
        transport and not yet seen to have left its buffer."""
        self._watch: asyncio.TimerHandle | None = None
        self._watch_every = WATCH_PERIOD[0]
        self._stall_mark = 0  # bytes the client had taken (_received) when last seen reading
        self._stall_since = 0.0
        self._aborted = False  # cut off: what its transport still held was discarded
        self.volatile: set[str] = set()  # consumers of non-durable topics
        self._holding = False  # handling a run of frames: output waits for its commit
        self._connect_timer: asyncio.TimerHandle | None = None
        self.version = "1.2"
        """STOMP version agreed at CONNECT (header escaping follows it)."""
        self._ack_of: OrderedDict[str, dict[str, str]] = OrderedDict()
        """STOMP 1.0 and 1.1: message-id -> {subscription id: ack id} of the messages sent
        in a client ack mode (those versions ACK and NACK by message-id, 1.1 with the
        ``subscription``: one message reaches two subscriptions of a connection under one
        message-id), the newest last; at most ``ACK_IDS_KEPT`` message ids, each copy
        forgotten when acknowledged or its subscription ends."""

    # ------------------------------------------------------------------ asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        # the server is stopping (it may have closed before or after this protocol was
        # made, a loop step earlier: it did not know this connection then)
        if self.gw.closed:
            self.closing = True
            transport.close()
            return
        self.gw.open.add(self)
        # past the window the transport calls pause_writing: messages wait in _out
        with contextlib.suppress(NotImplementedError):
            transport.set_write_buffer_limits(
                high=self.gw.write_window, low=self.gw.write_window // 2
            )
        loop = asyncio.get_running_loop()
        self._last_rx = loop.time()
        self._connect_timer = loop.call_later(self.gw.connect_timeout, self._connect_overdue)

    def _connect_overdue(self) -> None:
        if self.conn_id is None and not self.closing:
            self.gw.counters["connect_timeouts"] = self.gw.counters.get("connect_timeouts", 0) + 1
            self.error(f"no CONNECT frame within {self.gw.connect_timeout:g} s")

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self._last_rx = asyncio.get_running_loop().time()
        malformed: ProtocolError | None = None
        try:
            frames = self.parser.feed(data)
        except ProtocolError as exc:
            # the valid frames before it came first: handled as sent, then the ERROR
            malformed, frames = exc, exc.frames
        # One store commit for the run of frames, made before anything is written back
        # (receipts promise what they confirm is stored): output waits for the commit.
        batch = getattr(self.gw.host, "batch", None)
        refused: tuple[str, str | None] | None = None
        self._holding = True
        try:
            with batch() if batch is not None else contextlib.nullcontext():
                self._handle_all(frames)
        except JMSException as exc:  # the commit failed (disk full): nothing was published
            refused = (str(exc), type(exc).__name__)
        except Exception as exc:
            log.exception("STOMP gateway: storing a run of frames failed")
            refused = (f"internal error storing the frames: {type(exc).__name__}", None)
        finally:
            self._holding = False
        if refused is not None:
            # confirm none of the run: no receipt may claim it was stored (messages go out)
            self._keep_output(lambda item: isinstance(item, MessageDispatched))
            self.closing = False  # (an ERROR of the run was not written either)
            self.error(refused[0], exception=refused[1])
            return
        if malformed is not None:
            self.error(f"malformed frame: {malformed}")  # (unless one of the frames did)
        if self.closing:
            if not self._aborted:
                self.close()
            return
        # The run is stored: its receipts go out now, before the deliveries it caused are
        # worked out (poke), so a producer waiting for a receipt prepares its next frames
        # while this process dispatches the messages it sent.
        self.flush()
        self.gw.host.poke()
        self.flush()

    def _handle_all(self, frames: list[Frame]) -> None:
        for frame in frames:
            if self.closing:
                break
            try:
                self.handle(frame)
            except JMSException as exc:
                self.error(str(exc), frame, exception=type(exc).__name__)
            except StompError as exc:
                self.error(str(exc), frame)
            except StoreWriteError as exc:  # a read that wrote the waiting records first
                self.error(f"{exc}: not confirmed", frame, exception="ResourceAllocationException")
            except Exception as exc:  # never let one client take the gateway down
                log.exception("STOMP gateway failed on a %s frame", frame.command)
                self.error(f"internal error handling {frame.command}: {type(exc).__name__}", frame)

    def connection_lost(self, exc: Exception | None) -> None:
        # closed without an error, by either side: its buffer was written out first
        self._end(all_written=exc is None and not self._aborted)

    def pause_writing(self) -> None:
        """The transport holds more than the write window: messages wait in ``_out``."""
        self._paused = True
        self._stall_mark = self._received()
        self._stall_since = asyncio.get_running_loop().time()
        self._watch_output()

    def resume_writing(self) -> None:
        self._paused = False
        if self.closing:
            return
        self.flush()
        if self.gw.settle():
            self.gw.host.poke()  # (their queue acknowledgements: the service's timer)

    def stop(self, message: str) -> None:
        """The server is stopping: an ERROR (once CONNECTed), close the connection, and
        end its JOMS connection now rather than when the transport reports it closed."""
        if self.conn_id is not None:
            self.error(message)
        self.close()
        self._end()

    def _end(self, *, all_written: bool = False) -> None:
        """The connection is over: its JOMS connection is closed. Of what it was sent, the
        ``auto``-mode messages that left the buffer (all of them, ``all_written``) are
        consumed; those never written go back as never delivered."""
        self.closing = True
        self.gw.open.discard(self)
        for h in (self._hb_send, self._hb_check, self._connect_timer, self._watch):
            if h is not None:
                h.cancel()
        if self.conn_id is not None:
            self.gw.connections.pop(self.conn_id, None)
            flushed = self._sent if all_written else self._flushed
            unconsumed: dict[str, list[str]] = {}
            for end, consumer, tag, auto in self._inflight:
                if end <= flushed:
                    if auto:
                        self.gw._written.append((consumer, tag))
                else:
                    unconsumed.setdefault(consumer, []).append(tag)
            self._inflight.clear()
            waiting = [item for item, _ in self._out if isinstance(item, MessageDispatched)]
            for ev in [*self._set_aside, *waiting]:
                unconsumed.setdefault(ev.consumer, []).append(ev.tag)
            self._set_aside.clear()
            self._keep_output(lambda item: False)
            self.gw.settle()
            batch = getattr(self.gw.host, "batch", None)
            try:
                with batch() if batch is not None else contextlib.nullcontext():
                    self.service.close_connection(
                        self.conn_id, self.gw.host.now(), unconsumed=unconsumed
                    )
            except JMSException:
                pass  # the close could not be stored (disk full): the host logged it
            except Exception:
                log.exception("closing JOMS connection failed")
            self.conn_id = None
            self.gw.host.poke()

    # ------------------------------------------------------------------ output
    def send_frame(self, frame: Frame) -> None:
        """Queue a frame; :meth:`flush` writes the queued frames."""
        held = 0 if frame.command == "MESSAGE" else len(frame.body) + HELD_OVERHEAD
        self._queue(frame, held)

    def _queue(self, item: Frame | MessageDispatched, held: int) -> None:
        self._out.append((item, held))
        if held:
            self._held += held
            self._held_items += 1
            if self._paused and self._held > self.gw.write_window and self._held_items > 1:
                # a client that falls that far behind its topics: keeping their messages
                # for it would grow the daemon without bound (queue messages wait anyway)
                self._cut_off(
                    f"{self._held} bytes of topic messages and replies waiting behind "
                    f"{self._unread()} bytes unread, over its write window "
                    f"({self.gw.write_window} bytes, stomp_write_window)"
                )

    def _keep_output(self, keep: Callable[[Frame | MessageDispatched], bool]) -> None:
        """Drop the waiting output ``keep`` refuses."""
        self._out = deque((item, held) for item, held in self._out if keep(item))
        self._held = sum(held for _, held in self._out)
        self._held_items = sum(1 for _, held in self._out if held)

    def _encode(self, item: Frame | MessageDispatched) -> bytes | None:
        if isinstance(item, MessageDispatched):
            sub = self.sub_of.get(item.consumer)
            if sub is None:
                return None  # unsubscribed meanwhile: it went back with its consumer
            frame = message_frame(item, sub, ack=item.consumer not in self.auto)
        else:
            frame = item
        try:
            return encode(frame, version=self.version)
        except ValueError:
            if self.version != "1.0":
                raise
            # a header a STOMP 1.0 peer cannot read: that one goes escaped, the rest as is
            return encode(for_stomp_10(frame), version="1.0")

    def flush(self, *, force: bool = False) -> None:
        """Write the waiting output while the transport takes more: once its buffer is over
        the write window (``pause_writing``) the rest waits for ``resume_writing``. A frame
        is written whole, however large, when the buffer is below the window. ``force``:
        write it all anyway (the few frames left when closing)."""
        t = self.transport
        if not self._out or self._holding or t is None or t.is_closing():
            return
        chunk: list[bytes] = []
        size = 0
        while self._out and (force or not self._paused):
            item, held = self._out.popleft()
            if held:
                self._held -= held
                self._held_items -= 1
            data = self._encode(item)
            if data is None:
                continue
            chunk.append(data)
            size += len(data)
            if isinstance(item, MessageDispatched):
                auto = item.consumer in self.auto
                self._inflight.append((self._sent + size, item.consumer, item.tag, auto))
            if size >= WRITE_CHUNK:
                self._write(b"".join(chunk))
                chunk, size = [], 0
        if chunk:
            self._write(b"".join(chunk))
        self._written_out()

    def _write(self, data: bytes) -> None:
        assert self.transport is not None
        self._sent += len(data)
        self._wrote = True
        self.transport.write(data)  # (past the window, calls pause_writing)

    def _unread(self) -> int:
        t = self.transport
        return 0 if t is None else t.get_write_buffer_size()

    def _received(self) -> int:
        """Bytes of its output the client's end has taken: those gone from the buffer, less
        those the kernel still holds unacknowledged (Linux SIOCOUTQ) — a client reading
        slowly drains the kernel's send buffer long before it frees room for the buffer."""
        t = self.transport
        if t is None:
            return self._sent
        in_kernel = 0
        sock = t.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, ValueError):
                raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
                in_kernel = struct.unpack("i", raw)[0]
        return self._sent - t.get_write_buffer_size() - in_kernel

    def _written_out(self) -> None:
        """Note the frames that left the buffer for the socket (their ``auto`` messages
        are consumed at the gateway's next settle), and watch the rest."""
        t = self.transport
        if t is None or t.is_closing():
            return  # (aborted, its buffer is gone: what it held was not written)
        self._flushed = self._sent - t.get_write_buffer_size()
        while self._inflight and self._inflight[0][0] <= self._flushed:
            _, consumer, tag, auto = self._inflight.popleft()
            if auto:
                self.gw._written.append((consumer, tag))
        if self._flushed < self._sent:
            self._watch_output()
        else:
            self._watch_every = WATCH_PERIOD[0]

    def _watch_output(self) -> None:
        if self._watch is None and not self._aborted:
            loop = asyncio.get_running_loop()
            self._watch = loop.call_later(self._watch_every, self._on_watch)

    def _on_watch(self) -> None:
        self._watch = None
        t = self.transport
        if t is None or self._aborted:
            return
        before = self._flushed
        self._written_out()
        if self.gw.settle():
            self.gw.host.poke()  # (their queue acknowledgements: the service's timer)
        longest = min(WATCH_PERIOD[1], self.gw.write_timeout / 4)
        self._watch_every = (
            WATCH_PERIOD[0] if self._flushed > before else min(2 * self._watch_every, longest)
        )
        if not self._paused or self._aborted:
            return
        # a client over its window: is it reading any of it?
        now = asyncio.get_running_loop().time()
        received = self._received()
        if received > self._stall_mark:
            self._stall_mark, self._stall_since = received, now
        elif now - self._stall_since >= self.gw.write_timeout:
            self._cut_off(
                f"{t.get_write_buffer_size()} bytes unread for {self.gw.write_timeout:g} s "
                f"(stomp_write_timeout), over its write window ({self.gw.write_window} bytes, "
                "stomp_write_window)"
            )
            return
        self._watch_output()

    def _cut_off(self, why: str) -> None:
        """Disconnect a client that does not read its output (see ``why``): what its
        transport still holds is discarded, and its messages go back (``_end``)."""
        if self._aborted:
            return
        c = self.gw.counters
        c["slow_disconnects"] = c.get("slow_disconnects", 0) + 1
        log.warning("STOMP client %s disconnected: %s", self.conn_id or "?", why)
        self._written_out()
        self.closing = True
        self._aborted = True
        if self.transport is not None:
            self.transport.abort()

    def error(
        self,
        message: str,
        frame: Frame | None = None,
        *,
        exception: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        """Send an ERROR (with ``joms-exception`` naming the JMS exception class when the
        service refused the request) and close the connection, as STOMP requires."""
        if self.closing:
            return
        headers = {"message": message.replace("\n", " ")[:500], "content-type": "text/plain"}
        if exception is not None:
            headers[EXCEPTION_HEADER] = exception
        headers.update(extra or {})
        if frame is not None and frame.get("receipt"):
            headers["receipt-id"] = frame.headers["receipt"]
        self.send_frame(Frame("ERROR", headers, message.encode()))
        self.flush()
        self.close()

    def close(self) -> None:
        """Write the waiting output and close. For a client behind its window, only the
        frames that are not messages go (a RECEIPT, the ERROR); its messages go back."""
        self.flush()
        self.closing = True
        if self._holding:
            return  # once the batch is stored
        if self._out:
            self._set_aside += [i for i, _ in self._out if isinstance(i, MessageDispatched)]
            self._keep_output(lambda item: isinstance(item, Frame) and item.command != "MESSAGE")
            self.flush(force=True)
        if self.transport is not None:
            self._written_out()
            self.transport.close()

    def deliver(self, ev: MessageDispatched) -> None:
        sub = self.sub_of.get(ev.consumer)
        if sub is None:
            return
        ack = ev.consumer not in self.auto
        if ack and self.version != "1.2":
            mid = ev.message.message_id
            copies = self._ack_of.setdefault(mid, {})
            copies.pop(sub, None)
            copies[sub] = ev.tag  # the oldest copy first (an ACK without subscription)
            self._ack_of.move_to_end(mid)
            if len(self._ack_of) > ACK_IDS_KEPT:
                self._ack_of.popitem(last=False)
        # encoded when written: a consumer far behind holds its messages, not their frames
        held = len(ev.message.body) + HELD_OVERHEAD if ev.consumer in self.volatile else 0
        self._queue(ev, held)

    # ------------------------------------------------------------------ frames
    def handle(self, frame: Frame) -> None:
        cmd = frame.command
        if self.conn_id is None:
            if cmd not in ("CONNECT", "STOMP"):
                raise StompError(f"expected CONNECT or STOMP first, got {cmd}")
            self.on_connect(frame)
            return
        handler = _HANDLERS.get(cmd)
        if handler is None:
            raise StompError(f"{cmd} is not a client frame (or a second CONNECT)")
        result = handler(self, frame)
        receipt = frame.get("receipt")
        if receipt is not None and not self.closing:
            # a RECEIPT confirms this frame and the earlier ones: their queue acks must be
            # published (stored with the run) first, not waiting in the service's ack batch
            self.service.flush_acks(self.now(), self.conn_id)
            headers = {"receipt-id": receipt}
            if cmd == "SEND" and isinstance(result, str):
                headers["message-id"] = result  # JOMS extension: the JMSMessageID given
            self.send_frame(Frame("RECEIPT", headers))
        if cmd == "DISCONNECT":
            self.close()

    def now(self) -> float:
        return self.gw.host.now()

    def on_connect(self, frame: Frame) -> None:
        offered = {v.strip() for v in (frame.get("accept-version") or "1.0").split(",")}
        version = next((v for v in VERSIONS if v in offered), None)
        if version is None:  # STOMP 1.2: no common version -> ERROR with ours, then close
            self.error(
                f"unsupported STOMP version(s) {', '.join(sorted(offered))}: "
                f"this server supports {', '.join(VERSIONS)}",
                frame,
                extra={"version": ",".join(VERSIONS)},
            )
            return
        if self.gw.login is not None and (
            frame.get("login") != self.gw.login or frame.get("passcode") != self.gw.passcode
        ):
            raise StompError("login refused: bad login or passcode")
        self.version = version
        self.parser.version = version
        client_id = frame.get("client-id") or None
        self.conn_id = self.service.open_connection(self.now(), client_id)
        self.gw.connections[self.conn_id] = self
        cx, cy = _heartbeat(frame.get("heart-beat") or "0,0")
        # STOMP 1.2: we answer sx,sy; we send every max(sx, cy) and expect the client every
        # max(cx, sy). We offer what the client asked, no more often than our floor.
        sx, sy = negotiate_heartbeat(cx, cy, self.gw.heartbeat_ms)
        self._send_every = sx / 1000.0
        self._expect_every = sy / 1000.0
        self.send_frame(
            Frame(
                "CONNECTED",
                {
                    "version": version,
                    "server": SERVER_NAME,
                    "session": self.conn_id,
                    # JOMS extension: the host whose queues this gateway can browse
                    "joms-host": self.service.host_id,
                    "heart-beat": f"{sx},{sy}",
                },
            )
        )
        # at once, even in a run of frames: CONNECT is the first, nothing before it waits
        # for a commit
        held, self._holding = self._holding, False
        self.flush()
        self._holding = held
        self._wrote = False
        loop = asyncio.get_running_loop()
        if self._send_every:
            self._hb_send = loop.call_later(self._send_every, self._heartbeat_send)
        if self._expect_every:
            self._hb_check = loop.call_later(self._expect_every * 2, self._heartbeat_check)

    def _heartbeat_send(self) -> None:
        if self.closing or self.transport is None:
            return
        if not self._wrote:
            self._write(b"\n")
        self._wrote = False
        self._hb_send = asyncio.get_running_loop().call_later(
            self._send_every, self._heartbeat_send
        )

    def _heartbeat_check(self) -> None:
        if self.closing:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_rx > self._expect_every * 2:
            self.error("heart-beat timeout: nothing received from the client")
            return
        self._hb_check = loop.call_later(self._expect_every, self._heartbeat_check)

    # ---------------------------------------------------------------- destinations
    def destination(self, text: str | None, *, create_temp: bool = True) -> Destination:
        if not text:
            raise StompError("missing destination header")
        if text.startswith("/temp-queue/"):
            dest = self.temp.get(text)
            if dest is None:
                if not create_temp:
                    raise StompError(f"unknown temporary queue {text}")
                assert self.conn_id is not None
                dest = self.service.create_temporary_queue(self.conn_id, self.now())
                self.temp[text] = dest
            return dest
        if text.startswith("/temp-topic/"):
            dest = self.temp.get(text)
            if dest is None:
                if not create_temp:
                    raise StompError(f"unknown temporary topic {text}")
                assert self.conn_id is not None
                dest = self.service.create_temporary_topic(self.conn_id, self.now())
                self.temp[text] = dest
            return dest
        if text.startswith("/queue/") and text.endswith("@*"):
            name = text[len("/queue/") : -2]
            known = self.service.lookup_queue(name)
            if not known:
                raise InvalidDestinationException(
                    f"queue {name!r} is not known here yet (directory lookup)"
                )
            return Destination("queue", known[0])
        return Destination.parse(text, self.service.host_id)

    def consumer_queue(self, dest: Destination) -> Destination:
        """A consumer of ``/queue/NAME`` (no ``@``) on a host that does not manage NAME
        consumes the queue NAME the directory knows elsewhere, rather than creating a
        second, empty NAME here (send keeps NAME = NAME@this host)."""
        name, _, manager = dest.name.partition("@")
        if dest.kind != "queue" or manager != self.service.host_id:
            return dest
        if self.service.manages(dest.name):
            return dest
        known = self.service.lookup_queue(name)
        return Destination("queue", known[0]) if known else dest

    def on_send(self, frame: Frame) -> str:
        assert self.conn_id is not None
        msg, ttl = self.message_from(frame)
        return self.service.send(
            self.conn_id, msg, self.now(), time_to_live=ttl, tx=frame.get("transaction")
        )

    def message_from(self, frame: Frame) -> tuple[JomsMessage, float | None]:
        h = frame.headers
        dest = self.destination(h.get("destination"))
        body_type = h.get("joms-body-type")
        ctype = h.get("content-type")
        if body_type is None:
            # STOMP 1.2: a frame without content-type is a binary blob; no sniffing of the
            # body, so the message type never depends on what the bytes happen to be
            # (joms-null-text: true alone says text: JMS getText() null)
            null = (h.get(NULL_TEXT_HEADER) or "").lower() == "true"
            text = ctype.startswith("text/") if ctype is not None else null
            body_type = "text" if text else "bytes"
        if body_type not in mdl.BODY_TYPES:
            raise StompError("joms-body-type must be one of text, bytes, map, stream")
        if body_type == "text":
            try:
                frame.body.decode("utf-8")
            except UnicodeDecodeError:
                raise StompError("a text body must be UTF-8") from None
        null_text = (h.get(NULL_TEXT_HEADER) or "false").lower()
        if null_text not in ("true", "false"):
            raise StompError(f"bad {NULL_TEXT_HEADER} header {null_text!r}: true or false")
        if null_text == "true" and (body_type != "text" or frame.body):
            raise StompError(f"{NULL_TEXT_HEADER}: true is for a text message with no body")
        persistent_text = h.get("persistent", "true").lower()
        if persistent_text not in ("true", "false"):
            raise StompError(f"bad persistent header {h.get('persistent')!r}: true or false")
        persistent = persistent_text == "true"
        try:
            priority = int(h.get("priority", "4"))
        except ValueError:
            raise StompError(f"bad priority header {h.get('priority')!r}") from None
        if not 0 <= priority <= 9:
            raise StompError("priority must be between 0 and 9")
        try:
            expires = int(h.get("expires", "0"))
        except ValueError:
            raise StompError(f"bad expires header {h.get('expires')!r}") from None
        if expires < 0:
            raise StompError("expires must be >= 0 (ms since the epoch, 0 = never)")
        reply_to = h.get("reply-to")
        if reply_to:
            reply_to = str(self.destination(reply_to))
        try:
            types = mdl.decode_types(h.get("joms-types", ""))
        except ValueError as exc:
            raise StompError(f"bad joms-types header: {exc}") from None
        props: dict[str, Any] = {}
        ptypes: dict[str, str] = {}
        for name, value in h.items():
            if name in _SEND_RESERVED:
                continue
            t = types.get(name) or mdl.CLIENT_JMSX.get(name, "string")
            try:
                mdl.check_property_name(name)
                props[name] = mdl.decode_property(value, t)
                mdl.check_property(name, props[name], t)
            except ValueError as exc:
                why = str(exc)
                if "literal" in why or "convert" in why:  # int()/float() wording
                    why = f"{value[:40]!r} is not a valid {t}"
                raise StompError(f"header {name!r}: {why}") from None
            ptypes[name] = t
        msg = JomsMessage(
            destination=dest,
            body=frame.body,
            body_type=body_type,
            null_text=null_text == "true",
            properties=props,
            property_types=ptypes,
            delivery_mode=mdl.PERSISTENT if persistent else mdl.NON_PERSISTENT,
            priority=priority,
            expiration=expires,
            correlation_id=h.get("correlation-id"),
            reply_to=reply_to,
            type=h.get("type"),
        )
        return msg, None

    def on_subscribe(self, frame: Frame) -> None:
        assert self.conn_id is not None
        sub_id = frame.get("id")
        if sub_id is None and self.version == "1.0":
            # STOMP 1.0 makes the id optional: the destination stands for it (MESSAGE
            # frames carry it as their subscription, UNSUBSCRIBE may name the destination)
            sub_id = frame.get("destination") or None
        if sub_id is None:
            raise StompError("SUBSCRIBE needs an id header")
        if sub_id in self.subs:
            raise StompError(f"subscription id {sub_id!r} is already in use")
        if frame.get("destination") == DIRECTORY_DESTINATION:
            self.send_directory(sub_id)
            return
        if (frame.get("browser") or "").lower() == "true":
            self.send_browse(sub_id, frame)
            return
        dest = self.destination(frame.get("destination"))
        if (frame.get("destination") or "").startswith("/queue/") and "@" not in frame.headers[
            "destination"
        ]:
            dest = self.consumer_queue(dest)
        ack = frame.get("ack", "auto")
        if ack not in ("auto", "client", "client-individual"):
            raise StompError(f"ack must be auto, client or client-individual, not {ack!r}")
        durable = next((frame.headers[k] for k in DURABLE_HEADERS if frame.get(k)), None)
        raw_prefetch = next((frame.headers[k] for k in PREFETCH_HEADERS if frame.get(k)), "0")
        try:
            prefetch = int(raw_prefetch)
            if prefetch < 0:
                raise ValueError
        except ValueError:
            raise StompError(f"bad prefetch size {raw_prefetch!r}: an integer >= 0") from None
        no_local = any((frame.get(k) or "").lower() == "true" for k in NO_LOCAL_HEADERS)
        consumer = self.service.subscribe(
            self.conn_id,
            dest,
            self.now(),
            selector=frame.get("selector"),
            no_local=no_local,
            durable_name=durable,
            ack_mode=ack,
            prefetch=prefetch,
        )
        self.subs[sub_id] = consumer
        self.sub_of[consumer] = sub_id
        self.sub_dest[sub_id] = frame.headers["destination"]
        if ack == "auto":
            self.auto.add(consumer)
        if self.service.consumer_info(consumer)["kind"] == "topic":
            self.volatile.add(consumer)
        if durable:
            self.sub_durable[sub_id] = durable
        self.gw.pump()

    def send_browse(self, sub_id: str, frame: Frame) -> None:
        """``browser:true`` (as ActiveMQ): one MESSAGE per waiting queue message, not
        consumed, then an empty MESSAGE with ``browser:end``."""
        assert self.conn_id is not None
        dest = self.destination(frame.get("destination"))
        if dest.kind != "queue":
            raise StompError("browser:true is for queues")
        msgs = self.service.browse(dest, self.now(), frame.get("selector"))
        self.subs[sub_id] = ""
        for i, m in enumerate(msgs):
            ev = MessageDispatched(self.conn_id, "", f"browse-{sub_id}-{i}", m)
            self.send_frame(message_frame(ev, sub_id, ack=False))
        end = {"subscription": sub_id, "destination": str(dest), "message-id": "0"}
        self.send_frame(Frame("MESSAGE", {**end, "browser": "end"}))

    def send_directory(self, sub_id: str) -> None:
        """One MESSAGE with what this host knows: {"queues": [...], "topics": [...]}."""
        body = json.dumps(self.service.destinations()).encode()
        self.subs[sub_id] = ""
        self.send_frame(
            Frame(
                "MESSAGE",
                {
                    "subscription": sub_id,
                    "message-id": f"directory-{sub_id}",
                    "destination": DIRECTORY_DESTINATION,
                    "content-type": "application/json",
                    "joms-body-type": "text",
                },
                body,
            )
        )

    def on_unsubscribe(self, frame: Frame) -> None:
        assert self.conn_id is not None
        sub_id = frame.get("id")
        dest = frame.get("destination")
        if sub_id is None and self.version == "1.0" and dest:
            # STOMP 1.0: by destination (the subscription without an id, else one with)
            sub_id = (
                dest
                if dest in self.subs
                else next((s for s, d in self.sub_dest.items() if d == dest), None)
            )
        if sub_id is not None and self.subs.get(sub_id) == "":
            del self.subs[sub_id]  # a directory subscription
            return
        durable = next((frame.headers[k] for k in DURABLE_HEADERS if frame.get(k)), None)
        consumer = self.subs.pop(sub_id, None) if sub_id is not None else None
        if consumer is None and durable is None:
            if sub_id is None and dest and self.version == "1.0":
                raise StompError(f"no subscription to {dest}")
            raise StompError(f"no subscription with id {sub_id!r}")
        if consumer is not None:
            never = self._forget_output(consumer)
            self.sub_of.pop(consumer, None)
            self.auto.discard(consumer)
            self.volatile.discard(consumer)
            for mid, copies in list(self._ack_of.items()):
                if copies.pop(sub_id or "", None) is not None and not copies:
                    del self._ack_of[mid]
            self.sub_durable.pop(sub_id or "", None)
            self.sub_dest.pop(sub_id or "", None)
            unconsumed = never + [t for t in (frame.get("joms-unconsumed") or "").split(",") if t]
            held = frame.get("joms-delivered")
            delivered = None if held is None else [t for t in held.split(",") if t]
            self.service.close_consumer(
                consumer,
                self.now(),
                unconsumed=unconsumed,
                delivered=delivered,
                defer=durable is None,  # a durable subscription deleted: its acks are moot
            )
        if durable is not None:
            self.service.unsubscribe_durable(self.conn_id, durable, self.now())

    def _forget_output(self, consumer: str) -> list[str]:
        """A consumer ends: its ``auto``-mode messages already handed to the transport count
        as written (they go out with the rest) and are consumed now; the tags of its
        messages still waiting, never written, are returned (they go back)."""
        never = [
            item.tag
            for item, _ in self._out
            if isinstance(item, MessageDispatched) and item.consumer == consumer
        ]
        if never:
            self._keep_output(
                lambda item: not isinstance(item, MessageDispatched) or item.consumer != consumer
            )
        kept: deque[tuple[int, str, str, bool]] = deque()
        for entry in self._inflight:
            if entry[1] != consumer:
                kept.append(entry)
            elif entry[3]:
                self.gw._written.append((consumer, entry[2]))
        self._inflight = kept
        self.gw.settle()
        return never

    def _ack_target(self, frame: Frame) -> tuple[str, str]:
        tag = frame.get("id")
        if tag is None:  # 1.0/1.1: by message-id (1.1: and subscription)
            mid = frame.get("message-id")
            if mid is None:
                raise StompError(f"{frame.command} needs an id header (the MESSAGE's ack header)")
            tag = self._tag_of(mid, frame.get("subscription"))
        consumer = tag.rpartition("-")[0]
        if consumer not in self.sub_of:
            raise StompError(f"{frame.command}: unknown ack id {tag!r}")
        return consumer, tag

    def _tag_of(self, mid: str, sub: str | None) -> str:
        """The ack id of the copy of message ``mid`` sent to subscription ``sub`` (None, as
        STOMP 1.0 has it: the oldest copy not yet acknowledged); ``mid`` itself when no
        such copy is known (a client may give the MESSAGE's ``ack`` header there)."""
        copies = self._ack_of.get(mid)
        if not copies:
            return mid
        key = sub
        if sub is None:
            for k, t in list(copies.items()):
                if self.service.waiting(t.rpartition("-")[0], t):
                    key = k
                    break
                del copies[k]  # settled meanwhile (a cumulative ACK or NACK): forgotten
        tag = None if key is None else copies.pop(key, None)
        if not copies:
            del self._ack_of[mid]
        return mid if tag is None else tag

    def on_ack(self, frame: Frame) -> None:
        consumer, tag = self._ack_target(frame)
        if not self.service.ack(consumer, tag, self.now(), tx=frame.get("transaction")):
            raise StompError(f"ACK: message {tag!r} is not waiting for an acknowledgement")

    def on_nack(self, frame: Frame) -> None:
        consumer, tag = self._ack_target(frame)
        if not self.service.nack(consumer, tag, self.now(), tx=frame.get("transaction")):
            raise StompError(f"NACK: message {tag!r} is not waiting for an acknowledgement")
        self.gw.pump()

    def _tx_name(self, frame: Frame) -> str:
        tx = frame.get("transaction")
        if not tx:
            raise StompError(f"{frame.command} needs a transaction header")
        return tx

    def on_begin(self, frame: Frame) -> None:
        assert self.conn_id is not None
        self.service.begin(self.conn_id, self._tx_name(frame))

    def on_commit(self, frame: Frame) -> None:
        assert self.conn_id is not None
        self.service.commit(self.conn_id, self._tx_name(frame), self.now())

    def on_abort(self, frame: Frame) -> None:
        assert self.conn_id is not None
        self.service.abort(self.conn_id, self._tx_name(frame), self.now())
        self.gw.pump()

    def on_disconnect(self, frame: Frame) -> None:
        pass


_HANDLERS: dict[str, Callable[[StompConnection, Frame], object]] = {
    "SEND": StompConnection.on_send,
    "SUBSCRIBE": StompConnection.on_subscribe,
    "UNSUBSCRIBE": StompConnection.on_unsubscribe,
    "ACK": StompConnection.on_ack,
    "NACK": StompConnection.on_nack,
    "BEGIN": StompConnection.on_begin,
    "COMMIT": StompConnection.on_commit,
    "ABORT": StompConnection.on_abort,
    "DISCONNECT": StompConnection.on_disconnect,
}


def negotiate_heartbeat(cx: int, cy: int, floor_ms: int) -> tuple[int, int]:
    """The CONNECTED ``heart-beat`` (sx, sy) for a client's (cx, cy): 0 where the client
    cannot send / does not want them, else what it asked, at least ``floor_ms``."""
    return (max(cy, floor_ms) if cy else 0, max(cx, floor_ms) if cx else 0)


def _heartbeat(value: str) -> tuple[int, int]:
    try:
        a, b = value.split(",")
        x, y = int(a), int(b)
        if x < 0 or y < 0:
            raise ValueError
        return x, y
    except ValueError:
        raise StompError(f"bad heart-beat header {value!r}: use 'cx,cy'") from None


def message_frame(ev: MessageDispatched, subscription: str, *, ack: bool = True) -> Frame:
    """The MESSAGE frame for a dispatched message.

    ``ack``: the subscription needs acknowledgements (client modes), so the frame carries
    an ``ack`` header. STOMP 1.2 leaves it out in auto mode, where a client acknowledging
    anyway would get an ERROR (the message is no longer waiting) and lose its connection.
    """
    m = ev.message
    h = {
        "subscription": subscription,
        "message-id": m.message_id,
        "destination": str(m.destination),
        "content-type": _CONTENT_TYPES[m.body_type],
        "joms-body-type": m.body_type,
        "persistent": "true" if m.delivery_mode == mdl.PERSISTENT else "false",
        "priority": str(m.priority),
        "timestamp": str(m.timestamp),
        "expires": str(m.expiration),
    }
    if ack:
        h["ack"] = ev.tag
    if m.redelivered:
        h["redelivered"] = "true"
    if m.null_text:
        h[NULL_TEXT_HEADER] = "true"
    # JMS 1.1 §3.5.9: set by the provider on receive (a property: one more header, an int)
    h[mdl.DELIVERY_COUNT_PROPERTY] = str(m.jmsx_delivery_count)
    if m.correlation_id is not None:
        h["correlation-id"] = m.correlation_id
    if m.reply_to is not None:
        h["reply-to"] = m.reply_to
    if m.type is not None:
        h["type"] = m.type
    if m.original_destination is not None:  # a dead letter (ActiveMQ's header name)
        h["original-destination"] = m.original_destination
    if m.dlq_reason is not None:
        h["dlq-reason"] = m.dlq_reason
    types = {mdl.DELIVERY_COUNT_PROPERTY: "int"}
    for name, value in m.properties.items():
        t = m.property_types.get(name) or mdl.property_type_of(value)
        types[name] = t
        h.setdefault(name, mdl.encode_property(value, t))
    enc = mdl.encode_types(types)
    if enc:
        h["joms-types"] = enc
    return Frame("MESSAGE", h, m.body)


async def serve(
    service_host: Any,
    host: str = "127.0.0.1",
    port: int = 61613,
    *,
    login: str | None = None,
    passcode: str | None = None,
    allow_remote: bool = False,
    limits: FrameLimits | None = None,
    heartbeat_ms: int = HEARTBEAT_MS,
    connect_timeout: float = CONNECT_TIMEOUT,
    write_window: int = WRITE_WINDOW,
    write_timeout: float = WRITE_TIMEOUT,
) -> asyncio.Server:
    """Start the STOMP gateway; returns the listening :class:`asyncio.Server`.

    ``heartbeat_ms`` is the shortest heart-beat period agreed to (a client silent for
    twice the agreed period is disconnected). ``service_host`` is a
    :class:`~joms.stomp.host.GatewayHost` or the daemon's
    ``ServiceHost`` (adapted by :func:`~joms.stomp.host.from_daemon_host`). Only loopback
    addresses are accepted unless ``allow_remote`` is true.
    """
    allow_remote = allow_remote or bool(getattr(service_host, "stomp_allow_remote", False))
    if login is None and passcode is None:
        login = getattr(service_host, "stomp_login", None)
        passcode = getattr(service_host, "stomp_passcode", None)
    if not allow_remote and not is_loopback_name(host):
        raise PermissionError(
            errno.EACCES,
            f"refusing to serve STOMP on {host}: only loopback addresses unless remote "
            "access is enabled",
        )
    if (login is None) != (passcode is None):
        raise ValueError("login and passcode go together")
    ghost = as_gateway_host(service_host)
    gateway = Gateway(
        ghost,
        login=login,
        passcode=passcode,
        limits=limits,
        heartbeat_ms=heartbeat_ms,
        connect_timeout=connect_timeout,
        write_window=write_window,
        write_timeout=write_timeout,
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(gateway.protocol, host, port)
    server.gateway = gateway  # type: ignore[attr-defined]
    return server
