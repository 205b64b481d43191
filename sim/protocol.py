"""DoDWAN settings of simulated hosts: every ``NodeConfig`` field a scenario may set.

The settable keys come from the core's dataclasses, not from a hand list: every field of
:class:`~dodwan.core.config.NodeConfig` except those the simulator decides itself
(``EXCLUDED``), plus the fields of :class:`~dodwan.core.limits.Limits` as the nested
``limits`` table. Defaults are the core's, except ``SIM_DEFAULTS`` (the simulator has
always run ``horizon = 1``). ``docs/scenarios.md`` carries :func:`render_markdown`'s table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dodwan.core.config import NodeConfig, attribute_docs
from dodwan.core.limits import Limits

EXCLUDED = ("host_id", "trace", "signing_key", "max_datagram", "limits")
"""NodeConfig fields not set in ``[protocol]``: the host's name, tracing (always on), the
signing key (unsigned traffic), ``max_datagram`` (``[radio]``) and ``limits`` (its own table)."""

SIM_DEFAULTS: dict[str, Any] = {"horizon": 1}
"""Where the simulator's default differs from the core's (kept so results do not change)."""

_CORE = NodeConfig(host_id="x")
DEFAULTS: dict[str, Any] = {
    f.name: SIM_DEFAULTS.get(f.name, getattr(_CORE, f.name))
    for f in fields(NodeConfig)
    if f.name not in EXCLUDED
}
"""Settable key -> default, in NodeConfig's field order."""

LIMIT_DEFAULTS: dict[str, Any] = {f.name: getattr(Limits(), f.name) for f in fields(Limits)}
"""``[protocol.limits]`` key -> default."""


@dataclass(frozen=True)
class Protocol:
    """DoDWAN settings of the hosts of a group (``Protocol().horizon`` reads a setting)."""

    settings: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULTS))
    """Every key of ``DEFAULTS`` with its value."""
    limits: Mapping[str, Any] = field(default_factory=dict)
    """``Limits`` fields that differ from their defaults."""

    def __getattr__(self, name: str) -> Any:
        if name in DEFAULTS:
            return self.settings[name]
        raise AttributeError(name)

    def node_config(self, host_id: str, **extra: Any) -> NodeConfig:
        """The NodeConfig of one host (``extra``: the fields in ``EXCLUDED`` it needs)."""
        return NodeConfig(host_id=host_id, **self.settings, limits=Limits(**self.limits), **extra)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def render_markdown() -> str:
    """The key tables of ``docs/scenarios.md`` (between its ``protocol-keys`` markers)."""
    docs = attribute_docs(NodeConfig)
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for name, default in DEFAULTS.items():
        lines.append(f"| `{name}` | `{_toml(default)}` | {docs[name]} |")
    lines += ["", "`[protocol.limits]` (and a group's `protocol.limits`):", ""]
    lines += ["| key | default | meaning |", "|---|---|---|"]
    ldocs = attribute_docs(Limits)
    for name, default in LIMIT_DEFAULTS.items():
        lines.append(f"| `{name}` | `{_toml(default)}` | {ldocs[name]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown(), end="")
