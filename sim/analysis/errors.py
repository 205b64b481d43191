"""The one error the analysis raises for bad or missing inputs (shown to users as one line)."""


class AnalysisError(Exception):
    """An input (run directory, table, trace, option) is missing or malformed."""
