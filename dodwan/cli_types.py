"""Click parameter types the command-line tools share: numbers that are finite and written
with ASCII digits (Python's float() reads ``nan``, ``inf``, ``٣`` and ``1_0``)."""

from __future__ import annotations

import math
from typing import Any

import click

from .units import is_plain_number


class FiniteFloat(click.FloatRange):
    """A float option in a range that is also finite: ``nan``, ``inf`` (which Python's
    float() reads) made a run that never ends and a run.json that is not JSON."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = 0.0  # the range type says what is wrong
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        if isinstance(value, str) and not is_plain_number(value):  # float() reads ٣ and 1_0
            self.fail(f"{value!r} is not a number written with ASCII digits.", param, ctx)
        return super().convert(value, param, ctx)


class PlainIntRange(click.IntRange):
    """An integer option in a range, written with ASCII digits (int() reads ٣ and 1_0)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not is_plain_number(value, integer=True):
            self.fail(f"{value!r} is not an integer written with ASCII digits.", param, ctx)
        return super().convert(value, param, ctx)


def non_empty(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Option callback: refuse an empty path (``--out ''`` once wrote a run's tables into
    the current directory, after removing an earlier run's there)."""
    if isinstance(value, str) and not value.strip():
        raise click.BadParameter("is empty: name a folder or file (. for the current folder)")
    return value
