"""The DoDWAN daemon: an asyncio adapter around the sans-IO core (UDP, SQLite, admin API).

No protocol logic lives here: see :mod:`dodwan.core` for that.
"""
