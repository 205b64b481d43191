"""DoDWAN: delay-tolerant, content-based publish/subscribe for disconnected mobile networks."""

from .core import (
    BROADCAST,
    CacheFullError,
    Limits,
    MemoryStore,
    MessageDelivered,
    MessageEvicted,
    NeighbourFound,
    NeighbourLost,
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
    "Node",
    "NodeConfig",
    "Profile",
    "Store",
    "TraceRecord",
    "__version__",
]
