"""Across seeds: mean, standard deviation and Student-t 95 % confidence interval of every
numeric metric, per setting of a sweep.

The t quantile is computed here rather than taken from scipy: for the integer degrees of
freedom a sweep has, the Student t distribution function has an exact finite closed form
(Abramowitz & Stegun 26.7.3/26.7.4), and bisection on it gives the quantile to 1e-12 —
a few lines, where scipy would add a large dependency for one function.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CONFIDENCE = 0.95

SKIPPED_SECTIONS = ("run", "sweep")
"""Metric sub-tables that describe the run rather than measure it (not aggregated)."""


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` >= 1 degrees of freedom (A&S 26.7.3/4)."""
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    s = math.sin(theta)
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):  # cos θ (1 + 2/3 cos² θ + 2·4/(3·5) cos⁴ θ ...)
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 cos² θ + 1·3/(2·4) cos⁴ θ ...
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = ``confidence`` (e.g. 0.95 -> 2.776 for df = 4)."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    lo, hi = 0.0, 1.0
    while t_cdf_two_sided(hi, df) < confidence:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf_two_sided(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


@dataclass(frozen=True)
class Summary:
    """One metric of one setting across seeds."""

    n: int
    mean: float
    std: float | None
    """Sample standard deviation (n - 1 in the denominator); None for one seed."""
    ci: float | None
    """Half width of the 95 % confidence interval of the mean; None for one seed."""

    @property
    def low(self) -> float | None:
        return None if self.ci is None else self.mean - self.ci

    @property
    def high(self) -> float | None:
        return None if self.ci is None else self.mean + self.ci

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean": self.mean,
            "std": self.std,
            "ci95": self.ci,
            "ci95_low": self.low,
            "ci95_high": self.high,
        }


def summarise(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean, sample std and t confidence half-width of ``values`` (at least one)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if n == 1:
        return Summary(1, mean, None, None)
    std = statistics.stdev(values)
    return Summary(n, mean, std, t_quantile(confidence, n - 1) * std / math.sqrt(n))


def numeric_leaves(metrics: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, float]]:
    """(dotted path, value) for every finite number in a run's metrics (booleans excluded)."""
    for k, v in metrics.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            if not prefix and k in SKIPPED_SECTIONS:
                continue
            yield from numeric_leaves(v, path)
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            yield path, float(v)


@dataclass
class SettingResult:
    """All seeds of one setting."""

    setting: dict[str, Any]
    label: str
    runs: list[str] = field(default_factory=list)
    """Names of the runs (one per seed) in the report."""
    seeds: list[int] = field(default_factory=list)
    metrics: dict[str, Summary] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "label": self.label,
            "runs": self.runs,
            "seeds": self.seeds,
            "metrics": {k: s.as_dict() for k, s in self.metrics.items()},
        }


def aggregate(
    runs: Sequence[tuple[str, dict[str, Any], str, int, Mapping[str, Any]]],
) -> list[SettingResult]:
    """Group ``(run name, setting, label, seed, metrics)`` by setting, in first-seen order,
    and summarise every numeric metric over the runs that have it."""
    groups: dict[str, SettingResult] = {}
    values: dict[str, dict[str, list[float]]] = {}
    for name, setting, label, seed, metrics in runs:
        key = repr(sorted(setting.items()))
        g = groups.setdefault(key, SettingResult(dict(setting), label))
        g.runs.append(name)
        g.seeds.append(seed)
        per = values.setdefault(key, {})
        for path, v in numeric_leaves(metrics):
            per.setdefault(path, []).append(v)
    for key, g in groups.items():
        g.metrics = {path: summarise(vs) for path, vs in values[key].items()}
    return list(groups.values())
