"""Errors a person can act on. Every message names what was wrong and where."""

from __future__ import annotations


class KompaktorError(Exception):
    """Base class: the CLI prints the message and exits non-zero, without a traceback."""


class BadFileError(KompaktorError):
    """A data file that is corrupt, unreadable or in the wrong schema."""


class UnsortedError(BadFileError):
    """Entries not in key order."""


class UnknownTableError(KompaktorError):
    pass


class TableExistsError(KompaktorError):
    pass


class ConditionFailed(KompaktorError):
    """A conditional mutation was rejected; ``condition`` names the check that failed."""

    def __init__(self, condition: str, detail: str = "") -> None:
        self.condition = condition
        self.detail = detail
        super().__init__(f"rejected: {condition}" + (f" ({detail})" if detail else ""))


class StoreUnavailable(KompaktorError):
    """Redis cannot be reached after bounded retries."""


class NotPermitted(StoreUnavailable):
    """Redis refused a command to this user (its ACL): to the caller an outage as any other, but
    one that waiting does not end."""


class StorageError(KompaktorError):
    """The data files' storage cannot be used (not a directory, not writable, …)."""


class Fenced(KompaktorError):
    """A coordinator's write carried a fencing token older than the newest one: another
    coordinator has taken over, so this one must stop acting (nothing was changed)."""
