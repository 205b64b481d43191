"""A loopback TCP relay that can lose the broker's answer to a commit.

The gateway connects to the relay, which relays to the broker. Once armed with a marker
(the bytes of a commit: STOMP ``COMMIT``, AMQP ``tx.commit``), the relay forwards the
client's chunk that holds it, so the broker commits, then drops whatever the broker answers
and closes both connections: the gateway cannot tell whether the batch was committed. That
is exactly the window a broker stopped at the wrong moment opens, made deterministic.

It can also cut the uplink of one gateway only (:meth:`block`, :meth:`unblock`): existing
connections are closed and new ones refused, while the broker keeps running for others; and
:meth:`hold` what the broker sends one client (its messages stay unacknowledged at the
broker, as when the gateway is slow to take them in); and :meth:`stall` new connections: what
their clients send reaches the broker only at :meth:`release` (a connection attempt that
takes long, e.g. to a broker far away).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from brokers import free_port


class CutProxy:
    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = free_port()
        self._marker: bytes | None = None
        self._forward = True
        self.cuts = 0
        self.cut_done = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._first: dict[socket.socket, bytes] = {}
        """The first chunk each relayed client sent (e.g. its MQTT CONNECT)."""
        self._held: dict[socket.socket, threading.Event] = {}
        self._blocked = threading.Event()
        self._released = threading.Event()
        self._released.set()
        self._poison: bytes | None = None
        self.poisoned = 0
        """Connections closed for a chunk holding the :meth:`poison` marker."""
        self.stalled = threading.Semaphore(0)
        """Released once per connection accepted while stalled."""
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def arm(self, marker: bytes, forward: bool = True) -> None:
        """Cut the connection that next sends ``marker``, after forwarding it (or, with
        ``forward`` false, losing it: e.g. a consumer's acknowledgement)."""
        self.cut_done.clear()
        with self._lock:
            self._marker = marker
            self._forward = forward

    def poison(self, marker: bytes) -> None:
        """Close, every time, the connection that sends ``marker``, without forwarding the
        chunk holding it and without a word: a broker that refuses a frame by closing the
        connection (ActiveMQ does so for some STOMP headers)."""
        with self._lock:
            self._poison = marker

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            if self._blocked.is_set():
                client.close()
                continue
            if not self._released.is_set():
                self.stalled.release()
                threading.Thread(target=self._relay, args=(client,), daemon=True).start()
                continue
            self._relay(client)

    def _relay(self, client: socket.socket) -> None:
        if not self._released.is_set():
            self._released.wait()  # the client's bytes wait in its socket meanwhile
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        pair = (client, upstream)
        self._pairs.append(pair)
        cut = threading.Event()
        self._held[client] = threading.Event()
        for args in ((client, upstream, True, cut), (upstream, client, False, cut)):
            threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, from_client: bool, cutting: threading.Event
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                cut = False
                if from_client:
                    self._first.setdefault(src, data)
                elif self._held[dst].is_set():
                    continue  # held: the client never gets it (nor acknowledges it)
                if from_client:
                    with self._lock:
                        if self._poison is not None and self._poison in data:
                            self.poisoned += 1
                            return  # the finally clause closes both sides
                        if self._marker is not None and self._marker in data:
                            self._marker = None
                            cut = True
                if not from_client and cutting.is_set():
                    continue  # the broker's answer is lost
                if cut:
                    # The commit goes through; its answer does not.
                    cutting.set()
                    if self._forward:
                        dst.sendall(data)
                    time.sleep(1.0)  # the broker commits (and answers into the void)
                    self.cuts += 1
                    for s in (src, dst):
                        with contextlib.suppress(OSError):
                            s.close()
                    self.cut_done.set()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._first.pop(src if from_client else dst, None)  # no longer open
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def hold(self, marker: bytes) -> int:
        """From now on, drop what the broker sends on the open connections whose client's
        first chunk held ``marker`` (an MQTT client id): the broker keeps those messages
        unacknowledged in the client's session. Returns how many connections are held."""
        held = 0
        for client, _ in self._pairs:
            if marker in self._first.get(client, b""):
                self._held[client].set()
                held += 1
        return held

    def block(self) -> None:
        """The uplink is down: close every relayed connection and refuse new ones."""
        self._blocked.set()
        for pair in self._pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
        self._pairs.clear()

    def unblock(self) -> None:
        self._blocked.clear()

    def stall(self) -> None:
        """Connections accepted from now on reach the broker only at :meth:`release`."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._stop.set()
        self._released.set()
        self._listener.close()
        for pair in self._pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()
