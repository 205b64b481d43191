"""Garbage-collector settings of a long-running process (the daemon, the JOMS runtime).

A broker keeps each cached message as a few objects the collector tracks (its cache entry,
header, metadata) and allocates a few dozen short-lived ones per message. With the
interpreter's defaults, every full collection walks again the modules and objects of the
start-up (about 40,000 in the JOMS runtime), and collections took about 7 % of the JOMS
process's CPU in ``bench/bench_stomp.py`` (270 ms of 3.5 s, two thirds of it in three full
collections). What was built before serving is frozen (never walked again: it lives as long
as the process anyway) and the youngest generation is collected every ``YOUNG_THRESHOLD``
net allocations instead of 700: in the same bench, 110 ms in collections, one full one.
Cyclic garbage is still collected, a little later.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 2000
"""Net allocations of tracked objects between two collections of the youngest generation
(the interpreter's default is 700); the older generations keep their defaults."""


def settle_collector() -> None:
    """Collect once, freeze what survives (the start-up), and space young collections out.
    Call it once the process is set up, before it starts serving."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
