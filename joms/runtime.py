"""A small in-process JOMS host on asyncio: a real core node on a loopback UDP socket, the
JOMS service and the STOMP gateway. For tests, examples and benchmarks (the daemon,
``dodwan daemon --stomp``, is the production runner).

Peers are explicit: every datagram the node sends to BROADCAST goes to each configured peer
address (unicast on 127.0.0.1), so several hosts can run in one process or several
processes on one machine without multicast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dodwan import BROADCAST, MessageDelivered, Node, NodeConfig
from dodwan.daemon.collector import settle_collector
from dodwan.daemon.private import private_dir

from .service import JomsService, ServiceConfig
from .service.core_port import NodePort
from .service.store import MemoryServiceStore, ServiceStore, SqliteServiceStore
from .stomp.host import ServiceDriver
from .stomp.server import serve

log = logging.getLogger(__name__)


@dataclass
class HostConfig:
    """Settings of one in-process host."""

    host_id: str
    """DoDWAN host id."""
    udp_port: int = 0
    """UDP port on 127.0.0.1 (0 = any free port)."""
    stomp_port: int = 0
    """STOMP port on 127.0.0.1 (0 = any free port)."""
    peers: list[tuple[str, int]] = field(default_factory=list)
    """UDP addresses of the other hosts (127.0.0.1 only)."""
    state_dir: Path | None = None
    """Directory for ``joms.sqlite`` (None = memory: state is lost on stop)."""
    node: dict[str, Any] = field(default_factory=lambda: {"announce_period": 0.2})
    """Extra :class:`NodeConfig` fields."""
    service: ServiceConfig = field(default_factory=ServiceConfig)
    login: str | None = None
    passcode: str | None = None
    heartbeat_ms: int = 1_000
    """Shortest STOMP heart-beat period the gateway agrees to (ms)."""


def _node_store(path: Path) -> Any:
    """The daemon's SQLite cache store when available (the cache survives a restart)."""
    try:
        from dodwan.daemon.sqlite_store import SqliteStore
    except ImportError:
        return None
    return SqliteStore(path)


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, host: LoopbackHost) -> None:
        self.host = host

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.host._on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:  # peers that are down: ignore
        pass


class LoopbackHost:
    """One DoDWAN + JOMS host inside the current asyncio loop."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.host_id = config.host_id
        self.peers: list[tuple[str, int]] = list(config.peers)
        self.node: Node | None = None
        self.service: JomsService | None = None
        self.driver: ServiceDriver | None = None
        self.store: ServiceStore | None = None
        self.server: asyncio.Server | None = None
        self.udp: asyncio.DatagramTransport | None = None
        self.udp_address: tuple[str, int] = ("127.0.0.1", config.udp_port)
        self.stomp_address: tuple[str, int] = ("127.0.0.1", config.stomp_port)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._node_store: Any = None

    @staticmethod
    def now() -> float:
        return time.time()

    @property
    def stomp_url(self) -> str:
        return f"stomp://{self.stomp_address[0]}:{self.stomp_address[1]}"

    async def start(self) -> LoopbackHost:
        loop = asyncio.get_running_loop()
        cfg = self.config
        node_store = None
        if cfg.state_dir is not None:
            private_dir(Path(cfg.state_dir))  # owner-only: it holds every payload
            node_store = _node_store(Path(cfg.state_dir) / "node.sqlite")
        self._node_store = node_store
        self.node = Node(
            NodeConfig(host_id=cfg.host_id, **cfg.node), rng=random.Random(), store=node_store
        )
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=("127.0.0.1", cfg.udp_port)
        )
        self.udp = transport
        self.udp_address = transport.get_extra_info("sockname")[:2]
        if cfg.state_dir is not None:
            private_dir(Path(cfg.state_dir))
            self.store = SqliteServiceStore(Path(cfg.state_dir) / "joms.sqlite")
        else:
            self.store = MemoryServiceStore()
        port = NodePort(self.node, self.now, volatile=getattr(node_store, "volatile", None))
        self.service = JomsService(port, cfg.service, self.store)
        self.driver = ServiceDriver(
            self.service, self.now, self._flush, batch=getattr(node_store, "hold", None)
        )
        self.service.start(self.now())
        self.server = await serve(
            self.driver,
            "127.0.0.1",
            cfg.stomp_port,
            login=cfg.login,
            passcode=cfg.passcode,
            heartbeat_ms=cfg.heartbeat_ms,
        )
        self.stomp_address = self.server.sockets[0].getsockname()[:2]
        self.driver.poke()
        return self

    async def stop(self) -> None:
        """Close clients, the gateway, the socket; the SQLite state stays on disk."""
        if self.server is not None:
            gw = getattr(self.server, "gateway", None)
            self.server.close()
            if gw is not None:  # clients told and disconnected, pending acks published
                gw.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)
            self.server = None
        if self.driver is not None:
            self.driver.close()
        if self._timer is not None:
            self._timer.cancel()
        if self.udp is not None:
            self.udp.close()
            self.udp = None
        if self.store is not None:
            self.store.close()
            self.store = None
        closer = getattr(self._node_store, "close", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                closer()
        self._node_store = None

    # ------------------------------------------------------------------ node plumbing
    def _on_datagram(self, data: bytes, addr: Hashable) -> None:
        if self.node is None or self.driver is None:
            return
        self.node.receive_datagram(data, addr, self.now())
        self.driver.poke()

    def _flush(self) -> None:
        """Drain node events into the service, send datagrams, re-arm the node timer."""
        node, service = self.node, self.service
        if node is None or service is None:
            return
        while (ev := node.next_event()) is not None:
            if isinstance(ev, MessageDelivered) and ev.subscription.startswith("joms:"):
                service.on_delivery(ev.subscription, ev.descriptor, ev.payload, self.now())
        for data, dest in node.datagrams_to_send(self.now()):
            if self.udp is None:
                break
            targets = self.peers if dest == BROADCAST else [dest]
            for addr in targets:
                with contextlib.suppress(OSError):
                    self.udp.sendto(data, addr)  # type: ignore[arg-type]
        at = node.get_timer()
        if at is not None and at != self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, at - self.now()), self._on_node_timer
            )

    def _on_node_timer(self) -> None:
        self._timer = self._timer_at = None
        if self.node is None or self.driver is None:
            return
        self.node.handle_timer(self.now())
        self.driver.poke()


async def start_hosts(
    count: int, *, prefix: str = "h", state_root: Path | None = None, **kw: Any
) -> list[LoopbackHost]:
    """Start ``count`` hosts that all hear each other (a full mesh on loopback)."""
    hosts = []
    for i in range(count):
        hid = f"{prefix}{i + 1}"
        sd = state_root / hid if state_root is not None else None
        hosts.append(await LoopbackHost(HostConfig(hid, state_dir=sd, **kw)).start())
    for h in hosts:
        h.peers = [o.udp_address for o in hosts if o is not h]
    return hosts


def main(argv: list[str] | None = None) -> int:
    """``python -m joms.runtime --host-id H --stomp 127.0.0.1:61613 [--udp PORT] [--peer PORT…]``.

    Runs one loopback host until interrupted (for benchmarks and manual tests; the real
    daemon is ``dodwan daemon --stomp``).
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m joms.runtime", description=main.__doc__)
    ap.add_argument("--host-id", default="joms1")
    ap.add_argument("--stomp", default="127.0.0.1:61613", help="STOMP address (loopback)")
    ap.add_argument("--udp", type=int, default=0, help="UDP port on 127.0.0.1")
    ap.add_argument("--peer", type=int, action="append", default=[], help="peer UDP port")
    ap.add_argument("--state-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    shost, _, sport = args.stomp.rpartition(":")
    if shost not in ("127.0.0.1", "localhost", "::1"):
        ap.error("the test runtime only serves STOMP on loopback")

    async def run() -> None:
        h = LoopbackHost(
            HostConfig(
                args.host_id,
                udp_port=args.udp,
                stomp_port=int(sport),
                peers=[("127.0.0.1", p) for p in args.peer],
                state_dir=args.state_dir,
            )
        )
        await h.start()
        settle_collector()
        print(f"JOMS host {h.host_id}: STOMP on {h.stomp_url}, UDP {h.udp_address}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await h.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
