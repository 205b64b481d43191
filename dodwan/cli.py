"""The ``dodwan`` command: run the daemon and talk to a running one through its admin API.

Thin commands: parse, call the daemon or the admin client, print. Every error
a user can cause ends as one ``Error: ...`` line and a non-zero exit code. A command whose
stdout's reader went away (``dodwan subscribe --follow | head -1``) stops quietly with
exit status 141, as a tool ended by SIGPIPE (docs/admin-api.md).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .cli_types import FiniteFloat
from .core.config import field_docs
from .daemon import config as cfg
from .daemon.client import AdminClient, ClientError, admin_path
from .pipes import BROKEN_PIPE_STATUS, to_devnull
from .textsafe import safe, safe_text
from .units import human_size

STATE_DIR_HELP = (
    "Daemon state directory (default: $DODWAN_STATE_DIR, else $XDG_STATE_HOME/dodwan, "
    "else ~/.local/state/dodwan)."
)


def _state_dir(ctx: click.Context, local: str | None) -> Path:
    if local:
        return Path(local)
    root = ctx.find_root().params.get("state_dir")
    return Path(root) if root else cfg.default_state_dir()


def _client(ctx: click.Context, local: str | None) -> AdminClient:
    """The admin client; with ``--wait``, it waits for a daemon still starting: for its
    admin.json, and for its address to accept connections (a stale file's does not)."""
    wait = float(ctx.find_root().params.get("wait") or 0.0)
    try:
        return AdminClient.waiting_for(_state_dir(ctx, local), wait)
    except ClientError as exc:
        raise click.ClickException(safe(exc)) from None


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ClientError as exc:
        raise click.ClickException(safe(exc)) from None


def _out_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))


def _table(rows: list[list[str]], header: list[str]) -> None:
    if not rows:
        return
    rows = [[safe(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _when(t: float) -> str:
    left = t - time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    return f"{stamp} (in {left:.0f} s)" if left >= 0 else f"{stamp} (expired)"


def _pairs(values: tuple[str, ...], what: str, option: str) -> dict[str, str]:
    """NAME=VALUE options as a dict; a name given twice is a usage error (one value each)."""
    out: dict[str, str] = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name:
            raise click.ClickException(f"bad {what} {v!r}: expected NAME=VALUE")
        if name in out:
            raise click.BadParameter(
                f"{what} {name!r} given more than once (one value per name)", param_hint=option
            )
        out[name] = value
    return out


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # an empty path would silently mean the default state directory
    if value is not None and not value:
        raise click.BadParameter("must not be empty (omit it for the default)", ctx, param)
    return value


state_dir_option = click.option(
    "--state-dir",
    "local_state_dir",
    type=click.Path(file_okay=False),
    callback=_not_empty,
    help=STATE_DIR_HELP,
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


class _Group(click.Group):
    """The command group: EPIPE on output ends a command quietly with 141 (click's own
    handling exits 1, as for any failure)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            to_devnull(sys.stdout)
            raise click.exceptions.Exit(BROKEN_PIPE_STATUS) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--state-dir", type=click.Path(file_okay=False), callback=_not_empty, help=STATE_DIR_HELP
)
@click.option(
    "--wait",
    type=FiniteFloat(0, 600),
    default=0.0,
    metavar="SECONDS",
    help="Wait up to SECONDS for the daemon to serve (one just started takes a moment).",
)
@click.version_option(package_name="dodwan")
def cli(state_dir: str | None, wait: float) -> None:
    """DoDWAN: delay-tolerant content-based publish/subscribe.

    `dodwan daemon` runs a host; the other commands talk to the daemon of the state
    directory through its loopback admin API.
    """


# ---------------------------------------------------------------------- daemon


def _daemon_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    node_docs = field_docs()
    for name in reversed(list(cfg.NODE_FIELDS)):
        default = cfg.NODE_DEFAULTS[name]
        flag = name.replace("_", "-")
        help_text = f"[node] {node_docs.get(name, '')} (default: {default})"
        if isinstance(default, bool):
            fn = click.option(f"--{flag}/--no-{flag}", name, default=None, help=help_text)(fn)
        else:
            fn = click.option(
                f"--{flag}", name, type=cfg.option_type(default), default=None, help=help_text
            )(fn)
    for s in reversed(cfg.SETTINGS):
        if not s.cli:
            continue
        flag = s.name.replace("_", "-")
        help_text = f"{s.help} (default: {s.default!r})"
        if isinstance(s.default, bool):
            fn = click.option(f"--{flag}/--no-{flag}", s.name, default=None, help=help_text)(fn)
            continue
        fn = click.option(
            f"--{flag}", s.name, type=cfg.option_type(s.default), default=None, help=help_text
        )(fn)
    return fn


@cli.command()
@state_dir_option
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings file."
)
@_daemon_options
@click.pass_context
def daemon(
    ctx: click.Context, /, local_state_dir: str | None, config_file: str | None, **overrides: Any
) -> None:
    """Run this host's daemon in the foreground until SIGINT/SIGTERM.

    Every setting is documented in docs/configuration.md and can be given in the --config
    TOML file; options given here override the file.
    """
    from .daemon.runner import Daemon, DaemonError
    from .daemon.sqlite_store import StoreError
    from .daemon.transport import TransportError

    try:
        conf = cfg.load(config_file, overrides)
        explicit = local_state_dir or ctx.find_root().params.get("state_dir") or conf.state_dir
        state_dir = _state_dir(ctx, explicit or None)
        d = Daemon(state_dir, conf)
    except (cfg.ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(
        level=conf.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(d.run(own_process=True))
    except (DaemonError, TransportError, StoreError, cfg.ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:  # pragma: no cover - signal handlers normally catch it
        pass


def _db_path(ctx: click.Context, local: str | None) -> Path:
    from .daemon.runner import DB_FILE

    return _state_dir(ctx, local) / DB_FILE


@cli.command()
@state_dir_option
@click.pass_context
def check(ctx: click.Context, local_state_dir: str | None) -> None:
    """Check the state directory's database fully: SQLite's integrity check, and every cached
    message read back and verified. Exits 1 when something is damaged, or (saying so, without
    calling it damaged) when the database cannot be opened at all. A read-only state
    directory is fine."""
    from .daemon import repair as rp
    from .daemon.sqlite_store import StoreError

    path = _db_path(ctx, local_state_dir)
    try:
        report = rp.check(path)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    summary = (
        f"{report.messages} messages: {report.complete} complete, {report.partial} partial, "
        f"{report.lost} unreadable"
    )
    if report.problems:
        click.echo(f"{path} is damaged ({summary}):")
        for line in report.problems[:20]:
            click.echo(f"  {line}")
        click.echo("run `dodwan repair` (with the daemon stopped) to salvage what is readable")
        ctx.exit(1)
    click.echo(f"{path}: ok ({summary})")


@cli.command()
@state_dir_option
@click.pass_context
def repair(ctx: click.Context, local_state_dir: str | None) -> None:
    """Salvage every readable message (and the subscriptions, sinks and reception history)
    of a damaged, empty or foreign database into a fresh one; the old file is kept aside as
    dodwan.db.damaged-TIME. The daemon must be stopped."""
    import errno
    import fcntl

    from .daemon import repair as rp
    from .daemon.runner import LOCK_FILE

    state = _state_dir(ctx, local_state_dir)
    if not state.is_dir():
        raise click.ClickException(f"no state directory {state}")
    try:
        lock = open(state / LOCK_FILE, "a+")  # noqa: SIM115  (closed by the with below)
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise click.ClickException(
                f"cannot repair {state}: the state directory is on a read-only file system"
            ) from None
        raise click.ClickException(
            f"cannot repair {state}: cannot lock {state / LOCK_FILE}: {exc.strerror}"
        ) from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise click.ClickException(
                f"a daemon is running on {state}; stop it before repairing its database"
            ) from None
        try:
            report, kept = rp.repair(state / "dodwan.db")
        except OSError as exc:
            raise click.ClickException(f"cannot repair {state}: {exc}") from None
    for line in report.problems[:20]:
        click.echo(f"  found: {line}")
    click.echo(
        f"saved {report.saved} of {report.messages} messages ({report.complete} complete, "
        f"{report.partial} partial, to be fetched again; {report.lost} lost)"
        + "".join(f", {n} {t} rows" for t, n in report.tables.items())
    )
    if kept is not None:
        click.echo(f"the previous file is kept as {kept}")


@cli.command()
@click.argument("file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option(
    "--signing",
    is_flag=True,
    help="Write an Ed25519 signing key (for --signing-key) instead of a network key; "
    "prints its public key (hex) for subscribers' --trusted-key.",
)
@click.option("--force", is_flag=True, help="Replace FILE if it exists.")
def keygen(file: str, signing: bool, force: bool) -> None:
    """Write a new random key to FILE, readable by its owner only (mode 0600).

    Without --signing: a network key for `dodwan daemon --network-key FILE`, to be copied to
    every host of the network.
    """
    from .daemon.netkey import encode_key, generate_key, write_secret_file

    if signing:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from .core.signing import public_key_of

        key = Ed25519PrivateKey.generate().private_bytes_raw()
        public = public_key_of(key)
    else:
        key, public = generate_key(), ""
    try:
        write_secret_file(file, encode_key(key) + "\n", force=force)
    except FileExistsError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {file}: {exc.strerror}") from None
    if signing:
        click.echo(public)
    else:
        click.echo(f"network key written to {file}")


# ---------------------------------------------------------------------- reading


@cli.command()
@state_dir_option
@json_option
@click.pass_context
def status(ctx: click.Context, local_state_dir: str | None, as_json: bool) -> None:
    """Show the daemon's id, uptime, neighbours, cache use and counters."""
    st = _call(lambda: _client(ctx, local_state_dir).get("/status"))
    if as_json:
        _out_json(st)
        return
    cache, m = st["cache"], st["medium"]
    rows = [
        ("host id", st["host_id"]),
        ("uptime", f"{st['uptime']:.0f} s (pid {st['pid']})"),
        ("medium", f"{m['kind']} {m['group']} on {m['interface']}"),
        ("neighbours", ", ".join(st["neighbours"]) or "(none)"),
        (
            "cache",
            f"{_plural(cache['messages'], 'message')} ({cache['complete']} complete), "
            f"{human_size(cache['bytes'])} of {human_size(cache['capacity'])}",
        ),
        *_remote_memory_row(st.get("remote_memory")),
        ("subscriptions", str(st["subscriptions"])),
    ]
    width = max(len(name) for name, _ in rows) + 2
    for name, value in rows:
        click.echo(f"{name:<{width}}{safe(value)}")
    if st.get("bridges"):
        click.echo("bridges")
        _bridge_rows(st["bridges"])
    counters = st["counters"]
    if counters:
        click.echo("counters")
        for k, v in counters.items():
            click.echo(f"  {safe(k):<32} {v}")


def _remote_memory_row(rm: dict[str, int] | None) -> list[tuple[str, str]]:
    """The status line of what peers make the daemon keep (absent from older daemons)."""
    if not rm:
        return []
    return [
        (
            "peer state",
            f"{human_size(rm['bytes'])} of {human_size(rm['budget'])}, "
            f"{_plural(rm['items'], 'item')}, {rm['evicted']} given up, "
            f"largest holder {human_size(rm['largest_holder'])}",
        )
    ]


@cli.command()
@state_dir_option
@json_option
@click.pass_context
def peers(ctx: click.Context, local_state_dir: str | None, as_json: bool) -> None:
    """List the current neighbours."""
    ps = _call(lambda: _client(ctx, local_state_dir).get("/peers"))
    if as_json:
        _out_json(ps)
        return
    if not ps:
        click.echo("no neighbours")
        return
    rows = []
    for host, p in ps.items():
        addr = p["address"]
        addr_s = f"{addr[0]}:{addr[1]}" if isinstance(addr, list) and len(addr) >= 2 else str(addr)
        pats = "; ".join(json.dumps(x, sort_keys=True) for x in p.get("patterns", [])) or "-"
        rows.append(
            [host, addr_s, f"{p['silent_for']:.1f} s", "yes" if p["altruistic"] else "no", pats]
        )
    _table(rows, ["HOST", "ADDRESS", "SILENT", "ALTRUISTIC", "PROFILE"])


@cli.command()
@state_dir_option
@json_option
@click.pass_context
def profile(ctx: click.Context, local_state_dir: str | None, as_json: bool) -> None:
    """Show this host's interest profile and the profiles known within the horizon."""
    pr = _call(lambda: _client(ctx, local_state_dir).get("/profile"))
    if as_json:
        _out_json(pr)
        return
    click.echo("own profile:")
    for p in pr["own"] or []:
        click.echo(f"  {json.dumps(p, sort_keys=True)}")
    if not pr["own"]:
        click.echo("  (empty)")
    known = pr.get("known", {})
    rows = [
        [h, str(k["distance"]), "; ".join(json.dumps(x, sort_keys=True) for x in k["patterns"])]
        for h, k in known.items()
    ]
    if rows:
        click.echo("known profiles:")
        _table(rows, ["HOST", "HOPS", "PATTERNS"])


# ---------------------------------------------------------------------- publish


@cli.command()
@state_dir_option
@click.option(
    "-a",
    "--attribute",
    "attributes",
    multiple=True,
    metavar="KEY=VALUE",
    help="Descriptor attribute (repeatable, each name once).",
)
@click.option("--text", help="Payload given as text (UTF-8).")
@click.option("--file", "file_", metavar="FILE", help="Payload read from a file ('-' = stdin).")
@click.option(
    "--ttl",
    type=cfg.PlainNumber(float),
    default=3600.0,
    show_default=True,
    help="Seconds until the message's deadline.",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=4,
    show_default=True,
    help="0 (lowest) to 9; high priority is evicted last.",
)
@click.option(
    "--persistent/--no-persistent",
    default=True,
    show_default=True,
    help="Persistent messages are evicted after non-persistent ones.",
)
@click.option("--id", "msg_id", help="Choose the message id (default: generated).")
@json_option
@click.pass_context
def publish(
    ctx: click.Context,
    local_state_dir: str | None,
    attributes: tuple[str, ...],
    text: str | None,
    file_: str | None,
    ttl: float,
    priority: int,
    persistent: bool,
    msg_id: str | None,
    as_json: bool,
) -> None:
    """Publish a message; prints its id."""
    attrs = _pairs(attributes, "attribute", "-a")
    if msg_id is not None:
        if "id" in attrs:
            raise click.BadParameter(
                "attribute 'id' given more than once (--id and -a id=...)", param_hint="--id"
            )
        attrs["id"] = msg_id
    if (text is None) == (file_ is None):
        raise click.ClickException("give exactly one of --text or --file")
    data = text.encode("utf-8") if text is not None else b""
    if file_ is not None:
        try:
            data = sys.stdin.buffer.read() if file_ == "-" else Path(file_).read_bytes()
        except FileNotFoundError:
            raise click.ClickException(f"file {file_} does not exist") from None
        except OSError as exc:
            raise click.ClickException(f"cannot read {file_}: {exc.strerror}") from None
    if not ttl > 0 or not math.isfinite(ttl):
        raise click.ClickException("--ttl must be a positive, finite number of seconds")
    if not attributes:
        # Subscriptions select messages by their attributes: without any, the message would
        # be carried until its deadline and reach no one.
        raise click.ClickException(
            "give at least one attribute (-a NAME=VALUE, e.g. -a topic=news): subscribers "
            "select messages by their attributes"
        )
    fields = {"attributes": attrs, "ttl": ttl, "priority": priority, "persistent": persistent}
    client = _client(ctx, local_state_dir)
    res = _call(lambda: client.publish_bytes(data, **fields))
    if as_json:
        _out_json(res)
    else:
        click.echo(safe(res["id"]))


# ---------------------------------------------------------------------- subscriptions


def _print_delivery(d: dict[str, Any]) -> None:
    desc = d.get("descriptor", {})
    shown = {k: v for k, v in desc.items() if not k.startswith("_")}
    click.echo(f"--- {safe(desc.get('id', '?'))} ({safe(d.get('subscription'))})")
    for k in sorted(shown):
        click.echo(f"  {safe(k)}: {safe(shown[k])}")
    if "text" in d:
        click.echo(safe_text(d["text"]))
    else:
        size = len(base64.b64decode(d.get("payload_b64", "")))
        click.echo(f"<{size} bytes of binary payload>")


@cli.command()
@state_dir_option
@click.option(
    "-p",
    "--pattern",
    "patterns",
    multiple=True,
    metavar="KEY=REGEX",
    required=True,
    help="Attribute pattern (repeatable; all must match; RE2 full match).",
)
@click.option(
    "--dir",
    "outdir",
    metavar="OUTDIR",
    help="Write each payload to OUTDIR/<message id>, descriptor in <id>.json.",
)
@click.option(
    "--exec",
    "command",
    metavar="CMD",
    help="Run CMD (sh -c) per delivery: payload on stdin, descriptor in DODWAN_* env.",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Stream deliveries to this terminal until interrupted (the subscription "
    "ends with the stream).",
)
@click.option("--key", help="Subscription key (default: generated).")
@click.option(
    "--trusted-key",
    "trusted_keys",
    multiple=True,
    metavar="HEX",
    help="Deliver only messages signed by this Ed25519 public key (repeatable: any of them); "
    "see `dodwan keygen --signing`.",
)
@json_option
@click.pass_context
def subscribe(
    ctx: click.Context,
    local_state_dir: str | None,
    patterns: tuple[str, ...],
    outdir: str | None,
    command: str | None,
    follow: bool,
    key: str | None,
    trusted_keys: tuple[str, ...],
    as_json: bool,
) -> None:
    """Subscribe: the daemon holds the subscription (across restarts, except --follow)."""
    spec = _pairs(patterns, "pattern", "-p")
    if (outdir is not None) + (command is not None) + follow != 1:
        raise click.ClickException("give exactly one of --dir, --exec or --follow")
    client = _client(ctx, local_state_dir)
    if follow:
        body: dict[str, Any] = {"patterns": [spec]}
        if key:
            body["key"] = key
        if trusted_keys:
            body["trusted_keys"] = list(trusted_keys)
        try:
            for item in client.stream("/follow", body):
                if as_json:
                    click.echo(json.dumps(item, sort_keys=True))
                elif "subscribed" in item:
                    click.echo(
                        f"subscribed as {safe(item['subscribed'])}; waiting (Ctrl-C to stop)"
                    )
                else:
                    _print_delivery(item)
                sys.stdout.flush()
        except ClientError as exc:
            raise click.ClickException(safe(exc)) from None
        except KeyboardInterrupt:
            return
        raise click.ClickException("the daemon ended the stream")
    if outdir is not None:
        sink = {"kind": "dir", "target": os.path.abspath(outdir)}
    else:
        sink = {"kind": "exec", "target": str(command)}
    body = {"patterns": [spec], "sink": sink}
    if key:
        body["key"] = key
    if trusted_keys:
        body["trusted_keys"] = list(trusted_keys)
    res = _call(lambda: client.post("/subscribe", body))
    if as_json:
        _out_json(res)
    else:
        click.echo(safe(res["key"]))


@cli.command()
@state_dir_option
@click.argument("key")
@json_option
@click.pass_context
def unsubscribe(ctx: click.Context, local_state_dir: str | None, key: str, as_json: bool) -> None:
    """Remove the subscription KEY."""
    client = _client(ctx, local_state_dir)
    res = _call(lambda: client.delete(admin_path("subscriptions", key)))
    if as_json:
        _out_json(res)
    else:
        click.echo(f"unsubscribed {safe(key)}")


@cli.command()
@state_dir_option
@json_option
@click.pass_context
def subscriptions(ctx: click.Context, local_state_dir: str | None, as_json: bool) -> None:
    """List the subscriptions held by the daemon."""
    subs = _call(lambda: _client(ctx, local_state_dir).get("/subscriptions"))
    if as_json:
        _out_json(subs)
        return
    if not subs:
        click.echo("no subscriptions")
        return
    rows = []
    for s in subs:
        sink = s["sink"]
        out = f"{sink['kind']} {sink['target']}".strip() if sink else "-"
        pats = " | ".join(json.dumps(p, sort_keys=True) for p in s["patterns"])
        rows.append([s["key"], out, pats])
    _table(rows, ["KEY", "OUTPUT", "PATTERNS"])


# ---------------------------------------------------------------------- cache


@cli.group()
def cache() -> None:
    """What this host carries."""


@cache.command("ls")
@state_dir_option
@json_option
@click.pass_context
def cache_ls(ctx: click.Context, local_state_dir: str | None, as_json: bool) -> None:
    """List cached messages (complete or partial, size, deadline, why kept)."""
    items = _call(lambda: _client(ctx, local_state_dir).get("/cache"))
    if as_json:
        _out_json(items)
        return
    if not items:
        click.echo("cache is empty")
        return
    rows = [
        [
            it["id"],
            "complete" if it["complete"] else f"{it['fragments']}/{it['total_fragments']}",
            human_size(it["size"]),
            _when(it["deadline"]),
            it["reason"],
        ]
        for it in items
    ]
    _table(rows, ["ID", "STATE", "SIZE", "DEADLINE", "KEPT BECAUSE"])


@cache.command("show")
@state_dir_option
@click.argument("msg_id", metavar="ID")
@click.option(
    "--payload",
    "with_payload",
    is_flag=True,
    help="Also print the payload, after a '--- payload' line (text; binary is only sized).",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="Write the payload, as is (binary or text), to FILE ('-' = stdout, nothing else "
    "printed); fails if the message is incomplete.",
)
@json_option
@click.pass_context
def cache_show(
    ctx: click.Context,
    local_state_dir: str | None,
    msg_id: str,
    with_payload: bool,
    output: str | None,
    as_json: bool,
) -> None:
    """Show one cached message's descriptor and state."""
    client = _client(ctx, local_state_dir)
    want_payload = with_payload or output is not None
    path = admin_path("cache", msg_id) + ("?payload=1" if want_payload else "")
    it = _call(lambda: client.get(path))
    if output is not None:
        _write_payload(it, output)
        if output == "-":
            return
    if as_json:
        _out_json(it)
        return
    state = "complete" if it["complete"] else f"{it['fragments']}/{it['total_fragments']} fragments"
    click.echo(f"id         {safe(it['id'])}")
    click.echo(f"state      {state}")
    click.echo(f"size       {human_size(it['size'])} ({human_size(it['stored_bytes'])} stored)")
    click.echo(f"deadline   {_when(it['deadline'])}")
    click.echo(
        f"priority   {it['priority']}, {'persistent' if it['persistent'] else 'non-persistent'}"
    )
    click.echo(f"hops       {it['hops']}")
    click.echo(f"kept       {safe(it['reason'])}")
    signer = it.get("signed_by")
    click.echo(f"signed by  {safe(signer) if signer else '(unsigned)'}")
    click.echo("descriptor")
    for k, v in sorted(it["descriptor"].items()):
        click.echo(f"  {safe(k)}: {safe(v)}")
    if output is not None:
        click.echo(f"payload    written to {output}")
    if with_payload:
        b64 = it.get("payload_b64")
        if b64 is None:
            click.echo("payload    (incomplete)")
        else:
            data = base64.b64decode(b64)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                click.echo(f"<{len(data)} bytes of binary payload: use --output FILE>")
            else:
                click.echo(f"--- payload ({_plural(len(data), 'byte')})")
                click.echo(safe_text(text))


def _write_payload(it: dict[str, Any], output: str) -> None:
    b64 = it.get("payload_b64")
    if b64 is None:
        raise click.ClickException(
            f"message {it['id']} is incomplete ({it['fragments']}/{it['total_fragments']} "
            "fragments): no payload to write"
        )
    data = base64.b64decode(b64)
    if output == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        Path(output).write_bytes(data)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from None


@cache.command("purge")
@state_dir_option
@click.argument("msg_id", metavar="ID")
@click.pass_context
def cache_purge(ctx: click.Context, local_state_dir: str | None, msg_id: str) -> None:
    """Drop a message from the cache."""
    client = _client(ctx, local_state_dir)
    _call(lambda: client.delete(admin_path("cache", msg_id)))
    click.echo(f"purged {safe(msg_id)}")


# ---------------------------------------------------------------------- top


@cli.command()
@state_dir_option
@click.option(
    "-n",
    "--interval",
    type=FiniteFloat(0.1, 60.0),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes (at most half an announce period, for link quality).",
)
@click.option("--once", is_flag=True, help="Print one frame (rates over one interval) and exit.")
@click.pass_context
def top(ctx: click.Context, local_state_dir: str | None, interval: float, once: bool) -> None:
    """Live view of this host: neighbours (last heard, link quality), cache use, transfers
    in progress, deliveries and counters per second. Ctrl-C quits. Not on a terminal
    (a file, a pipe): one plain frame per refresh, appended."""

    from . import top as view

    client = _client(ctx, local_state_dir)
    state_dir = _state_dir(ctx, local_state_dir)

    def connect() -> AdminClient:  # again after a failure: a restarted daemon moves port
        return AdminClient.for_state_dir(state_dir)

    tty = sys.stdout.isatty()
    # not a terminal: $COLUMNS if set, else 120 (rich's own guess there is 80)
    console = view.PipeConsole(width=None if tty or os.environ.get("COLUMNS") else 120)
    if once:
        console.print(_call(lambda: view.once(lambda: client, interval)))
        return
    _call(lambda: client.get("/status"))  # reachable before taking the screen
    if tty:
        view.run(connect, interval)
    else:  # a file or a pipe: a frame per refresh, as plain text
        view.stream(connect, interval, console)


# ---------------------------------------------------------------------- bridges


@cli.group()
def bridge() -> None:
    """Bindings to STOMP, MQTT and AMQP brokers (docs/bridges.md)."""


@bridge.command("add")
@state_dir_option
@click.argument("uri")
@click.option("--name", help="Binding name (default: made from the URI).")
@click.option(
    "--direction",
    type=click.Choice(["out", "in", "both"]),
    default="both",
    show_default=True,
    help="out: DoDWAN to the broker; in: the broker to DoDWAN.",
)
@click.option(
    "--attr",
    "-a",
    "attrs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Attribute given to incoming messages; outgoing messages are those that have all "
    "of them (unless --filter is given). Repeatable.",
)
@click.option(
    "--filter",
    "-f",
    "filters",
    multiple=True,
    metavar="NAME=REGEX",
    help="Pattern choosing outgoing messages (repeatable; all must match).",
)
@click.option(
    "--selector",
    "-s",
    help="JMS selector choosing the messages that cross, both ways "
    "(e.g. \"severity IN ('high','critical')\").",
)
@click.option(
    "--ttl", type=cfg.PlainNumber(float), help="Seconds incoming messages live in DoDWAN (3600)."
)
@click.option(
    "--holdoff", type=cfg.PlainNumber(float), help="Seconds outgoing messages wait (standby: 30)."
)
@click.option(
    "--standby",
    is_flag=True,
    default=None,
    help="A standby gateway: sends only what the primary has not sent within the hold-off.",
)
@click.option("--qos", type=click.IntRange(1, 2), help="MQTT quality of service (1).")
@click.option("--joms-topic", help="Mirror this JOMS topic (its JMS clients talk with the broker).")
@click.option(
    "--replace", is_flag=True, help="Replace the binding of that name (make-before-break)."
)
@json_option
@click.pass_context
def bridge_add(
    ctx: click.Context,
    local_state_dir: str | None,
    uri: str,
    name: str | None,
    direction: str,
    attrs: tuple[str, ...],
    filters: tuple[str, ...],
    selector: str | None,
    ttl: float | None,
    holdoff: float | None,
    standby: bool | None,
    qos: int | None,
    joms_topic: str | None,
    replace: bool,
    as_json: bool,
) -> None:
    """Bind the daemon to the broker destination URI, e.g. mqtt://127.0.0.1:1883/field/#,
    stomp://127.0.0.1:61613/topic/NAME or amqp://127.0.0.1:5672/EXCHANGE/KEY."""
    body: dict[str, Any] = {"uri": uri, "direction": direction, "replace": replace}
    if name:
        body["name"] = name
    if attrs:
        body["attributes"] = _pairs(attrs, "attribute", "--attr")
    if filters:
        body["filter"] = [_pairs(filters, "filter", "--filter")]
    for key, value in (
        ("ttl", ttl),
        ("holdoff", holdoff),
        ("standby", standby),
        ("qos", qos),
        ("joms_topic", joms_topic),
        ("selector", selector),
    ):
        if value is not None:
            body[key] = value
    client = _client(ctx, local_state_dir)
    res = _call(lambda: client.post("/bridges", body))
    if as_json:
        _out_json(res)
        return
    state = "connected" if res["connected"] else "connecting"
    click.echo(
        f"{'replaced' if replace else 'added'} {safe(res['name'])} -> {safe(res['uri'])} ({state})"
    )


@bridge.command("rm")
@state_dir_option
@click.argument("name")
@click.pass_context
def bridge_rm(ctx: click.Context, local_state_dir: str | None, name: str) -> None:
    """Remove the binding NAME (its unsent messages are dropped)."""
    client = _client(ctx, local_state_dir)
    res = _call(lambda: client.delete(admin_path("bridges", name)))
    extra = f" ({res['unsent_dropped']} unsent message(s) dropped)" if res["unsent_dropped"] else ""
    click.echo(f"removed {safe(name)}{extra}")


def _bridge_rows(rows: list[dict[str, Any]]) -> None:
    _table(
        [
            [
                r["name"],
                r["direction"],
                "up" if r["connected"] else "down",
                str(r["backlog"]),
                str(r["sent_total"]),
                str(r["received_total"]),
                str(r["errors"]),
                r["uri"],
            ]
            for r in rows
        ],
        ["NAME", "DIR", "LINK", "BACKLOG", "SENT", "RECEIVED", "ERRORS", "URI"],
    )


@bridge.command("ls")
@state_dir_option
@json_option
@click.pass_context
def bridge_ls(ctx: click.Context, local_state_dir: str | None, as_json: bool) -> None:
    """List the bindings with their state."""
    rows = _call(lambda: _client(ctx, local_state_dir).get("/bridges"))
    if as_json:
        _out_json(rows)
        return
    if not rows:
        click.echo("no bindings")
        return
    _bridge_rows(rows)
    for r in rows:
        if r["last_error"] and not r["connected"]:
            click.echo(f"{safe(r['name'])}: {safe(r['last_error'])}")


def main() -> None:
    cli(prog_name="dodwan")


if __name__ == "__main__":
    main()
