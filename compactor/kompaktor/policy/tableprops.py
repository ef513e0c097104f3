"""Table properties Kompaktor understands, with validation. Unknown keys are allowed (like
Accumulo's ``table.custom.*``) only under ``table.custom.``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from kompaktor.model.errors import KompaktorError
from kompaktor.model.job import Kind
from kompaktor.policy.sizes import parse_accumulo_size

VERSIONS = "table.iterator.versions"
RATIO = "table.compaction.major.ratio"
FILE_MAX = "table.file.max"
SPLIT_THRESHOLD = "table.split.threshold"
SELECTOR = "table.compaction.selector"  # "too-many-deletes" or absent
SELECTOR_THRESHOLD = "table.compaction.selector.threshold"
SELECTION_EXPIRY = "table.compaction.selection.expiration.ms"
DISPATCH_PREFIX = "table.compaction.dispatcher.opts.service"
#: the table's share of the queues of the groups it uses, in (0, 1] (default 1): while other tables
#: wait at the same priority and file count, a table of quota q is served about q jobs for each
#: job of a table of quota 1; while none waits it gets them all (Apache Amoro's quota semantics:
#: a share, exceeded while the group is otherwise idle). docs/planner.md §6.1
QUOTA = "table.compaction.quota"
#: what a delete marker promises once a full compaction dropped it: "kompaktor" (the default)
#: refuses a flush or import of a put it may have hidden; "accumulo" accepts it, and the put is
#: visible again (Apache Accumulo's behaviour). docs/file-format.md, "Deletes stay deleted"
DELETE_SEMANTICS = "table.delete.semantics"
DELETE_SEMANTICS_VALUES = ("kompaktor", "accumulo")
#: the smallest quota is 1 / QUOTA_STEP_MAX: each job of the table moves its virtual time
#: round(1 / q) steps (jobs of a quota-1 table move it one)
QUOTA_STEP_MAX = 1000


INT32_MAX = 2**31 - 1


def _int(k: str, v: str, lo: int, hi: int = INT32_MAX) -> None:
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"{k}={v!r}: not an integer") from None
    if n < lo:
        raise ValueError(f"{k}={v!r}: must be >= {lo}")
    if n > hi:
        raise ValueError(f"{k}={v!r}: must be <= {hi}")


def _float(k: str, v: str, lo: float, hi: float | None = None, *, lo_open: bool = False) -> None:
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"{k}={v!r}: not a number") from None
    if not math.isfinite(x) or x < lo or (lo_open and x == lo) or (hi is not None and x > hi):
        lo_text = f"({lo}" if lo_open else f"[{lo}"
        hi_text = f"{hi}]" if hi is not None else "∞)"
        raise ValueError(f"{k}={v!r}: must be a finite number in {lo_text}, {hi_text}")


def validate_props(props: Mapping[str, str | None]) -> None:
    """Raise ValueError naming the first bad property; ``None`` values mean removal."""
    for k, v in props.items():
        if v is None:
            continue
        if k == VERSIONS:
            _int(k, v, 1)
        elif k == RATIO:
            _float(k, v, 1.0)
        elif k == FILE_MAX:
            _int(k, v, 0)
        elif k == SPLIT_THRESHOLD:
            if parse_accumulo_size(v) <= 0:
                raise ValueError(f"{k}={v!r}: must be > 0")
        elif k == SELECTOR:
            if v not in ("too-many-deletes", ""):
                raise ValueError(f"{k}={v!r}: the only selector is 'too-many-deletes'")
        elif k == SELECTOR_THRESHOLD:
            _float(k, v, 0.0, 1.0, lo_open=True)
        elif k == QUOTA:
            _float(k, v, 1.0 / QUOTA_STEP_MAX, 1.0)
        elif k == DELETE_SEMANTICS:
            if v not in DELETE_SEMANTICS_VALUES:
                raise ValueError(f"{k}={v!r}: must be one of {', '.join(DELETE_SEMANTICS_VALUES)}")
        elif k == SELECTION_EXPIRY:
            _int(k, v, 0, 2**53)
        elif k == DISPATCH_PREFIX or k.startswith(DISPATCH_PREFIX + "."):
            kind = k[len(DISPATCH_PREFIX) + 1 :]
            kinds = [k.value.lower() for k in Kind]
            if kind and kind not in kinds:
                raise ValueError(f"{k}: unknown compaction kind {kind!r} ({', '.join(kinds)})")
            if not v:
                raise ValueError(f"{k}: service name must not be empty")
        elif not k.startswith("table.custom."):
            raise ValueError(f"unknown table property {k!r} (custom properties go under table.custom.)")


def dispatch_services(props: Mapping[str, str | None]) -> dict[str, str]:
    """The dispatcher properties among ``props`` that name a service: key → service name."""
    return {k: v for k, v in props.items() if v and (k == DISPATCH_PREFIX or k.startswith(DISPATCH_PREFIX + "."))}


def check_dispatch(props: Mapping[str, str | None], services: Iterable[str]) -> None:
    """Refuse a dispatcher property naming a compaction service that does not exist (planning
    for the table would stop without a word)."""
    known = sorted(services)
    for k, v in dispatch_services(props).items():
        if v not in known:
            raise ValueError(f"{k}={v!r}: no compaction service {v!r} (services: {', '.join(known)})")


DEFAULT_SELECTION_EXPIRY_MS = 120_000


def selection_expiry_ms(props: Mapping[str, str]) -> int:
    """How long a selection with no completed job blocks SYSTEM compactions (docs/planner.md §5)."""
    return int(props.get(SELECTION_EXPIRY, DEFAULT_SELECTION_EXPIRY_MS))


def max_versions(props: Mapping[str, str]) -> int:
    """The table's ``table.iterator.versions`` (default 1), checked."""
    raw = props.get(VERSIONS, "1")
    try:
        n = int(raw)
    except ValueError:
        raise KompaktorError(f"table property {VERSIONS}={raw!r} is not an integer") from None
    if n < 1:
        raise KompaktorError(f"table property {VERSIONS} must be >= 1, got {n}")
    return n


def quota_step(props: Mapping[str, str | None]) -> int:
    """How far one queued job moves its table's virtual time (1 for quota 1, the default); what
    ``queues/lua/queue_add.lua`` computes from the same property inside Redis."""
    v = props.get(QUOTA)
    if not v:
        return 1
    return max(1, min(QUOTA_STEP_MAX, math.floor(1 / float(v) + 0.5)))


def keeps_deletes(props: Mapping[str, str]) -> bool:
    """Whether a put that a dropped delete marker may have hidden is refused (the default), or
    accepted as Accumulo does (``table.delete.semantics=accumulo``)."""
    return props.get(DELETE_SEMANTICS, "kompaktor") != "accumulo"
