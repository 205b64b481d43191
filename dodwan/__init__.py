"""DoDWAN: delay-tolerant, content-based publish/subscribe for disconnected mobile networks."""

from . import native

native.activate()  # before the core is imported: its compiled build, if built for it

from .core import (  # noqa: E402
    BROADCAST,
    CacheFullError,
    Limits,
    MemoryStore,
    MessageDelivered,
    MessageEvicted,
    NeighbourFound,
    NeighbourLost,
    NeighbourRestarted,
    Node,
    NodeConfig,
    Profile,
    Store,
    TraceRecord,
)

__version__ = "0.1.0"

__all__ = [
    "BROADCAST",
    "CacheFullError",
    "Limits",
    "MemoryStore",
    "MessageDelivered",
    "MessageEvicted",
    "NeighbourFound",
    "NeighbourLost",
    "NeighbourRestarted",
    "Node",
    "NodeConfig",
    "Profile",
    "Store",
    "TraceRecord",
    "__version__",
]
