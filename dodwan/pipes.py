"""Output to a reader that went away (``dodwan ... | head``): the command ends quietly with
:data:`BROKEN_PIPE_STATUS`, as a tool killed by SIGPIPE does, after pointing stdout at
/dev/null (the Python docs' recipe, "Note on SIGPIPE")."""

from __future__ import annotations

import os
from typing import Any

BROKEN_PIPE_STATUS = 141
"""128 + SIGPIPE: the status of a tool the signal ended."""


def to_devnull(stream: Any) -> None:
    """Point ``stream``'s file descriptor at /dev/null: what is still buffered, later writes
    and the flush at exit then succeed instead of raising BrokenPipeError again."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
