"""How data files are named: the one definition of file names and temporary names. Pure.

A table's files live under ``tables/<table id>/`` as ``<prefix><sequence>-<nonce>.parquet``; the
prefix tells where a file came from, as Accumulo's do: ``F`` flush (ingest), ``I`` bulk import,
``C`` partial compaction, ``A`` full compaction. The sequence is global and grows, so sorting by
the name after the prefix orders a tablet's files oldest first. The nonce (16 hex digits: random,
or a compaction's ECID) makes a name unique even when the sequence is handed out twice, which
happens when Redis loses its last writes (a crash under ``appendfsync everysec``, a failover to a
replica that had not received them): the counter then goes back, the nonce does not.

A file being written has a temporary name in the same directory, ``_tmp_<tag>_<name>``, where the
tag is the ECID of the compaction writing it (or a random id): dead-compaction cleanup and the
garbage collector find a dead compaction's leftovers by that tag.
"""

from __future__ import annotations

import posixpath
import re
import uuid

PREFIXES = {"flush": "F", "import": "I", "partial": "C", "full": "A"}
TMP_PREFIX = "_tmp_"
TABLES_DIR = "tables"


NONCE_HEX = 16


def new_nonce() -> str:
    """A random name component: 64 bits, so that two names never meet by chance."""
    return uuid.uuid4().hex[:NONCE_HEX]


def _check_nonce(nonce: str) -> str:
    if len(nonce) != NONCE_HEX or any(c not in "0123456789abcdef" for c in nonce):
        raise ValueError(f"a file name nonce is {NONCE_HEX} lowercase hex digits, got {nonce!r}")
    return nonce


def data_file(table_id: str, origin: str, seq: int, nonce: str | None = None) -> str:
    """The relative path of a new file of ``table_id``; origin is flush, import, partial or full.
    Unique even if ``seq`` was handed out before: ``nonce`` (default: random) is part of it."""
    return f"{TABLES_DIR}/{table_id}/{PREFIXES[origin]}{seq:010x}-{_check_nonce(nonce or new_nonce())}.parquet"


def ecid_nonce(ecid: str) -> str:
    """The name component derived from a compaction's ECID (``ECID-<16 hex digits>``)."""
    return _check_nonce(ecid.rsplit("-", 1)[-1])


def output_template(table_id: str, nonce: str) -> dict[str, str]:
    """How the reserve mutation names a compaction's output (mutate.lua fills in the prefix and a
    new file sequence number, printf style): the same shape as :func:`data_file`, with ``nonce``
    (the ECID's, :func:`ecid_nonce`) so the name is unique even if the counter went back."""
    return {
        "template": f"{TABLES_DIR}/{table_id}/%s%010x-{_check_nonce(nonce)}.parquet",
        "full": PREFIXES["full"],
        "partial": PREFIXES["partial"],
    }


def file_order_key(path: str) -> str:
    """Sort key putting a tablet's files oldest first (the sequence after the prefix letter)."""
    return posixpath.basename(path)[1:]


def tmp_name(path: str, tag: str | None = None) -> str:
    """The temporary name under which ``path`` is written by the writer tagged ``tag``."""
    d, name = posixpath.split(path)
    return posixpath.join(d, f"{TMP_PREFIX}{tag or uuid.uuid4().hex}_{name}")


def tmp_tag(path: str) -> str | None:
    """The tag (ECID) of a temporary file's writer, or None for a file that is not temporary."""
    name = posixpath.basename(path)
    if not name.startswith(TMP_PREFIX):
        return None
    return name[len(TMP_PREFIX) :].split("_", 1)[0]


def part_names(output: str, tag: str, index: int) -> tuple[str, str]:
    """(finished, in-progress) names of part ``index`` of a merge split into parts; temporary
    names of ``output``'s writer, so cleanup of the tag removes them too."""
    base = tmp_name(f"{output}.part-{index:05d}.arrow", tag)
    return base, base + ".w"


#: the tag of a resumable merge's finished parts: ``RES-`` and the job fingerprint's first 32 hex
#: digits (:mod:`kompaktor.model.resume`). Parts outlive the attempt (the ECID) that wrote them;
#: the garbage collector keeps them while the job's progress record is live.
RESUME_TAG_PREFIX = "RES-"


def resume_tag(fingerprint: str) -> str:
    return f"{RESUME_TAG_PREFIX}{fingerprint[:32]}"


def resume_part_name(output: str, fingerprint: str, attempt: str, index: int) -> str:
    """The finished name of part ``index`` of a resumable merge, beside ``output``: a temporary
    name tagged with the job's :func:`resume_tag` (not the ECID), unique per ``attempt`` (the
    ECID's tag) so that two attempts never write the same name."""
    d = posixpath.dirname(output)
    return posixpath.join(d, f"{TMP_PREFIX}{resume_tag(fingerprint)}_{attempt}.p{index:05d}.parquet")


def resume_fingerprint_prefix(tag: str | None) -> str | None:
    """The fingerprint prefix in a resume tag, or None for any other tag."""
    if tag is None or not tag.startswith(RESUME_TAG_PREFIX):
        return None
    return tag[len(RESUME_TAG_PREFIX) :]


TABLE_NAME_MAX = 128
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.\-]+", re.ASCII)


def check_table_name(name: str) -> None:
    """A table name is exactly what the error below says: 1 to 128 ASCII letters, digits, '-', '_'
    or '.', but not '.' or '..' (names end up in paths, keys and Kubernetes resources)."""
    if (
        not isinstance(name, str)
        or not _TABLE_NAME.fullmatch(name)
        or name in (".", "..")
        or len(name) > TABLE_NAME_MAX
    ):
        raise ValueError(
            f"invalid table name {name!r}: use 1 to {TABLE_NAME_MAX} ASCII letters, digits, "
            "'-', '_' or '.', not '.' or '..'"
        )
