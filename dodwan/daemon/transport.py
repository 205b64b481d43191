"""UDP sockets between hosts: IPv4 multicast, IPv4 broadcast, IPv6 link-local multicast.

The kind of medium follows from the group address: ``224.0.0.0/4`` is IPv4 multicast, an
IPv6 ``ff02::/16`` address is IPv6 link-local multicast, any other IPv4 address (e.g.
``255.255.255.255`` or a subnet broadcast address) is IPv4 broadcast. Datagrams go out of
the one named interface only (multicast interface option, ``SO_BINDTODEVICE`` when
permitted, TTL/hop limit 1). Two sockets per host: one bound to the group port (shared by
every daemon on the machine through ``SO_REUSEADDR``/``SO_REUSEPORT``) that receives, and one
on an ephemeral port that sends, so each host shows up with its own source address.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .netkey import NetKey

SIOCGIFADDR = 0x8915
SIOCGIFBRDADDR = 0x8919
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)


class TransportError(Exception):
    """The medium cannot be set up (bad address, unknown interface, refused option)."""


@dataclass(frozen=True, slots=True)
class Medium:
    """Where datagrams go: a parsed ``--group`` and ``--interface``."""

    kind: str
    """``multicast4``, ``broadcast4`` or ``multicast6``."""
    group: str
    port: int
    interface: str


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); raises ValueError with a clear message."""
    text = text.strip()
    host: str
    port_text: str
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"bad address {text!r}: missing ']'")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        host, port_text = text, ""
    else:
        host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise ValueError(f"bad address {text!r}: expected HOST:PORT")
        port = default_port
    else:
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"bad address {text!r}: port must be a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"bad address {text!r}: port must be between 0 and 65535")
    if not host:
        raise ValueError(f"bad address {text!r}: missing host")
    return host, port


def medium_for(group: str, interface: str) -> Medium:
    """Classify ``group`` (``ADDR:PORT``) on ``interface``; raises ValueError when unusable."""
    host, port = parse_address(group)
    if port == 0:
        raise ValueError(f"bad group {group!r}: the port must not be 0")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"bad group {group!r}: {host!r} is not an IP address") from None
    if ip.version == 6:
        if not ip.is_multicast or (int(ip) >> 112) & 0xF != 2:
            raise ValueError(
                f"bad group {group!r}: an IPv6 group must be a link-local multicast address (ff02::/16)"
            )
        kind = "multicast6"
    elif ip.is_multicast:
        kind = "multicast4"
    elif ip.is_unspecified:
        raise ValueError(f"bad group {group!r}: 0.0.0.0 is not a destination")
    else:
        kind = "broadcast4"
    if not interface or len(interface) > 15:
        raise ValueError(f"bad interface name {interface!r}")
    return Medium(kind, str(ip), port, interface)


def _ifreq(sock: socket.socket, request: int, name: str) -> str:
    packed = struct.pack("256s", name.encode()[:15])
    try:
        res = fcntl.ioctl(sock.fileno(), request, packed)
    except OSError as exc:
        raise TransportError(f"interface {name!r}: {exc.strerror}") from None
    return socket.inet_ntoa(res[20:24])


def interface_ipv4(name: str) -> str:
    """The IPv4 address of interface ``name``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return _ifreq(s, SIOCGIFADDR, name)


def interface_index(name: str) -> int:
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise TransportError(f"no interface named {name!r}") from None


def _big_buffers(sock: socket.socket, size: int) -> None:
    for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, size)


def _bind_to_device(sock: socket.socket, name: str) -> None:
    """Restrict the socket to one interface when the system permits (root / CAP_NET_RAW)."""
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, name.encode())


def _reuse(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)


def open_sockets(
    medium: Medium, buffer_size: int, ttl: int = 1
) -> tuple[socket.socket, socket.socket, tuple[object, ...]]:
    """Create (receiving socket, sending socket, destination address) for ``medium``."""
    try:
        if medium.kind == "multicast6":
            return _open_v6(medium, buffer_size, ttl)
        return _open_v4(medium, buffer_size, ttl)
    except TransportError:
        raise
    except OSError as exc:
        raise TransportError(
            f"cannot use {medium.group}:{medium.port} on {medium.interface}: {exc.strerror or exc}"
        ) from None


def _open_v4(
    medium: Medium, buffer_size: int, ttl: int
) -> tuple[socket.socket, socket.socket, tuple[object, ...]]:
    local = interface_ipv4(medium.interface)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        _reuse(rx)
        _big_buffers(rx, buffer_size)
        _big_buffers(tx, buffer_size)
        if medium.kind == "multicast4":
            rx.bind((medium.group, medium.port))
            mreq = socket.inet_aton(medium.group) + socket.inet_aton(local)
            rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(local))
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
            tx.bind((local, 0))
        else:
            _bind_to_device(rx, medium.interface)
            rx.bind(("", medium.port))
            tx.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            _bind_to_device(tx, medium.interface)
            tx.bind((local, 0))
    except BaseException:
        rx.close()
        tx.close()
        raise
    rx.setblocking(False)
    tx.setblocking(False)
    return rx, tx, (medium.group, medium.port)


def _open_v6(
    medium: Medium, buffer_size: int, ttl: int
) -> tuple[socket.socket, socket.socket, tuple[object, ...]]:
    index = interface_index(medium.interface)
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        _reuse(rx)
        _big_buffers(rx, buffer_size)
        _big_buffers(tx, buffer_size)
        rx.bind((medium.group, medium.port, 0, index))
        mreq = socket.inet_pton(socket.AF_INET6, medium.group) + struct.pack("@I", index)
        rx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
        tx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
        tx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 1)
        tx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, ttl)
        _bind_to_device(tx, medium.interface)
    except BaseException:
        rx.close()
        tx.close()
        raise
    rx.setblocking(False)
    tx.setblocking(False)
    return rx, tx, (medium.group, medium.port, 0, index)


class _Sink(asyncio.DatagramProtocol):
    """Protocol of the sending socket: nothing is expected back; errors are counted."""

    def __init__(self) -> None:
        self.errors = 0

    def error_received(self, exc: Exception) -> None:
        self.errors += 1


MAX_BATCH = 256
"""Most datagrams read per wake-up before the runner flushes its outputs."""


class UdpTransport:
    """The host's radio: send to every neighbour, hand every datagram heard to a callback.

    Reception reads the socket until it is empty (up to :data:`MAX_BATCH` datagrams) on each
    wake-up, calls ``on_datagram`` per datagram and ``on_batch`` once after, so the runner
    drains the node's outputs once per batch rather than once per datagram. Datagrams from
    this host's own sending socket (looped back by multicast/broadcast) are dropped here.
    With a :class:`~dodwan.daemon.netkey.NetKey`, every datagram is sealed on the way out and
    opened on the way in; what does not open is dropped (and counted by the key) here.
    """

    def __init__(
        self,
        medium: Medium,
        buffer_size: int = 8 << 20,
        ttl: int = 1,
        netkey: NetKey | None = None,
    ) -> None:
        self.medium = medium
        self.netkey = netkey
        self._buffer_size = buffer_size
        self._ttl = ttl
        self._rx: socket.socket | None = None
        self._rx_view = memoryview(bytearray(65535))  # reused receive buffer
        self._tx: asyncio.DatagramTransport | None = None
        self._tx_proto: _Sink | None = None
        self._dest: tuple[object, ...] = ()
        self._on_datagram: Callable[[bytes, Hashable], None] = lambda d, a: None
        self._on_batch: Callable[[], None] = lambda: None
        self.send_errors = 0
        self.receive_errors = 0
        self.own_filtered = 0
        self.local_address: tuple[object, ...] = ()

    async def start(
        self,
        on_datagram: Callable[[bytes, Hashable], None],
        on_batch: Callable[[], None] | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        rx, tx, self._dest = open_sockets(self.medium, self._buffer_size, self._ttl)
        self.local_address = tuple(tx.getsockname())
        self._on_datagram = on_datagram
        self._on_batch = on_batch or (lambda: None)
        self._rx = rx
        loop.add_reader(rx.fileno(), self._read_ready)
        proto = _Sink()
        self._tx_proto = proto
        self._tx, _ = await loop.create_datagram_endpoint(lambda: proto, sock=tx)

    def _read_ready(self) -> None:
        rx = self._rx
        if rx is None:
            return
        own = self.local_address if self.medium.kind != "multicast6" else None
        got = 0
        view = self._rx_view
        for _ in range(MAX_BATCH):
            try:
                size, addr = rx.recvfrom_into(view)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.receive_errors += 1
                break
            # One exact-size copy: recvfrom(65535) would allocate 64 KB per datagram and
            # shrink it in place, and the fragments the node keeps would then pin 64 KB
            # spans of the C heap, which grows without bound (fragmentation).
            data = bytes(view[:size])
            if addr == own:
                self.own_filtered += 1
                continue
            if self.netkey is not None:
                opened = self.netkey.open(data)
                if opened is None:
                    continue
                data = opened
            got += 1
            self._on_datagram(data, addr)
        if got:
            self._on_batch()

    def send(self, data: bytes) -> None:
        if self._tx is None or self._tx.is_closing():
            return
        if self.netkey is not None:
            data = self.netkey.seal(data)
        try:
            self._tx.sendto(data, self._dest)
        except OSError:
            self.send_errors += 1

    def close(self) -> None:
        if self._rx is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._rx.fileno())
            self._rx.close()
            self._rx = None
        if self._tx is not None:
            self._tx.close()
