"""The JOMS service: JMS semantics over DoDWAN's publish/subscribe, sans-IO and clock-free."""

from .config import ServiceConfig
from .events import Event, MessageDispatched
from .model import Destination, JomsMessage
from .port import DisseminationPort
from .service import JomsService
from .store import MemoryServiceStore, ServiceStore, SqliteServiceStore, StoreWriteError

__all__ = [
    "Destination",
    "DisseminationPort",
    "Event",
    "JomsMessage",
    "JomsService",
    "MemoryServiceStore",
    "MessageDispatched",
    "ServiceConfig",
    "ServiceStore",
    "SqliteServiceStore",
    "StoreWriteError",
]
