"""Mobility: where every host is, stepped in one numpy array.

``World`` holds positions of all hosts (row i = host i) and one model per group, each
owning a contiguous slice of rows. Models: ``static``/``island`` (never move),
``random_waypoint`` and ``carrier`` (``waypoint``), ``random_walk`` (``walk``). Contact
traces replayed instead of mobility live in ``trace``.
"""

from sim.mobility.base import Model, World, build_world

__all__ = ["Model", "World", "build_world"]
