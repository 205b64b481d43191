"""STOMP 1.2: the frame codec (sans-IO) and the asyncio gateway serving the JOMS service."""
