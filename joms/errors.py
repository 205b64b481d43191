"""The JMS 1.1 exception hierarchy (javax.jms), as Python exceptions.

Every JOMS error a caller can catch is a :class:`JMSException`. Like its Java model it
carries a human-readable *reason* (``str(exc)``) and an optional provider-specific
*error code*. A lower-level cause is chained the Python way (``raise ... from exc``) rather
than through JMS's ``setLinkedException``.
"""

from __future__ import annotations

from typing import Any


class JMSException(Exception):
    """Root of all JMS errors: a reason and an optional provider-specific error code."""

    def __init__(self, reason: str = "", error_code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        """Human-readable description (also ``str(exc)``)."""
        self.error_code = error_code
        """Provider-specific error code, or None."""

    def __str__(self) -> str:
        return self.reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep error_code and subclass attributes across pickling (Exception only keeps args).
        return (type(self), (self.reason, self.error_code), self.__dict__)


class IllegalStateException(JMSException):
    """A method was invoked at an illegal or inappropriate time."""


class InvalidClientIDException(JMSException):
    """A client set an invalid or already-used client identifier."""


class InvalidDestinationException(JMSException):
    """A destination is not understood by the provider or is no longer valid."""


class InvalidSelectorException(JMSException):
    """A message selector has invalid syntax; ``position`` is the offending offset, if known."""

    def __init__(
        self, reason: str = "", error_code: str | None = None, *, position: int | None = None
    ) -> None:
        super().__init__(reason, error_code)
        self.position = position
        """0-based character offset in the selector where the problem was found, or None."""


class JMSSecurityException(JMSException):
    """Authentication or authorisation was refused."""


class MessageEOFException(JMSException):
    """A stream or bytes message body was read past its end."""


class MessageFormatException(JMSException):
    """A message body or property was read or written with an incompatible type."""


class NumberFormatException(MessageFormatException, ValueError):
    """A string property read as a number does not parse as one (Java's
    NumberFormatException of JMS 1.1 §3.5.4; here a MessageFormatException, so a JMSException,
    and a ValueError), or a property that does not exist was read as a number."""


class MessageNotReadableException(JMSException):
    """A client tried to read a write-only message."""


class MessageNotWriteableException(JMSException):
    """A client tried to write a read-only message."""


class RequestTimeoutException(JMSException):
    """JOMS extension: a request got no answer (receipt or ERROR) in time while the
    connection stayed up. Its outcome is unknown: a SEND may still be published once a
    hung daemon resumes, so the caller must not read it as a refusal. Raised by the client
    only: not in ``__all__``, the names a server's ``joms-exception`` header may give."""


class ResourceAllocationException(JMSException):
    """The provider could not allocate a resource the caller asked for."""


class TransactionInProgressException(JMSException):
    """An operation is invalid because a transaction is in progress."""


class TransactionRolledBackException(JMSException):
    """A commit failed and the transaction was rolled back instead."""


__all__ = [
    "IllegalStateException",
    "InvalidClientIDException",
    "InvalidDestinationException",
    "InvalidSelectorException",
    "JMSException",
    "JMSSecurityException",
    "MessageEOFException",
    "MessageFormatException",
    "MessageNotReadableException",
    "MessageNotWriteableException",
    "NumberFormatException",
    "ResourceAllocationException",
    "TransactionInProgressException",
    "TransactionRolledBackException",
]
