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
import ctypes
import errno
import fcntl
import ipaddress
import logging
import math
import socket
import struct
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from .netkey import NetKey

SIOCGIFADDR = 0x8915
SIOCGIFBRDADDR = 0x8919
SIOCGIFNETMASK = 0x891B
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)


log = logging.getLogger("dodwan.daemon.transport")

SEND_WARNING_PERIOD = 60.0
"""Seconds between two warnings of failed sends (each failure is counted)."""


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
            f"cannot use {medium_text(medium)} on {medium.interface}: {exc.strerror or exc}"
        ) from None


def _check_broadcast(medium: Medium, sock: socket.socket) -> None:
    """A non-multicast IPv4 group must be a broadcast address: 255.255.255.255 or the
    interface's own. Any other (a unicast address) would be sent to one host only while
    the daemon believes it reaches every neighbour."""
    if medium.group == "255.255.255.255":
        return
    known: set[str] = set()
    with contextlib.suppress(TransportError):  # the configured one (ip addr … brd)
        known.add(_ifreq(sock, SIOCGIFBRDADDR, medium.interface))
    with contextlib.suppress(TransportError):  # the subnet's, which the kernel routes anyway
        addr = int(ipaddress.IPv4Address(_ifreq(sock, SIOCGIFADDR, medium.interface)))
        mask = int(ipaddress.IPv4Address(_ifreq(sock, SIOCGIFNETMASK, medium.interface)))
        known.add(str(ipaddress.IPv4Address(addr | (~mask & 0xFFFFFFFF))))
    known.discard("0.0.0.0")
    if medium.group not in known:
        has = f"its broadcast address is {', '.join(sorted(known))}" if known else "it has none"
        raise TransportError(
            f"group {medium_text(medium)} is neither a multicast address nor a broadcast "
            f"address of interface {medium.interface} ({has}; 255.255.255.255 also works); "
            "unicast groups are not supported"
        )


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
            _check_broadcast(medium, tx)
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


IFF_MULTICAST = 0x1000


def _check_v6_route(medium: Medium, index: int) -> None:
    """Refuse a group the interface can never carry: a route lookup (a UDP ``connect`` on a
    throwaway socket; nothing is sent) that fails on an interface without the MULTICAST
    flag (``lo``: ENETUNREACH). Every send would fail, and a daemon that started anyway
    would never meet anybody. On an interface with the flag a failure may pass (the link
    down, its address still tentative): the daemon starts, and failed sends are logged."""
    probe = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
        probe.connect((medium.group, medium.port, 0, index))
    except OSError as exc:
        if _interface_flags(medium.interface) & IFF_MULTICAST:
            return  # for a moment (the link down, its address still tentative): sends retry
        raise TransportError(
            f"group {medium_text(medium)} cannot be reached through interface "
            f"{medium.interface} ({exc.strerror or exc}): {medium.interface} has no MULTICAST "
            "flag; IPv6 multicast needs an interface with it (on lo, use an IPv4 group such "
            "as 239.255.42.42:8500)"
        ) from None
    finally:
        probe.close()


def _interface_flags(name: str) -> int:
    """The interface's flags (``IFF_*``), 0 when they cannot be read."""
    try:
        return int(Path(f"/sys/class/net/{name}/flags").read_text(), 16)
    except (OSError, ValueError):
        return 0


def medium_text(medium: Medium) -> str:
    """The group as ``--group`` takes it: ``[ff02::4242]:8500``, ``239.255.42.42:8500``."""
    if ":" in medium.group:
        return f"[{medium.group}]:{medium.port}"
    return f"{medium.group}:{medium.port}"


def _open_v6(
    medium: Medium, buffer_size: int, ttl: int
) -> tuple[socket.socket, socket.socket, tuple[object, ...]]:
    index = interface_index(medium.interface)
    _check_v6_route(medium, index)
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


SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO = getattr(socket, "UDP_GRO", 104)
_GRO_ANC_SIZE = socket.CMSG_SPACE(4)
GSO_MAX_SEGMENTS = 64
"""Most datagrams handed to the kernel in one segmentation-offload call."""
GSO_MAX_BYTES = 65000
"""Most bytes in one such call (an IPv4 UDP payload is at most 65,507 bytes)."""
NO_GSO_ERRNOS = frozenset({errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
"""Errors of an offloaded send that mean the system cannot offload (an interface without
checksum offload, a kernel without ``UDP_SEGMENT``): offload is then off for good. Any
other error (an address not usable yet, a network down for a moment) fails only that run,
whose datagrams are then tried one by one like any other."""


def gso_groups(datagrams: list[bytes]) -> list[tuple[int, int]]:
    """Split ``datagrams`` into runs ``[start, end)`` that one UDP GSO send can carry: equal
    sizes, except that a shorter one may end a run, within the segment and byte caps."""
    groups: list[tuple[int, int]] = []
    i, n = 0, len(datagrams)
    while i < n:
        size = total = len(datagrams[i])
        j = i + 1
        while j < n and j - i < GSO_MAX_SEGMENTS:
            length = len(datagrams[j])
            if length > size or total + length > GSO_MAX_BYTES:
                break
            total += length
            j += 1
            if length < size:
                break
        groups.append((i, j))
        i = j
    return groups


SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)
_SKF_NET_OFF = -0x100000


def drop_own_in_kernel(rx: socket.socket, own: tuple[str, int]) -> bool:
    """Attach a classic BPF filter to ``rx`` that drops datagrams from ``own`` (IPv4 address,
    port) in the kernel: a host hears each of its own multicast datagrams back, and reading
    them only to throw them away cost as much as a plain sender's whole send.

    The filter sees a UDP datagram from its UDP header; the IPv4 source is read at the
    network-header offset. Returns False (the caller then filters in Python) when the
    system refuses the filter.
    """
    ip = int.from_bytes(socket.inet_aton(own[0]), "big")
    program = [
        (0x28, 0, 0, 0),  # ldh [0]: UDP source port
        (0x15, 0, 3, own[1]),  # jeq port ? next : accept
        (0x20, 0, 0, (_SKF_NET_OFF + 12) & 0xFFFFFFFF),  # ld [net + 12]: IPv4 source
        (0x15, 0, 1, ip),  # jeq ip ? drop : accept
        (0x06, 0, 0, 0),  # ret 0: drop
        (0x06, 0, 0, 0xFFFFFFFF),  # ret: accept all of it
    ]
    code = b"".join(struct.pack("=HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("@HP", len(program), ctypes.addressof(buf))
    try:
        rx.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True


class _Sink(asyncio.DatagramProtocol):
    """Protocol of the sending socket: nothing is expected back; errors are counted."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.errors = 0
        self._on_error = on_error

    def error_received(self, exc: Exception) -> None:
        self.errors += 1
        self._on_error(exc)


MAX_BATCH = 256
"""Most datagrams read per wake-up before the runner flushes its outputs."""


class UdpTransport:
    """The host's radio: send to every neighbour, hand every datagram heard to a callback.

    Reception reads the socket until it is empty (up to :data:`MAX_BATCH` datagrams) on each
    wake-up, calls ``on_datagram`` per datagram and ``on_batch`` once after, so the runner
    drains the node's outputs once per batch rather than once per datagram. Datagrams from
    this host's own sending socket (looped back by multicast/broadcast) are dropped by a
    kernel socket filter where the system accepts one (IPv4 on Linux), else here.
    With a :class:`~dodwan.daemon.netkey.NetKey`, every datagram is sealed on the way out and
    opened on the way in; what does not open is dropped (and counted by the key) here.
    """

    def __init__(
        self,
        medium: Medium,
        buffer_size: int = 8 << 20,
        ttl: int = 1,
        netkey: NetKey | None = None,
        offload: bool = True,
    ) -> None:
        self.medium = medium
        self.netkey = netkey
        self.offload = offload
        """Send runs of equal-sized datagrams with one UDP GSO call (turned off by itself
        when the system refuses it)."""
        self.offload_error: str | None = None
        self.gro = False
        """Coalesced datagrams (UDP GRO) are read in one call and split here."""
        self.coalesced = 0
        """Reads that returned several datagrams at once."""
        self._buffer_size = buffer_size
        self._ttl = ttl
        self._rx: socket.socket | None = None
        self._rx_view = memoryview(bytearray(65535))  # reused receive buffer
        self._tx: asyncio.DatagramTransport | None = None
        self._tx_sock: socket.socket | None = None
        self._tx_proto: _Sink | None = None
        self._dest: tuple[object, ...] = ()
        self._on_datagram: Callable[[bytes, Hashable], None] = lambda d, a: None
        self._on_batch: Callable[[], None] = lambda: None
        self.send_errors = 0
        self._send_warned = -math.inf
        self.receive_errors = 0
        self.own_filtered = 0
        self.own_filtered_in_kernel = False
        self.local_address: tuple[object, ...] = ()

    async def start(
        self,
        on_datagram: Callable[[bytes, Hashable], None],
        on_batch: Callable[[], None] | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        rx, tx, self._dest = open_sockets(self.medium, self._buffer_size, self._ttl)
        name = tx.getsockname()
        self.local_address = tuple(name)
        self._on_datagram = on_datagram
        self._on_batch = on_batch or (lambda: None)
        self._rx = rx
        if self.medium.kind != "multicast6":
            self.own_filtered_in_kernel = drop_own_in_kernel(rx, (name[0], name[1]))
        if self.offload:
            try:  # read runs of datagrams one peer sent at once in one call
                rx.setsockopt(SOL_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                self.gro = False
        loop.add_reader(rx.fileno(), self._read_ready)
        proto = _Sink(self._warn_send_error)
        self._tx_proto = proto
        self._tx, _ = await loop.create_datagram_endpoint(lambda: proto, sock=tx)
        self._tx_sock = tx

    def _read_ready(self) -> None:
        rx = self._rx
        if rx is None:
            return
        own = self.local_address if self.medium.kind != "multicast6" else None
        got = 0
        view = self._rx_view
        gro = self.gro
        for _ in range(MAX_BATCH):
            segment = 0
            try:
                if gro:
                    size, anc, _flags, addr = rx.recvmsg_into([view], _GRO_ANC_SIZE)
                    for level, kind, value in anc:
                        if level == SOL_UDP and kind == UDP_GRO and len(value) >= 4:
                            segment = int.from_bytes(value[:4], sys.byteorder)
                else:
                    size, addr = rx.recvfrom_into(view)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.receive_errors += 1
                break
            if addr == own:
                self.own_filtered += 1
                continue
            if segment <= 0:
                segment = size or 1
            elif size > segment:
                self.coalesced += 1
            for start in range(0, size or 1, segment):
                # One exact-size copy per datagram: recvfrom(65535) would allocate 64 KB
                # per datagram and shrink it in place, and the fragments the node keeps
                # would then pin 64 KB spans of the C heap (fragmentation).
                data = bytes(view[start : min(start + segment, size)])
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
        """Send one datagram (the paced path)."""
        self.send_many([data])

    def send_many(self, datagrams: list[bytes]) -> None:
        """Send datagrams in order: straight on the socket while it takes them (runs of equal
        size in one segmentation-offload call when enabled), through the event loop's
        buffer once it is full (or already holds some)."""
        tx, sock = self._tx, self._tx_sock
        if tx is None or sock is None or tx.is_closing():
            return
        if self.netkey is not None:
            datagrams = [self.netkey.seal(d) for d in datagrams]
        dest = self._dest
        i = 0
        if not tx.get_write_buffer_size():
            i = self._send_direct(sock, datagrams, dest)
        for data in datagrams[i:]:
            try:
                tx.sendto(data, dest)
            except OSError as exc:
                self.send_errors += 1
                self._warn_send_error(exc)

    def _send_direct(
        self, sock: socket.socket, datagrams: list[bytes], dest: tuple[object, ...]
    ) -> int:
        """Send on the socket until it would block; returns how many datagrams were handled."""
        sendto = sock.sendto
        groups = gso_groups(datagrams) if self.offload else [(0, len(datagrams))]
        for start, end in groups:
            if self.offload and end - start > 1:
                option = struct.pack("=H", len(datagrams[start]))
                try:
                    sock.sendmsg(
                        [b"".join(datagrams[start:end])],
                        [(SOL_UDP, UDP_SEGMENT, option)],
                        0,
                        dest,
                    )
                    continue
                except (BlockingIOError, InterruptedError):
                    return start
                except OSError as exc:
                    if exc.errno in NO_GSO_ERRNOS:  # one datagram per call from now on
                        self.offload = False
                        self.offload_error = exc.strerror or str(exc)
            for k in range(start, end):
                try:
                    sendto(datagrams[k], dest)
                except (BlockingIOError, InterruptedError):
                    return k
                except OSError as exc:
                    self.send_errors += 1
                    self._warn_send_error(exc)
        return len(datagrams)

    def _warn_send_error(self, exc: BaseException) -> None:
        """Log a failed send, at most once per :data:`SEND_WARNING_PERIOD` (a medium that
        cannot send at all would otherwise fill the log), with the count since the last."""
        now = time.monotonic()
        if now < self._send_warned + SEND_WARNING_PERIOD:
            return
        errors = self.send_errors + (self._tx_proto.errors if self._tx_proto else 0)
        log.warning(
            "cannot send on %s via %s: %s (%d datagram(s) lost so far; udp_send_errors)",
            medium_text(self.medium),
            self.medium.interface,
            getattr(exc, "strerror", None) or exc,
            errors,
        )
        self._send_warned = now

    def close(self) -> None:
        if self._rx is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._rx.fileno())
            self._rx.close()
            self._rx = None
        if self._tx is not None:
            self._tx.close()
