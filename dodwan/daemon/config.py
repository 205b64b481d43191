"""Daemon settings as data: one :class:`Setting` (name, default, help) per knob.

The same table feeds the TOML config loader, the ``dodwan daemon`` command-line options and
the generated reference ``docs/configuration.md`` (:func:`render_markdown`), so the three
never disagree. Daemon settings are top-level TOML keys; protocol settings of the core
(:class:`~dodwan.core.config.NodeConfig`) live in the ``[node]`` table.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import click

from ..core.config import MAX_COPY_BUDGET, NodeConfig, attribute_docs, field_docs
from ..core.limits import Limits
from ..units import as_given, is_plain_number
from .sinks import DIR_WAIT_MEMORY


@dataclass(frozen=True, slots=True)
class Setting:
    """One daemon setting."""

    name: str
    default: Any
    help: str
    cli: bool = True
    """Also a ``dodwan daemon --<name>`` option."""


DEFAULT_GROUP = "239.255.42.42:8500"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "state_dir",
        "",
        "Directory of the daemon's database, lock and admin address (created when missing; "
        "a file of that name is refused). Empty: --state-dir, else $DODWAN_STATE_DIR, else "
        "$XDG_STATE_HOME/dodwan, else ~/.local/state/dodwan.",
        cli=False,
    ),
    Setting(
        "host_id",
        "",
        "This host's id in the network. Empty: generated once (host name + random suffix) and "
        "kept in the state directory.",
    ),
    Setting(
        "group",
        DEFAULT_GROUP,
        "UDP group ADDR:PORT shared by all hosts. An IPv4 multicast address (224.0.0.0/4) means "
        "IPv4 multicast, an IPv6 ff02:: address ([ff02::4242]:8500) IPv6 link-local multicast "
        "(on an interface with the MULTICAST flag: not lo, where it is refused at start), "
        "any other IPv4 address (255.255.255.255 or a subnet broadcast address) IPv4 broadcast.",
    ),
    Setting(
        "interface",
        "lo",
        "Network interface datagrams are sent on and received from (e.g. wlan0). Nothing is "
        "sent out of any other interface.",
    ),
    Setting(
        "admin",
        "127.0.0.1:0",
        "Loopback HOST:PORT of the admin HTTP API (port 0: any free port; the chosen address "
        "is written to STATE_DIR/admin.json).",
    ),
    Setting(
        "bitrate",
        0,
        "Pacing of outgoing datagrams in bits per second (token bucket); 0 = unlimited. Set it "
        "near the radio's rate (e.g. 2000000) so bursts do not overflow the radio queue.",
    ),
    Setting(
        "burst",
        65536,
        "Token-bucket depth in bytes: how much may leave at once after a quiet period.",
    ),
    Setting(
        "socket_buffer",
        8 * 1024 * 1024,
        "Send and receive socket buffer size in bytes (forced when permitted).",
    ),
    Setting(
        "udp_offload",
        True,
        "Hand the kernel runs of equal-sized datagrams in one call (UDP segmentation offload) "
        "and read coalesced ones back (UDP GRO), where Linux supports it; what goes on the "
        "link is the same datagrams. false = one system call per datagram.",
    ),
    Setting(
        "multicast_ttl",
        1,
        "IP TTL / IPv6 hop limit of datagrams; 1 keeps them on the link.",
    ),
    Setting(
        "stomp",
        "",
        "Loopback HOST:PORT on which to serve the JOMS STOMP 1.2 gateway (e.g. "
        "127.0.0.1:61613); empty = no gateway. Needs the joms package.",
    ),
    Setting(
        "exec_timeout",
        60.0,
        "Seconds an --exec subscription command may run per delivery before it is killed.",
    ),
    Setting(
        "exec_concurrency",
        4,
        "Most --exec subscription commands running at the same time.",
    ),
    Setting(
        "sqlite_synchronous",
        "NORMAL",
        "SQLite synchronous mode (WAL). NORMAL survives a killed process; FULL also survives "
        "an operating-system crash or power loss, at a cost per input.",
    ),
    Setting(
        "fragment_commit_delay",
        0.25,
        "Seconds received fragments of a still-incomplete message may wait for their SQLite "
        "commit (batched for speed; a crash loses at most these, and they are fetched again). "
        "Publications, completed messages, deliveries and subscriptions are committed before "
        "the call returns whatever this is. 0 = commit every input.",
    ),
    Setting(
        "fragment_cache",
        32 * 1024 * 1024,
        "Bytes of recently stored or served fragments kept in memory besides SQLite (serving "
        "a fresh message and reassembling a completed one then skip the database); 0 = none.",
    ),
    Setting(
        "log_level",
        "info",
        "Logging threshold: debug, info, warning or error (logs go to stderr).",
    ),
    Setting(
        "network_key",
        "",
        "File holding the network key (32 bytes, base64 or hex; `dodwan keygen FILE` makes "
        "one). When set, every datagram is authenticated with it (ChaCha20-Poly1305, replays "
        "refused) and datagrams of hosts without it are dropped. Empty = open network.",
    ),
    Setting(
        "network_key_mode",
        "encrypt",
        "With a network key: encrypt (datagrams are also encrypted) or auth (authenticated "
        "only, readable on the air).",
    ),
    Setting(
        "signing_key",
        "",
        "File holding this host's Ed25519 private key (`dodwan keygen --signing FILE`); "
        "every message published here is then signed by it. Empty = unsigned.",
    ),
    Setting(
        "allow_remote",
        False,
        "Let the admin API and the STOMP gateway listen on addresses other than 127.0.0.1 "
        "and ::1 (the admin API, always requiring its bearer token there, then answers "
        "requests for any host name), the STOMP gateway requiring stomp_login and the "
        "passcode of stomp_passcode_file.",
    ),
    Setting(
        "admin_without_token",
        False,
        "Serve the admin API on loopback without its bearer token (STATE_DIR/admin.token, "
        "mode 0600): every local user, not only the daemon's, can then use it, including "
        "exec sinks that run commands as the daemon's user. Refused with a non-loopback "
        "admin address.",
    ),
    Setting(
        "stomp_login",
        "",
        "Login STOMP clients must give (with the passcode of stomp_passcode_file); required "
        "when the gateway listens on a non-local address.",
    ),
    Setting(
        "stomp_passcode_file",
        "",
        "File whose first line is the STOMP passcode (keep it mode 0600).",
    ),
    Setting(
        "stomp_connect_timeout",
        10.0,
        "Seconds a STOMP client has, once connected, to send its CONNECT frame; then it is "
        "sent an ERROR and disconnected.",
    ),
    Setting(
        "stomp_write_window",
        8 * 1024 * 1024,
        "Bytes of output a STOMP client may leave unread (queued in the daemon, besides the "
        "kernel's socket buffer); past it the daemon writes nothing more to it and its "
        "messages wait until it reads. A client that falls further behind its non-durable "
        "topics is disconnected (counted in daemon_stomp_slow_disconnects).",
    ),
    Setting(
        "stomp_write_timeout",
        30.0,
        "Seconds a STOMP client may leave a full stomp_write_window unread, reading none of "
        "it, before it is disconnected (counted in daemon_stomp_slow_disconnects); the "
        "messages it was not sent go back to their queue or are redelivered.",
    ),
    Setting(
        "admin_request_timeout",
        10.0,
        "Seconds an admin API client has to send its whole request (line, headers, body); "
        "then it is answered 408 and disconnected.",
    ),
    Setting(
        "follow_window",
        32 * 1024 * 1024,
        "Payload bytes queued for one `dodwan follow` (POST /follow) stream that does not "
        "read; further deliveries to it are dropped (counted in "
        "sink_deliveries_follow_dropped).",
    ),
    Setting(
        "dir_wait_memory",
        DIR_WAIT_MEMORY,
        "Payload bytes kept in memory, all dir sinks together, for deliveries waiting for "
        "their directory to take writes again (disk full): a waiting delivery beyond it holds "
        "its message id only and is given up (counted in sink_dir_given_up) if the message "
        "leaves the cache before there is room; 0 = ids only.",
    ),
    Setting(
        "bridges",
        [],
        "Bindings to STOMP, MQTT and AMQP brokers, one `[[bridges]]` table each (name, uri, "
        "direction, attributes, filter, selector, ttl, holdoff, standby, qos); see docs/bridges.md.",
        cli=False,
    ),
)

GiB = 1024 * 1024 * 1024
DAY = 86400.0
PUBLISH_MARGIN = 16 * 1024
"""Bytes kept below ``min(max_message_size, cache_capacity)`` for the largest publication:
zstd's framing of an incompressible payload (3 bytes per 128 KiB block) and the descriptor.
Both settings must exceed it (their ranges start above it), or nothing could be published."""

ATTRIBUTE_RESERVE = 64
"""Bytes of (compressed) application attributes a fragment's descriptor is assumed to
carry when ``max_payload`` counts what ``limits.max_fragments`` fragments hold: a
publication with more attributes has less room per fragment."""

MIN_DATAGRAM = 640
"""Smallest ``max_datagram`` the daemon accepts: a fragment datagram holds the compressed
descriptor (at most about 520 bytes for a message without application attributes, signed,
from a 64-character host id) and at least 64 bytes of payload (``Node._geometry``); the
rest is margin for a few application attributes. The core's own minimum, 256, suits short
host ids without signatures only."""

RANGES: dict[str, tuple[float, float]] = {
    "bitrate": (0, 100e9),
    "burst": (1, GiB),
    "socket_buffer": (0, GiB),
    "multicast_ttl": (1, 255),
    "exec_timeout": (0, DAY),
    "exec_concurrency": (1, 1024),
    "fragment_commit_delay": (0, 60),
    "fragment_cache": (0, 64 * GiB),
    "stomp_connect_timeout": (0.1, 3600),
    "stomp_write_window": (64 * 1024, 64 * GiB),
    "stomp_write_timeout": (0.1, DAY),
    "admin_request_timeout": (0.1, 3600),
    "follow_window": (64 * 1024, 64 * GiB),
    "dir_wait_memory": (0, 64 * GiB),
}
"""Inclusive bounds of the numeric daemon settings (every value must also be finite)."""

NODE_RANGES: dict[str, tuple[float, float]] = {
    "horizon": (1, 8),
    "announce_period": (0.01, DAY),
    "announce_jitter": (0, 0.99),
    "beacon_period": (0, 3600),
    "neighbour_timeout": (0, 7 * DAY),
    "max_datagram": (MIN_DATAGRAM, 65507),
    "cache_capacity": (64 * 1024, 1024 * GiB),
    "request_delay": (0, 60),
    "request_timeout": (0.001, 3600),
    "request_window": (1, 65536),
    "copy_budget": (0, MAX_COPY_BUDGET),
    "partial_timeout": (1, 365 * DAY),
    "seen_copy_age": (0, 10),
    "unmet_copy_age": (0, 10),
    "max_catalog_datagrams": (1, 1024),
    "compression_level": (1, 22),
}
"""Inclusive bounds of the numeric ``[node]`` settings."""

LIMIT_RANGES: dict[str, tuple[float, float]] = {
    "max_attributes": (16, 65536),
    "max_attribute_name": (16, 65536),
    "max_descriptor_bytes": (1024, 1024 * 1024),
    "max_message_size": (PUBLISH_MARGIN + 1, 64 * GiB),
    "max_fragments": (1, 1 << 24),
    "max_patterns": (1, 65536),
    "max_pattern_attributes": (1, 4096),
    "max_regex_length": (1, 65536),
    "max_relayed_profiles": (0, 65536),
    "max_profile_pieces": (1, 4096),
    "max_profile_assemblies": (1, 65536),
    "max_catalog_entries": (1, 65536),
    "max_request_entries": (1, 65536),
    "max_requests_per_second": (1, 1e9),
    "max_partial_bytes": (1024, 1024 * GiB),
    "max_origin_share": (0.01, 1.0),
    "max_partial_share": (0.01, 1.0),
    "max_regex_program": (16, 1 << 20),
    "max_neighbours": (2, 1 << 20),
    "max_remote_memory": (1 << 20, 64 * GiB),
    "max_profile_program": (16, 1 << 24),
    "max_ttl": (60, 3650 * DAY),
    "max_served_per_second": (1, 1e9),
    "max_descriptor_decodes": (1, 1e9),
    "max_descriptor_decodes_total": (1, 1e9),
    "max_inflation_per_origin": (1 << 20, 1 << 50),
    "max_inflation_total": (1 << 20, 1 << 50),
}
"""Inclusive bounds of the ``[node.limits]`` settings."""

REPLACED_LIMITS = {
    "max_descriptor_cache": "max_remote_memory",
    "max_remote_program": "max_remote_memory",
}
"""Limits that no longer exist -> the setting that took their job (one budget for all
state peers make a host keep)."""


BYTE_SIZES = frozenset(
    {
        "burst",
        "socket_buffer",
        "fragment_cache",
        "stomp_write_window",
        "follow_window",
        "dir_wait_memory",
        "max_datagram",
        "cache_capacity",
        "max_descriptor_bytes",
        "max_message_size",
        "max_partial_bytes",
        "max_remote_memory",
        "max_inflation_per_origin",
        "max_inflation_total",
    }
)
"""The ranged settings that are byte sizes: only their bounds are shown in KiB, MiB, ...
(1024 commands, 1024 bits/s or 65536 attributes are not sizes)."""

TiB = 1024 * GiB


def _range_text(bounds: tuple[float, float] | None, size: bool = False) -> str:
    """``lo … hi``; in binary units when ``size`` (a byte size) and a bound is a whole
    number of them."""
    if bounds is None:
        return ""
    lo, hi = bounds

    def fmt(v: float) -> str:
        if size and v >= 1024 and float(v).is_integer():
            units = (("TiB", TiB), ("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10))
            for unit, n in units:
                if v % n == 0:
                    return f"{int(v // n)} {unit}"
        if float(v).is_integer() and abs(v) < 1e15:
            return str(int(v))  # not 1.04858e+06
        return f"{v:g}"

    return f"{fmt(lo)} … {fmt(hi)}"


BY_NAME = {s.name: s for s in SETTINGS}

_NODE_EXCLUDED = {"host_id", "limits", "signing_key"}
NODE_FIELDS = {f.name: f for f in fields(NodeConfig) if f.name not in _NODE_EXCLUDED}
NODE_DEFAULTS: dict[str, Any] = {
    f.name: getattr(NodeConfig(host_id="x"), f.name)
    for f in fields(NodeConfig)
    if f.name in NODE_FIELDS
}


LIMIT_DEFAULTS: dict[str, Any] = {f.name: getattr(Limits(), f.name) for f in fields(Limits)}


def limit_docs() -> dict[str, str]:
    """Field name -> docstring of :class:`~dodwan.core.limits.Limits` (for the docs)."""
    return attribute_docs(Limits)


class PlainNumber(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on
    """A ``dodwan daemon`` number option, read as the config file's TOML reads numbers:
    ASCII digits only (``int``/``float`` alone also take ``٣`` as 3 and ``1_0`` as 10)."""

    def __init__(self, kind: type[int] | type[float]) -> None:
        self.kind = kind
        self.name = "integer" if kind is int else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, self.kind) and not isinstance(value, bool):
            return value
        text = str(value)
        if self.kind is float and text.lstrip("+-").lower() in ("inf", "infinity", "nan"):
            return float(text)  # the setting's own check refuses it, naming the setting
        if not is_plain_number(text, integer=self.kind is int):
            what = "an integer" if self.kind is int else "a number"
            self.fail(f"{text!r} is not {what} written with ASCII digits", param, ctx)
        return self.kind(text)


def option_type(default: Any) -> PlainNumber | type:
    """The click type of the option of a setting with this default."""
    if isinstance(default, int | float) and not isinstance(default, bool):
        return PlainNumber(type(default))
    return type(default)


class ConfigError(ValueError):
    """A config file or option value is invalid (message fit for one line of output)."""


def _check_type(where: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string")
        return value
    return value


@dataclass
class DaemonConfig:
    """Resolved settings: daemon-level values and core :class:`NodeConfig` fields."""

    values: dict[str, Any]
    node: dict[str, Any]
    limits: dict[str, Any] = field(default_factory=dict)
    joms: dict[str, Any] = field(default_factory=dict)
    """The ``[joms]`` table as written (checked): the STOMP gateway's JOMS service
    settings (``joms.service.ServiceConfig``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def node_config(self, host_id: str, **extra: Any) -> NodeConfig:
        try:
            return NodeConfig(host_id=host_id, limits=Limits(**self.limits), **self.node, **extra)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"node settings: {exc}") from None

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.values,
            "node": {**self.node, "limits": dict(self.limits)},
            "joms": dict(self.joms),
        }


def _joms_settings() -> Any:
    """``joms.service.config`` (imported here only: the daemon runs without JOMS)."""
    from joms.service import config

    return config


def _joms_queues() -> Any:
    """``joms.service.queues`` (where ``receiver_policy`` is loaded)."""
    from joms.service import queues

    return queues


def _check_joms(where: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[joms]`` table, checked the way the service will read it (names, types,
    ranges); a one-line ConfigError otherwise."""
    try:
        settings = _joms_settings()
    except ImportError as exc:  # pragma: no cover - joms ships with dodwan
        raise ConfigError(f"{where} needs the joms package: {exc}") from None
    try:
        service = settings.ServiceConfig.from_mapping(table)
        # with or without --stomp: a policy that cannot load is an error now, not a
        # traceback when a STOMP gateway is started one day
        _joms_queues().load_policy(service.receiver_policy)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return dict(table)


def _check_joms_ttl(joms: Mapping[str, Any], max_ttl: float) -> None:
    """A JMS message sent without an expiration lives ``default_ttl``: beyond the core's
    ``max_ttl`` every such send would be refused."""
    given = joms.get("default_ttl", _joms_settings().ServiceConfig().default_ttl)
    if float(given) > max_ttl:
        raise ConfigError(
            f"[joms] default_ttl ({as_given(given)} s) must be at most node.limits.max_ttl "
            f"({max_ttl:g} s): every JMS message sent without an expiration would be refused"
        )


def load(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> DaemonConfig:
    """Defaults, then the TOML file (if any), then non-None ``overrides`` (command line)."""
    values = {s.name: s.default for s in SETTINGS}
    node = dict(NODE_DEFAULTS)
    limits: dict[str, Any] = {}
    joms: dict[str, Any] = {}
    if path is not None:
        try:
            # utf-8-sig: a byte order mark (Windows editors) is no TOML statement
            data = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        for key, value in data.items():
            if key == "node":
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: [node] must be a table")
                for nk, nv in value.items():
                    if nk == "limits":
                        if not isinstance(nv, dict):
                            raise ConfigError(f"{path}: [node.limits] must be a table")
                        for lk, lv in nv.items():
                            if lk in REPLACED_LIMITS:
                                raise ConfigError(
                                    f"{path}: node.limits.{lk} was replaced by "
                                    f"node.limits.{REPLACED_LIMITS[lk]} (one budget, in bytes, "
                                    "for all the state peers make this host keep)"
                                )
                            if lk not in LIMIT_DEFAULTS:
                                raise ConfigError(f"{path}: unknown setting node.limits.{lk}")
                            limits[lk] = _check_type(
                                f"{path}: node.limits.{lk}", lv, LIMIT_DEFAULTS[lk]
                            )
                        continue
                    if nk not in NODE_FIELDS:
                        raise ConfigError(f"{path}: unknown setting node.{nk}")
                    node[nk] = _check_type(f"{path}: node.{nk}", nv, NODE_DEFAULTS[nk])
            elif key == "joms":
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: [joms] must be a table")
                joms = _check_joms(f"{path}: [joms]", value)
            elif key in BY_NAME:
                values[key] = _check_type(f"{path}: {key}", value, BY_NAME[key].default)
            else:
                raise ConfigError(f"{path}: unknown setting {key!r}")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in BY_NAME:
            values[key] = _check_type(f"--{key.replace('_', '-')}", value, BY_NAME[key].default)
        elif key in NODE_FIELDS:
            node[key] = _check_type(f"--{key.replace('_', '-')}", value, NODE_DEFAULTS[key])
        else:
            raise ConfigError(f"unknown setting {key!r}")
    if values["log_level"] not in ("debug", "info", "warning", "error"):
        raise ConfigError("log_level must be debug, info, warning or error")
    if values["network_key_mode"] not in ("auth", "encrypt"):
        raise ConfigError("network_key_mode must be auth or encrypt")
    if bool(values["stomp_login"]) != bool(values["stomp_passcode_file"]):
        raise ConfigError("stomp_login and stomp_passcode_file go together")
    if str(values["sqlite_synchronous"]).upper() not in ("NORMAL", "FULL", "EXTRA", "OFF"):
        raise ConfigError("sqlite_synchronous must be NORMAL, FULL, EXTRA or OFF")
    for name in (
        "bitrate",
        "burst",
        "socket_buffer",
        "exec_timeout",
        "fragment_commit_delay",
        "fragment_cache",
    ):
        if values[name] < 0:
            raise ConfigError(f"{name} must not be negative")
    for name in ("exec_concurrency", "burst"):
        if values[name] < 1:
            raise ConfigError(f"{name} must be at least 1")
    if not 1 <= values["multicast_ttl"] <= 255:
        raise ConfigError("multicast_ttl must be between 1 and 255")
    size = limits.get("max_message_size", LIMIT_DEFAULTS["max_message_size"])
    if isinstance(size, int) and not isinstance(size, bool) and size <= PUBLISH_MARGIN:
        raise ConfigError(
            f"node.limits.max_message_size = {size} leaves no room for a publication: it must "
            f"be at least {PUBLISH_MARGIN + 1} (the largest payload is "
            f"min(max_message_size, cache_capacity) - {PUBLISH_MARGIN} bytes)"
        )
    _check_ranges("", values, RANGES)
    _check_ranges("node.", node, NODE_RANGES)
    _check_ranges("node.limits.", {**LIMIT_DEFAULTS, **limits}, LIMIT_RANGES)
    _check_bridges(values["bridges"], float({**LIMIT_DEFAULTS, **limits}["max_ttl"]))
    _check_joms_ttl(joms, float({**LIMIT_DEFAULTS, **limits}["max_ttl"]))
    if node["neighbour_timeout"] and node["neighbour_timeout"] <= node["announce_period"]:
        raise ConfigError(
            f"node.neighbour_timeout ({as_given(node['neighbour_timeout'])} s) must be 0 (3 × "
            "announce_period) or longer than node.announce_period "
            f"({as_given(node['announce_period'])} s)"
        )
    if node["request_timeout"] <= node["request_delay"]:
        raise ConfigError("node.request_timeout must be longer than node.request_delay")
    conf = DaemonConfig(values, node, limits, joms)
    conf.node_config("check")  # what the core itself refuses, as a one-line error
    return conf


def _check_ranges(
    prefix: str, values: Mapping[str, Any], ranges: Mapping[str, tuple[float, float]]
) -> None:
    """Every number finite and within its bounds; the error names the setting."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value):
            raise ConfigError(f"{prefix}{name} must be a finite number, not {value}")
        bounds = ranges.get(name)
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            text = _range_text(bounds, name in BYTE_SIZES)
            raise ConfigError(f"{prefix}{name} = {as_given(value)} is out of range ({text})")


def _check_bridges(tables: Any, max_ttl: float) -> None:
    """Refuse a bad ``[[bridges]]`` table at load time, with the binding's reason."""
    from ..bridges.uri import BindingSpec, SpecError

    if not isinstance(tables, list):
        raise ConfigError("bridges must be an array of tables ([[bridges]])")
    names: set[str] = set()
    for i, table in enumerate(tables):
        try:
            spec = BindingSpec.from_dict(table, max_ttl)
        except SpecError as exc:
            raise ConfigError(f"[[bridges]] #{i + 1}: {exc}") from None
        if spec.name in names:
            made = "" if table.get("name") else " (made from the URI: give each a name)"
            raise ConfigError(f"[[bridges]] #{i + 1}: binding name {spec.name!r} used twice{made}")
        names.add(spec.name)


def default_state_dir() -> Path:
    """``$DODWAN_STATE_DIR``, else ``$XDG_STATE_HOME/dodwan``, else ``~/.local/state/dodwan``."""
    env = os.environ.get("DODWAN_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "dodwan"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def render_markdown() -> str:
    """The reference page ``docs/configuration.md`` (regenerate after changing a setting)."""
    lines = [
        "# Daemon configuration",
        "",
        "<!-- Generated by `python -m dodwan.daemon.config`; edit dodwan/daemon/config.py"
        " and dodwan/core/config.py instead. -->",
        "",
        "`dodwan daemon` reads its settings from, in increasing priority: the defaults below,",
        "the TOML file given with `--config FILE` (UTF-8; a byte order mark at its start, as",
        "some Windows editors write, is ignored), and command-line options. Every daemon",
        "setting but `bridges` is also a `dodwan daemon --<name>` option (underscores become",
        "dashes; bindings are added at run time with `dodwan bridge add`); an",
        "option's number is written with ASCII digits, as in TOML (`--horizon 3`, not `٣`",
        "nor `1_0`). The state directory is `--state-dir`, else `state_dir` from the file,",
        "else `$DODWAN_STATE_DIR`, else `$XDG_STATE_HOME/dodwan`, else `~/.local/state/dodwan`;",
        "the other commands (`dodwan status`, …) find the daemon through it.",
        "Protocol settings of the core go in the `[node]` table of the file.",
        "",
        "Example:",
        "",
        "```toml",
        'interface = "wlan0"',
        'group = "239.255.42.42:8500"',
        "bitrate = 2000000",
        "",
        "[node]",
        "announce_period = 5.0",
        "cache_capacity = 268435456",
        "```",
        "",
        "## Daemon settings",
        "",
        "Every numeric setting must be finite and within its range, and settings must agree",
        "with each other (e.g. `neighbour_timeout` longer than `announce_period`); the daemon",
        "refuses to start otherwise, with a one-line error naming the setting.",
        "",
        "| name | default | range | meaning |",
        "|---|---|---|---|",
    ]
    for s in SETTINGS:
        rng = _range_text(RANGES.get(s.name), s.name in BYTE_SIZES)
        lines.append(f"| `{s.name}` | `{_toml_value(s.default)}` | {rng} | {s.help} |")
    lines += [
        "",
        "## Protocol settings (`[node]` table)",
        "",
        "These are the fields of the core's `NodeConfig`; the host id is the daemon setting",
        "`host_id`.",
        "",
        f"`max_datagram` starts at {MIN_DATAGRAM} bytes (the core alone allows 256): every",
        "fragment datagram carries the compressed descriptor, about 520 bytes for a signed",
        "message from a 64-character host id, and at least 64 bytes of payload, so a smaller",
        "datagram could refuse every publication; what is left holds a few short application",
        "attributes (a descriptor that does not fit is refused with a 400 naming it).",
        "",
        "| name | default | range | meaning |",
        "|---|---|---|---|",
    ]
    docs = field_docs()
    for name in NODE_FIELDS:
        rng = _range_text(NODE_RANGES.get(name), name in BYTE_SIZES)
        lines.append(
            f"| `{name}` | `{_toml_value(NODE_DEFAULTS[name])}` | {rng} | {docs.get(name, '')} |"
        )
    lines += [
        "",
        "With `trace = true` the daemon appends every trace record to `STATE_DIR/trace.jsonl`",
        "(one JSON object per line: time, kind, msg_id, size, hops, detail).",
    ]
    lines += [
        "",
        "## Limits (`[node.limits]` table)",
        "",
        "Bounds on what a peer (or a local caller) can make the node hold or compute. The",
        "defaults suit a radio; on loopback or a fast LAN raise `max_requests_per_second`.",
        "The largest payload `POST /publish` accepts (`max_payload` in `GET /status`) is the",
        f"smallest of `min(max_message_size, cache_capacity) − {PUBLISH_MARGIN // 1024} KiB`",
        f"(hence the minimum of `max_message_size`, {PUBLISH_MARGIN + 1} bytes: one byte of",
        "payload), the admin API's 96 MiB request body, and what `max_fragments` fragments of",
        "`max_datagram` hold: counted for an incompressible payload with up to",
        f"{ATTRIBUTE_RESERVE} bytes of compressed application attributes (about",
        "`max_fragments × (max_datagram − 300)` unsigned; payloads are zstd-compressed, but a",
        "larger compressible payload is refused too).",
        "",
        "| name | default | range | meaning |",
        "|---|---|---|---|",
    ]
    ldocs = limit_docs()
    for name, default in LIMIT_DEFAULTS.items():
        rng = _range_text(LIMIT_RANGES.get(name), name in BYTE_SIZES)
        lines.append(f"| `{name}` | `{_toml_value(default)}` | {rng} | {ldocs.get(name, '')} |")
    joms = _joms_settings()
    jdefaults = joms.ServiceConfig()
    lines += [
        "",
        "## JOMS settings (`[joms]` table)",
        "",
        "Settings of the JOMS service behind the STOMP gateway (`--stomp`), the fields of",
        "`joms.service.ServiceConfig` (see `docs/joms.md`); checked when the daemon starts,",
        "with or without `--stomp`. Durations are seconds and must be finite (`nan` and `inf`",
        "are refused, with one line naming the setting); `default_ttl` must be at most",
        "`node.limits.max_ttl` (a longer one would have every message sent without an",
        "expiration refused).",
        "",
        "| name | default | at most | meaning |",
        "|---|---|---|---|",
    ]
    for name, doc in joms.field_docs().items():
        text = " ".join(doc.split())
        bound = joms.UPPER_BOUNDS.get(name)
        most = "" if bound is None else bound[1]
        lines.append(f"| `{name}` | `{_toml_value(getattr(jdefaults, name))}` | {most} | {text} |")
    lines += [
        "",
        "## Running under a service manager",
        "",
        "`dodwan daemon` stays in the foreground, logs to stderr and stops cleanly on SIGTERM",
        "or SIGINT, which is what systemd and similar managers expect. For example:",
        "",
        "```ini",
        "[Unit]",
        "Description=DoDWAN delay-tolerant publish/subscribe",
        "After=network-online.target",
        "",
        "[Service]",
        "ExecStart=/usr/local/bin/dodwan daemon --state-dir /var/lib/dodwan "
        "--config /etc/dodwan.toml",
        "Restart=on-failure",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "```",
        "",
        "Only one daemon runs per state directory (a lock file enforces it). Keep the state",
        "directory out of reach of tmp cleaners (`/tmp` is a poor place for it): a lock file",
        "removed with its directory no longer holds back a second daemon. A daemon notices within a",
        "second that its state directory, lock file or `dodwan.db` was removed or replaced, logs",
        "an ERROR line, shows it in `GET /status` `health` and refuses new publications and",
        "subscriptions (`503`) rather than acknowledge what it could not keep; it goes on carrying",
        "the messages it holds until it is restarted (see `docs/reliability.md`). Several daemons",
        "with different state directories on the same group and interface form one island,",
        "which is how tests and demos run on one machine. Other commands find the daemon",
        "through `STATE_DIR/admin.json` (see `docs/admin-api.md`).",
        "",
        "## Durability",
        "",
        "The cache, subscriptions, their outputs, the reception history and the host id live in",
        "`STATE_DIR/dodwan.db` (SQLite, WAL). Every input of the core (a publication, a",
        "datagram, a timer, a subscription) ends with a commit, so once `dodwan publish`",
        "returns, or a message is completely received, it survives `kill -9` of the daemon.",
        'With the default `sqlite_synchronous = "NORMAL"` a power loss or kernel crash may',
        'lose the last transactions; `"FULL"` closes that gap at the cost of an fsync per input.',
        "",
        "## Memory",
        "",
        "What a daemon holds in memory is bounded by settings, not by how long it runs:",
        "",
        "* cached messages: `cache_capacity` bytes (their fragments are in SQLite; the core's",
        "  per-message tables follow the number of cached messages);",
        "* incomplete messages being reassembled: `max_partial_bytes`;",
        "* fragments kept in memory besides SQLite: `fragment_cache` bytes;",
        "* JOMS non-persistent messages, kept in memory instead of SQLite: 16 MiB (then",
        "  stored like the others);",
        "* SQLite's page cache: SQLite's default (about 2 MB) per connection — the daemon's",
        "  own and the one that copies the write-ahead log back into the database;",
        "* fragments received or published since the last commit (written in one statement",
        "  at the commit): at most `fragment_commit_delay` seconds' or 4096 writes' worth;",
        "* per neighbour, the ids of messages it offered: at most 4 × `max_catalog_entries`",
        "  (the older half is dropped when that is reached);",
        "* compiled subscriptions of other hosts: the 4 versions compiled last, per host;",
        "* the 256 datagrams decoded last;",
        "* `--dir` deliveries waiting for their directory to take writes again (disk full, out of",
        "  file descriptors): at most 10,000, their payloads kept up to `dir_wait_memory` bytes",
        "  (all dir sinks together); beyond that a delivery holds its message id and subscription",
        "  key only (the payload read again from the cache when it is written, given up if the",
        "  message left the cache meanwhile); beyond 10,000 the newest are left to the",
        "  redelivery at the next start.",
        "",
        "Datagrams are received into one reused buffer and copied at their size, so what the",
        "node keeps does not fragment the C heap. `docs/reliability.md` (Soak) shows the",
        "resident memory levelling off under continuous load. For diagnosis,",
        "`DODWAN_MEMTRACE=DIR` makes the daemon append a memory sample (RSS, glibc heap,",
        "SQLite, live objects, its own tables) to `DIR/mem.jsonl` every",
        "`DODWAN_MEMTRACE_PERIOD` seconds (default 30); `DODWAN_TRACEMALLOC=N` adds tracemalloc",
        "snapshots with `N` frames.",
        "",
        "## Which protocol core runs (`DODWAN_NATIVE`)",
        "",
        "The daemon, the simulator and every other program import the protocol core compiled",
        "with mypyc when `build/native/` holds a build made from the core's current sources",
        "(`make setup` makes it; `python -m dodwan.native build` remakes it), and the pure Python",
        "core otherwise; both behave the same. `DODWAN_NATIVE=0` forces the pure Python core.",
        "`python -m dodwan.native status` prints which core a process would run and why (for",
        "example `pure Python core: sources changed since the native build: dodwan.core.gossip`); a",
        "simulation's `run.json` records it as `core`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown(), end="")
