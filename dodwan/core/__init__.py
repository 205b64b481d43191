"""DoDWAN protocol core: sans-IO, clock-free, shared by the daemon and the simulator."""

from .config import NodeConfig
from .errors import WireError
from .events import (
    Event,
    MessageDelivered,
    MessageEvicted,
    NeighbourFound,
    NeighbourLost,
    NeighbourRestarted,
    TraceRecord,
)
from .limits import Limits
from .node import BROADCAST, CacheFullError, Node
from .patterns import Pattern, PatternError, Profile
from .store import MemoryStore, MessageMeta, Store

__all__ = [
    "BROADCAST",
    "CacheFullError",
    "Event",
    "Limits",
    "MemoryStore",
    "MessageDelivered",
    "MessageEvicted",
    "MessageMeta",
    "NeighbourFound",
    "NeighbourLost",
    "NeighbourRestarted",
    "Node",
    "NodeConfig",
    "Pattern",
    "PatternError",
    "Profile",
    "Store",
    "TraceRecord",
    "WireError",
]
