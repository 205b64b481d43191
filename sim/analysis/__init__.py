"""Spark analysis of simulation logs and contact traces.

Importable from notebooks: build a session with :func:`create_session`, then call
:func:`analyze_run` / :func:`analyze_contact_trace` and :func:`write_report`.
"""

from sim.analysis.errors import AnalysisError
from sim.analysis.pipeline import RunResult, analyze_contact_trace, analyze_run
from sim.analysis.report import write_report
from sim.analysis.session import create_session

__all__ = [
    "AnalysisError",
    "RunResult",
    "analyze_contact_trace",
    "analyze_run",
    "create_session",
    "write_report",
]
