"""Seed derivation: one independent, reproducible random stream per purpose.

``derive(seed, "mobility", "walker")`` always gives the same 63-bit integer for the same
arguments (SHA-256, not Python's salted ``hash``), so runs never depend on the process.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np


def derive(seed: int, *labels: object) -> int:
    """A 63-bit seed for the stream named by ``labels`` under the scenario ``seed``."""
    text = "/".join([str(seed), *map(str, labels)]).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def py_rng(seed: int, *labels: object) -> random.Random:
    """A ``random.Random`` for one purpose."""
    return random.Random(derive(seed, *labels))


def np_rng(seed: int, *labels: object) -> np.random.Generator:
    """A numpy ``Generator`` for one purpose."""
    return np.random.default_rng(derive(seed, *labels))
