"""The one error the analysis raises for bad or missing inputs (shown to users as one line),
and the helper that turns a Spark/JVM failure into such a line."""

from __future__ import annotations

import contextlib
import re

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException

SPARK_ERRORS: tuple[type[BaseException], ...] = (PySparkException, Py4JError)
"""What a failed Spark call raises (captured SQL errors, or raw JVM errors via Py4J)."""


class AnalysisError(Exception):
    """An input (run directory, table, trace, option) is missing or malformed."""


def brief(exc: BaseException, limit: int = 240) -> str:
    """One readable line from a Spark or Py4J exception (no JVM stack trace)."""
    text = str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):  # the JVM may be gone
            text = str(java.getMessage() or java.toString())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("An error occurred", "at ", "JVM stack"))]
    line = lines[0] if lines else type(exc).__name__
    line = re.sub(r"^(?:[a-z]+\.)+[A-Za-z]+(?:Exception|Error):\s*", "", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"
