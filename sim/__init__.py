"""dodwan-sim: a SimPy mobility simulator that runs the real DoDWAN protocol core on every host.

Layout: ``scenario`` (TOML format, loader, validator), ``mobility/`` (movement models and
contact traces), ``grid`` (spatial index for neighbour sets), ``medium`` (radio: air time,
loss, one datagram at a time per sender), ``host`` (the SimPy adapter around a core
``Node``), ``traffic`` (publishers, subscribers, targets), ``logs`` (Parquet tables),
``runner`` (wires a run together), ``cli`` (the ``dodwan-sim`` command).
"""

import dodwan  # noqa: F401  (first: puts the native build in front, see dodwan.native)
