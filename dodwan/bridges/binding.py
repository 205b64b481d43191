"""One binding at run time: a thread that keeps a protocol link up and drains the outbox.

The thread connects (retrying with a capped back-off while the uplink is down), then sends
the binding's unsent outbox rows in order, a batch at a time, and marks them sent only once
the broker confirmed the batch. Messages the link receives are handed to the event loop
(``on_inbound``), published in DoDWAN there, and acknowledged to the broker only after that
publication is committed. Everything blocking happens on this thread; the event loop only
enqueues rows and pokes :meth:`wake`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .mapping import Inbound
from .outbox import Outbox, OutRow
from .refusals import Refusals
from .uri import BindingSpec

log = logging.getLogger("dodwan.bridges")

BATCH = 64
BACKOFF_MIN = 0.2
BACKOFF_MAX = 5.0
DRAIN_QUIET = 0.5
"""After a (re)connection, a two-way binding takes in what the broker kept for it until
nothing came for this long, before it sends (see :meth:`Binding._drain`)."""
DRAIN_MAX = 15.0
STALLED = 3.0
"""Seconds between two turns of a binding's loop (at most about 1 s apart while it runs)
that show the process stood still: it then reads what came meanwhile before sending."""


class LinkError(Exception):
    """The link to the broker failed (reconnect)."""


class Refused(LinkError):
    """The broker refused the batch sent, for one of its messages (the link is lost too):
    none of it is on the broker. Its messages are then sent one at a time, and one the
    broker refuses alone is held back (see :class:`~.refusals.Refusals`)."""


class Dropped(LinkError):
    """The connection was lost while the batch was sent, and nobody said why: a network
    cut, or a broker that refuses one of its messages by closing the connection without
    an answer (ActiveMQ does so for some STOMP headers). Its messages are then sent one at
    a time, and one whose sending alone is followed by such a close again, several times in
    a row, is held back as refused (see :meth:`~.refusals.Refusals.dropped`)."""


class Unsendable(Exception):
    """Some messages of the batch cannot be put into the protocol's frames at all (found
    before anything was sent: an AMQP short string over 255 bytes, a header the broker is
    known to reject): the link sent the others, which the broker confirmed; these are
    refused, each alone, and held back (the link stays up)."""

    def __init__(self, refused: dict[int, str]) -> None:
        self.refused = refused
        """Outbox sequence number -> why that message cannot be sent."""
        reasons = sorted(set(refused.values()))
        super().__init__(f"{len(refused)} message(s) cannot be sent: {'; '.join(reasons)}")


def send_sendable(
    rows: list[OutRow],
    why_not: Callable[[OutRow], str],
    send: Callable[[list[OutRow]], None],
) -> None:
    """Send (``send``) the rows the protocol can carry, then raise :class:`Unsendable` for
    those ``why_not`` says it cannot (a non-empty reason), so that they are held back."""
    bad = {r.seq: why for r in rows if (why := why_not(r))}
    rows = [r for r in rows if r.seq not in bad]
    if rows:
        send(rows)
    if bad:
        raise Unsendable(bad)


class Link(Protocol):
    """A protocol client bound to one remote destination (used from one thread)."""

    def connect(self) -> None:
        """Connect, subscribe when inbound; raise on failure."""

    def send(self, rows: list[OutRow]) -> None:
        """Send the rows and return once the broker has confirmed them all; raise on failure
        (:class:`Unsendable` once the broker has confirmed all the others)."""

    def left_out(self) -> list[tuple[str, list[str], str]]:
        """What the last :meth:`send` had to leave out: (DoDWAN id, attribute names, why)
        per message sent without some of its attributes (taken: the next call starts
        empty)."""

    def committed(self) -> set[str]:
        """Ids of the last batch the broker committed, from its ledger (empty: no ledger)."""

    def poll(self, timeout: float, wake: threading.Event) -> None:
        """Serve the connection for up to ``timeout`` s or until ``wake``; raise when it is lost."""

    def disconnect(self) -> None:
        """Drop the connection after a failure; :meth:`connect` is called again (never raises)."""

    def close(self) -> None:
        """Disconnect for good (never raises)."""


InboundHandler = Callable[[Inbound], bool]
"""Publishes an inbound message in DoDWAN; True when it is safe to acknowledge it."""


class _Retired(Exception):
    """A retired binding's link does not connect (again)."""


class Binding:
    """The thread of one binding; state read by the loop for status."""

    def __init__(
        self,
        spec: BindingSpec,
        outbox: Outbox,
        make_link: Callable[[BindingSpec, InboundHandler], Link],
        on_inbound: Callable[[Binding, Inbound], bool],
        paused: bool = False,
    ) -> None:
        self.spec = spec
        self.outbox = outbox
        self._make_link = make_link
        self._on_inbound = on_inbound
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._retired = threading.Event()
        self._attempt = threading.Lock()
        """Held while the link connects (see :meth:`retire`)."""
        if not paused:
            self._resume.set()
        self.ready = threading.Event()
        """Set once the link is up for the first time."""
        self.tried = threading.Event()
        """Set once the first connection attempt succeeded or failed."""
        self._idle = threading.Event()
        self._idle.set()
        self.connected = False
        self.errors = 0
        self.last_error = ""
        self.sent = 0
        self.received = 0
        self.echoes = 0
        self.duplicates = 0
        self.settled = 0
        """Messages found committed in the broker's ledger after a reconnection."""
        self.filtered = 0
        """Messages the binding's selector kept from crossing (both ways)."""
        self.connects = 0
        self.refusals = Refusals()
        self.left_out = 0
        """Messages sent without some of their attributes (the protocol cannot carry them;
        each is logged with their names)."""
        self._taken = 0
        self._never = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"bridge-{spec.name}", daemon=True)

    # ------------------------------------------------------------------ control (loop side)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def pause(self) -> None:
        """Stop sending (the batch in flight is finished first: wait for :attr:`idle`)."""
        self._resume.clear()
        self._wake.set()

    def resume(self) -> None:
        self._resume.set()
        self._wake.set()

    def retire(self, timeout: float) -> None:
        """Keep the current connection but never reconnect (a replacement is coming).
        Blocking (call from an executor): a connection attempt in flight is waited for, up
        to ``timeout``, as it would take a session over from the replacement's (an MQTT
        client id) when it reached the broker after it."""
        self._retired.set()
        if self._attempt.acquire(timeout=timeout):
            self._attempt.release()

    def unretire(self) -> None:
        self._retired.clear()

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Close the link and end the thread (blocking; call from an executor)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        return {
            "connected": self.connected,
            "sent": self.sent,
            "received": self.received,
            "errors": self.errors,
            "last_error": self.last_error,
            "echoes": self.echoes,
            "duplicates": self.duplicates,
            "filtered": self.filtered,
            "settled": self.settled,
            "connects": self.connects,
            "refused": len(self.refusals.held),
            "left_out": self.left_out,
            "paused": not self._resume.is_set(),
        }

    # ------------------------------------------------------------------ thread

    def _inbound(self, msg: Inbound) -> bool:
        if self._stop.is_set():
            return False
        self._taken += 1
        return self._on_inbound(self, msg)

    def leave_out(self, msg_id: str, names: list[str], why: str) -> None:
        """A message goes without the attributes ``names`` (called by the link)."""
        self.left_out += 1
        log.warning(
            "bridge %s: message %s sent without its attribute(s) %s (%s)",
            self.spec.name,
            msg_id,
            ", ".join(repr(n) for n in names),
            why,
        )

    def record_error(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def _run(self) -> None:
        backoff = BACKOFF_MIN
        name = self.spec.name
        link = self._make_link(self.spec, self._inbound)
        try:
            while not self._stop.is_set():
                try:
                    with self._attempt:
                        if self._retired.is_set():
                            raise _Retired
                        link.connect()
                    self.connected = True
                    self.connects += 1
                    self.ready.set()
                    self.tried.set()
                    backoff = BACKOFF_MIN
                    log.info("bridge %s connected to %s", name, self.spec.endpoint.display)
                    if self.spec.outbound:
                        self._settle(link)
                        if self.spec.inbound:
                            self._drain(link)
                    self._serve(link)
                except _Retired:
                    pass
                except Exception as exc:
                    if not self._stop.is_set():
                        self.record_error(exc)
                        log.warning("bridge %s: %s (retrying)", name, self.last_error)
                    self.tried.set()
                    link.disconnect()
                finally:
                    self.connected = False
                    self._idle.set()
                while self._retired.is_set() and not self._stop.is_set():
                    self._stop.wait(0.2)
                # A broker refusing what it is sent accepts the connection every time:
                # back off by refusals, not from the minimum again.
                strikes = min(self.refusals.strikes, 8)
                if self._stop.wait(max(backoff, min(BACKOFF_MAX, BACKOFF_MIN * 2**strikes))):
                    break
                backoff = min(BACKOFF_MAX, backoff * 2)
        finally:
            link.close()

    def _settle(self, link: Link) -> None:
        """Mark sent what the broker's ledger says it committed although its answer never
        came (the connection broke between the commit and the confirmation)."""
        seqs = self.outbox.pending_seqs(self.spec.name, link.committed())
        n = self.outbox.mark_sent(self.spec.name, seqs)
        if n:
            self.sent += n
            self.settled += n
            log.info(
                "bridge %s: %d message(s) the broker had committed before the link broke are "
                "marked sent, not sent again",
                self.spec.name,
                n,
            )

    def _drain(self, link: Link) -> None:
        """Before sending after a (re)connection, take in what the broker kept for the
        binding while it was away (MQTT session, AMQP queue): among it, the echoes of what
        another gateway sent meanwhile, which this one must then not send again."""
        end = time.monotonic() + DRAIN_MAX
        while time.monotonic() < end and not self._stop.is_set():
            before = self._taken
            link.poll(DRAIN_QUIET, self._never)
            if self._taken == before:
                return

    def _serve(self, link: Link) -> None:
        name = self.spec.name
        turn = time.monotonic()
        while not self._stop.is_set():
            if self.spec.inbound and time.monotonic() - turn > STALLED:
                # The process stood still (SIGSTOP, a paused machine) with its connection
                # up: what another gateway sent meanwhile waits unread, as after a
                # reconnection. Read it first, or this one sends those messages again.
                # (A send that took that long, stopped or slow, drains too: at worst a
                # pause of DRAIN_QUIET.)
                self._drain(link)
            turn = time.monotonic()
            if not (self.spec.outbound and self._resume.is_set()):
                self._idle.set()
                link.poll(0.2, self._wake)
                self._wake.clear()
                continue
            self._idle.clear()
            if not self._resume.is_set():  # paused between the check and clear
                self._idle.set()
                continue
            now = time.time()
            rows = self.outbox.pending(name, now, BATCH, self.refusals.withheld(now))
            rows = list(self.refusals.batch(rows, [r.seq for r in rows]))
            if rows:
                seqs = [r.seq for r in rows]
                try:
                    link.send(rows)
                except Unsendable as exc:
                    # The others went; these stay in the outbox, held back, each alone.
                    for seq in exc.refused:
                        self.refusals.refused([seq], now)
                    seqs = [s for s in seqs if s not in exc.refused]
                    self.record_error(exc)
                    log.warning("bridge %s: %s (held back)", name, self.last_error)
                except Refused:
                    self.refusals.refused(seqs, now)
                    raise
                except Dropped:
                    self.refusals.dropped(seqs, now)
                    raise
                for msg_id, names, why in link.left_out():
                    self.leave_out(msg_id, names, why)
                self.refusals.sent(seqs)
                self.sent += self.outbox.mark_sent(name, seqs)
                link.poll(0.0, self._wake)  # serve inbound traffic between batches
                continue
            self._idle.set()
            due = self.outbox.next_due(name, self.refusals.withheld(now))
            timeout = 1.0 if due is None else min(1.0, max(0.01, due - now))
            link.poll(timeout, self._wake)
            self._wake.clear()
