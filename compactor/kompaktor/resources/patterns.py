"""The pattern rules of the allow-lists, shared by what checks them: ``OperatorConfig`` refuses an
entry that breaks them when it is read, admission matches a group's values against the entries
(:mod:`kompaktor.resources.admission`, which says what each list allows). A module of their own so
that those two import it and never each other. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

#: what a trailing ``*`` of an entry matches: one more segment — a host label, a port, a path
#: segment or a dotted key's last part (no ``.``, ``/``, ``:``, ``@``, ``,``, space or non-ASCII)
SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
#: ... and in an image reference, one repository path segment with its tag and/or digest
IMAGE_SEGMENT = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
#: the characters an entry's ``*`` must follow: it widens an entry on a boundary only
WILDCARD_BOUNDARIES = "/:."


def wildcard_problem(entry: str) -> str | None:
    """Why ``entry`` is not a valid allow-list entry (a ``*`` elsewhere than last, after a
    boundary), or None."""
    if "*" not in entry:
        return None
    if entry.count("*") > 1 or not entry.endswith("*") or len(entry) < 2 or entry[-2] not in WILDCARD_BOUNDARIES:
        return (
            f"allow-list entry {entry!r}: a '*' may only end an entry, right after one of "
            f"{' '.join(WILDCARD_BOUNDARIES)} (e.g. 'registry.corp/team/*', 'spark://master.spark:*', 'spark.ui.*')"
        )
    return None


def listed(value: str, entries: Iterable[str], segment: re.Pattern[str] = SEGMENT) -> bool:
    """``value`` equals an entry, or an entry ends in ``*`` (after ``/``, ``:`` or ``.``) and
    ``value`` is the text before it followed by one ``segment``: ``spark://trusted.spark:*``
    allows ``spark://trusted.spark:7077``, not ``spark://trusted.spark:7077,evil:7077``; an
    entry with a ``*`` anywhere else matches nothing (``OperatorConfig`` refuses it)."""
    for e in entries:
        if not e.endswith("*"):
            if value == e:
                return True
        elif wildcard_problem(e) is None and value.startswith(e[:-1]) and segment.fullmatch(value[len(e) - 1 :]):
            return True
    return False


_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")


def storage_problem(uri: str) -> str | None:
    """Why ``uri`` is not in the one form admission compares, or None.

    pyarrow decodes a URI before it opens it (``file:///a/%2e%2e/b`` is ``/a/../b``), so a URI
    is compared only when decoding cannot change it: printable ASCII, no ``%``, ``\\``, ``@``
    (user part), ``?`` or ``#`` (pyarrow reads settings such as ``endpoint_override`` from the
    query), a lowercase scheme, and a path without empty, ``.`` or ``..`` segments (one
    trailing ``/`` aside)."""
    if any(not 33 <= ord(c) <= 126 for c in uri):
        return "has a space, a control or a non-ASCII character"
    for char, what in (
        ("%", "a percent-encoded character"),
        ("\\", "a backslash"),
        ("@", "a user part"),
        ("?", "a query"),
        ("#", "a fragment"),
        ("*", "a wildcard"),
    ):
        if char in uri:
            return f"has {what} ({char!r})"
    parts = urlsplit(uri)
    if not _SCHEME.match(uri.partition(":")[0]) or "://" not in uri:
        return "is not scheme://location/path with a lowercase scheme"
    path = parts.path[:-1] if parts.path.endswith("/") else parts.path
    if any(seg in ("", ".", "..") for seg in path.split("/")[1:]):
        return "has an empty ('//'), '.' or '..' path segment"
    return None


def storage_key(uri: str) -> tuple[str, str, list[str]]:
    parts = urlsplit(uri)
    return parts.scheme, parts.netloc, [s for s in parts.path.split("/") if s]
