"""``dodwan top``: a live terminal view of one host and its neighbourhood, from the admin API.

:class:`Sampler` polls the admin API (``/status``, ``/peers``, ``/cache``) and keeps what a
single poll cannot tell: counter rates (differences between two polls) and each
neighbour's link quality. :func:`render` turns a :class:`Frame` into a rich renderable;
:func:`run` refreshes it with ``rich.live.Live`` until Ctrl-C; :func:`stream` appends plain
frames instead when the output is not a terminal.

Link quality is the share of the recent announce periods (up to :data:`QUALITY_PERIODS`)
in which the neighbour was heard at all: a neighbour announces once per period, so a good
link fills every period and a lossy or fading one leaves gaps. It needs polls at least as
often as the announce period, which the refresh interval is clamped to.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .daemon.client import AdminClient, ClientError
from .textsafe import safe
from .units import human_size

QUALITY_PERIODS = 12
"""Announce periods over which a neighbour's link quality is judged."""
TOP_COUNTERS = 14
"""Counters shown, busiest first."""


@dataclass
class Frame:
    """One refresh: what the daemon said, plus what the sampler derived from history."""

    status: dict[str, Any]
    peers: dict[str, Any]
    cache: list[dict[str, Any]]
    rates: dict[str, float]
    """Counter name -> increase per second since the previous poll (empty on the first)."""
    quality: dict[str, float]
    """Neighbour -> share of recent announce periods in which it was heard (0..1)."""
    at: float


@dataclass
class _Heard:
    first: float
    slots: set[int] = field(default_factory=set)
    """Announce-period slots (time // period) in which the neighbour was heard."""


class Sampler:
    """Polls one daemon; remembers the previous counters and when each neighbour was heard.

    ``connect()`` makes the admin client (from the state directory); it is made again after
    a failure, so a restarted daemon (on a new admin port) is found again."""

    def __init__(self, connect: Callable[[], AdminClient]) -> None:
        self._connect = connect
        self.client: AdminClient | None = None
        self._prev: tuple[float, int, dict[str, int]] | None = None
        self._heard: dict[str, _Heard] = {}

    def poll(self) -> Frame:
        """One frame; raises :class:`ClientError` when the daemon cannot be read."""
        try:
            if self.client is None:
                self.client = self._connect()
            status = self.client.get("/status")
            peers = self.client.get("/peers")
            cache = self.client.get("/cache")
        except ClientError:
            self.client = None
            raise
        now = time.time()
        counters = {k: int(v) for k, v in status.get("counters", {}).items()}
        pid = int(status.get("pid", 0))
        rates: dict[str, float] = {}
        if self._prev is not None and now > self._prev[0] and self._prev[1] == pid:
            then, _, before = self._prev  # (a restarted daemon starts its counters afresh)
            rates = {k: (v - before.get(k, 0)) / (now - then) for k, v in counters.items()}
        self._prev = (now, pid, counters)
        period = float(status.get("announce_period") or 5.0)
        return Frame(status, peers, cache, rates, self._quality(peers, period, now), now)

    def _quality(self, peers: dict[str, Any], period: float, now: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for host in list(self._heard):
            if host not in peers:  # gone: a neighbour found again starts afresh
                del self._heard[host]
        for host, p in peers.items():
            last = float(p.get("last_heard", now))
            h = self._heard.setdefault(host, _Heard(first=last))
            h.slots.add(int(last // period))
            current = int(now // period)
            oldest = max(int(h.first // period), current - QUALITY_PERIODS + 1)
            h.slots = {s for s in h.slots if s >= oldest}
            # the current period may not have had its announcement yet: judge it only once
            # the neighbour was heard in it
            expected = current - oldest + (1 if current in h.slots else 0)
            out[host] = 1.0 if expected <= 0 else min(1.0, len(h.slots) / expected)
        return out


# ---------------------------------------------------------------------- rendering


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _text(value: object) -> Text:
    """A table cell from a string a peer may choose: plain text (rich would read ``[...]``
    as markup, and die of a closing tag that matches nothing), controls escaped."""
    return Text(safe(value))


def _bar(done: float, total: float, width: int = 24) -> ProgressBar:
    return ProgressBar(total=max(total, 1), completed=min(done, max(total, 1)), width=width)


def _header(st: dict[str, Any]) -> Text:
    m = st.get("medium", {})
    t = Text()
    t.append(safe(st.get("host_id", "?")), style="bold")
    t.append(f"  up {float(st.get('uptime', 0)):.0f} s  pid {safe(st.get('pid', '?'))}  ")
    t.append(safe(f"{m.get('kind', '?')} {m.get('group', '?')} on {m.get('interface', '?')}"))
    return t


HOST_SHOWN = 24
"""Characters of a neighbour's host id the neighbours panel keeps however narrow it is."""
NARROW = 72
"""Below this width (characters inside the panel) the neighbours panel leaves out the
link-quality bar and the address, so the host id, the share heard and the profile stay
readable."""


class _NeighbourTable:
    """The neighbours table, its columns chosen for the width it is drawn at."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        frame = self.frame
        narrow = options.max_width < NARROW
        table = Table(expand=True, box=None, pad_edge=False)
        host_width = min(HOST_SHOWN, max(len(safe(h)) for h in frame.peers))
        table.add_column("HOST", no_wrap=True, min_width=max(4, host_width))
        if not narrow:
            table.add_column("ADDRESS", no_wrap=True)
        table.add_column("HEARD" if narrow else "LAST HEARD", no_wrap=True)
        if not narrow:
            table.add_column("LINK QUALITY", no_wrap=True)
        table.add_column("" if not narrow else "LINK", no_wrap=True)
        table.add_column("PROFILE")
        for host, p in sorted(frame.peers.items()):
            addr = p.get("address")
            where = f"{addr[0]}:{addr[1]}" if isinstance(addr, list) and len(addr) >= 2 else addr
            silent = float(p.get("silent_for", frame.at - float(p.get("last_heard", frame.at))))
            q = frame.quality.get(host, 1.0)
            pats = "; ".join(
                ",".join(f"{k}={v}" for k, v in sorted(x.items())) for x in p.get("patterns", [])
            )
            cells: list[RenderableType] = [_text(host)]
            if not narrow:
                cells.append(_text(where))
            cells.append(f"{silent:.1f} s" if narrow else f"{silent:.1f} s ago")
            if not narrow:
                cells.append(_bar(q, 1.0, 12))
            cells += [f"{q:.0%}", _text(pats or "-")]
            table.add_row(*cells)
        yield table


def _neighbours(frame: Frame) -> RenderableType:
    if not frame.peers:
        return Panel(Text("no neighbours"), title="neighbours (0)", title_align="left")
    return Panel(
        _NeighbourTable(frame), title=f"neighbours ({len(frame.peers)})", title_align="left"
    )


def _cache(frame: Frame) -> RenderableType:
    c = frame.status.get("cache", {})
    used, cap = float(c.get("bytes", 0)), float(c.get("capacity", 0))
    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        _bar(used, cap, 30),
        Text(
            f"{human_size(used)} of {human_size(cap)}  "
            f"{_plural(int(c.get('messages', 0)), 'message')} ({c.get('complete', 0)} complete)  "
            f"{_plural(int(frame.status.get('subscriptions', 0)), 'subscription')}"
        ),
    )
    return Panel(grid, title="cache", title_align="left")


def _transfers(frame: Frame) -> RenderableType:
    partial = [it for it in frame.cache if not it.get("complete")]
    if not partial:
        return Panel(Text("none in progress"), title="transfers (0)", title_align="left")
    table = Table(expand=True, box=None, pad_edge=False)
    for col in ("MESSAGE", "PROGRESS", "FRAGMENTS", "SIZE", "WANTED BY"):
        table.add_column(col, no_wrap=True)
    for it in partial:
        got, total = int(it.get("fragments", 0)), int(it.get("total_fragments", 0))
        table.add_row(
            _text(it.get("id")),
            _bar(got, total),
            f"{got}/{total} ({got / total:.0%})" if total else f"{got}/?",
            human_size(float(it.get("size", 0))),
            _text(it.get("reason", "")),
        )
    return Panel(table, title=f"transfers ({len(partial)})", title_align="left")


def _deliveries(frame: Frame) -> RenderableType:
    counters = frame.status.get("counters", {})
    parts = [("delivered", "daemon_deliveries")]
    parts += [(f"to {k}", f"sink_deliveries_{k}") for k in ("dir", "exec", "follow")]
    parts += [("unrouted", "sink_deliveries_unrouted"), ("sink errors", "sink_errors")]
    t = Text()
    for label, name in parts:
        n = int(counters.get(name, 0))
        if n or name == "daemon_deliveries":
            rate = frame.rates.get(name, 0.0 if frame.rates else None)
            t.append(f"{label} {n}", style="bold" if name == "daemon_deliveries" else "")
            t.append(f" ({rate:.1f}/s)  " if rate is not None else "  ")
    return Panel(t, title="deliveries", title_align="left")


def _counters(frame: Frame) -> RenderableType:
    counters = frame.status.get("counters", {})
    names = sorted(counters, key=lambda k: (-abs(frame.rates.get(k, 0.0)), -int(counters[k]), k))
    table = Table(expand=True, box=None, pad_edge=False)
    table.add_column("COUNTER")
    table.add_column("TOTAL", justify="right")
    table.add_column("PER SECOND", justify="right")
    for k in [n for n in names if counters[n]][:TOP_COUNTERS]:
        rate = frame.rates.get(k)
        table.add_row(_text(k), _text(counters[k]), "-" if rate is None else f"{rate:.1f}")
    return Panel(table, title="counters", title_align="left")


def render(frame: Frame | None, problem: str | None = None, live: bool = True) -> RenderableType:
    """The whole view; ``problem`` (the daemon cannot be read) is shown on top."""
    parts: list[RenderableType] = []
    if problem is not None:
        parts.append(Text(f"daemon not readable: {safe(problem)} (retrying)", style="bold red"))
    if frame is not None:
        parts += [
            _header(frame.status),
            _neighbours(frame),
            _cache(frame),
            _transfers(frame),
            _deliveries(frame),
            _counters(frame),
        ]
    if live:
        parts.append(Text("Ctrl-C to quit", style="dim"))
    return Group(*parts)


def run(connect: Callable[[], AdminClient], interval: float) -> None:
    """Refresh the view every ``interval`` seconds until Ctrl-C."""
    sampler = Sampler(connect)
    frame, problem = None, None
    try:
        with Live(render(None), auto_refresh=False, screen=True) as live:
            while True:
                try:
                    frame, problem = sampler.poll(), None
                except ClientError as exc:
                    problem = str(exc)
                live.update(render(frame, problem), refresh=True)
                time.sleep(_clamped(interval, frame))
    except KeyboardInterrupt:
        return


class PipeConsole(Console):
    """A rich console whose output cut off (``| head``) raises BrokenPipeError, which the
    CLI turns into its quiet exit 141, like every command (rich itself exits 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def stream(connect: Callable[[], AdminClient], interval: float, console: Console) -> None:
    """Not a terminal (``dodwan top > file``, ``| less``): one plain frame per refresh,
    appended to ``console`` after a dated rule, until Ctrl-C (or the reader goes away: the
    CLI then ends quietly). A full-screen view would write escape codes, or nothing."""
    sampler = Sampler(connect)
    frame: Frame | None = None
    try:
        while True:
            try:
                frame, problem = sampler.poll(), None
            except ClientError as exc:
                problem = str(exc)
            console.rule(time.strftime("%Y-%m-%d %H:%M:%S"), align="left")
            console.print(render(frame, problem, live=False))
            console.file.flush()
            time.sleep(_clamped(interval, frame))
    except KeyboardInterrupt:
        return


def once(connect: Callable[[], AdminClient], interval: float) -> RenderableType:
    """One frame, with rates over ``interval`` seconds (two polls)."""
    sampler = Sampler(connect)
    sampler.poll()
    time.sleep(interval)
    return render(sampler.poll(), live=False)


def _clamped(interval: float, frame: Frame | None) -> float:
    """Poll at least twice per announce period (for link quality)."""
    if frame is None:
        return interval
    return min(interval, float(frame.status.get("announce_period") or interval) / 2)
