"""Size grammars for configuration values (docs/planner.md §7).

Two grammars, one function each:

- :func:`parse_accumulo_size` for Accumulo-style settings (planner options such as a group's
  ``maxSize``, table properties, ``kompaktor plan`` input): integer bytes, or digits with an
  optional ``K``/``M``/``G`` (binary, any case) or ``B`` suffix; ``Ki``/``Mi``/``Gi``/``Ti`` are
  also accepted. ``"32M"`` is 33,554,432 bytes.
- :func:`parse_quantity_bytes` for Kubernetes resources: integer bytes or any Kubernetes quantity
  (``Ki``/``Mi``/``Gi``/``Ti`` binary, ``k``/``M``/``G``/``T`` decimal); a fraction rounds up to a
  whole byte. ``"32M"`` is 32,000,000 bytes.

:func:`format_quantity` writes whole bytes back as the shortest exact binary quantity (``"1Gi"``).

Both parsers raise :class:`ValueError` on anything they cannot parse. Neither checks ranges (a value of 0
or a negative integer is returned as is): callers know whether 0 is allowed.

Pure: imports nothing from Kompaktor; ``kubernetes`` is imported only by the quantity parser.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

__all__ = ["format_quantity", "parse_accumulo_size", "parse_quantity_bytes"]

#: Accumulo suffix (lower-cased) -> multiplier. "" and "b" mean bytes.
_ACCUMULO_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}

_ACCUMULO_RE = re.compile(r"([0-9]+)([A-Za-z]{0,2})")


def parse_accumulo_size(value: int | str) -> int:
    """Bytes for an Accumulo-style size: ``1048576``, ``"1048576"``, ``"1M"``, ``"1m"``, ``"1Mi"``, ``"7B"``.

    Suffixes are binary and case-insensitive: K/M/G (and Ki/Mi/Gi/Ti) are 2**10, 2**20, 2**30
    (2**40); B means bytes. Signs, fractions, spaces inside the value and other suffixes are
    rejected with :class:`ValueError`. An ``int`` is returned unchanged (booleans are rejected).
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"size must be an integer or a string, got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        return value
    match = _ACCUMULO_RE.fullmatch(value.strip())
    if match is None or match.group(2).lower() not in _ACCUMULO_UNITS:
        raise ValueError(
            f"invalid size {value!r}: expected integer bytes, or digits with a K, M, G (binary, "
            "any case), B, Ki, Mi, Gi or Ti suffix, e.g. '32M'"
        )
    digits, unit = match.groups()
    return int(digits) * _ACCUMULO_UNITS[unit.lower()]


def parse_quantity_bytes(value: int | str) -> int:
    """Bytes for a Kubernetes quantity: ``"32M"`` is 32,000,000, ``"32Mi"`` 33,554,432, ``"1.5k"`` 1,500.

    Parsed with ``kubernetes.utils.parse_quantity``; a fractional result rounds up to the next
    whole byte (``"100m"`` is 1). An ``int`` is returned unchanged (booleans are rejected).
    Raises :class:`ValueError` on anything that is not a quantity.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"quantity must be an integer or a string, got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        return value
    from kubernetes.utils import parse_quantity  # imported here: kubernetes is slow to import

    try:
        quantity = parse_quantity(value.strip())
    except (ValueError, TypeError, InvalidOperation) as exc:
        raise ValueError(f"invalid quantity {value!r}: {exc}") from None
    if not isinstance(quantity, Decimal) or not quantity.is_finite():
        raise ValueError(f"invalid quantity {value!r}: not a finite number")
    try:
        return int(quantity.to_integral_value(rounding=ROUND_CEILING))
    except (ValueError, InvalidOperation, OverflowError) as exc:
        raise ValueError(f"invalid quantity {value!r}: {exc}") from None


def parse_quantity_decimal(value: int | str) -> Decimal:
    """The exact value of a Kubernetes quantity (``"250m"`` is 0.25): for comparing CPU amounts.
    Raises :class:`ValueError` on anything that is not a finite quantity."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"quantity must be an integer or a string, got {type(value).__name__} {value!r}")
    from kubernetes.utils import parse_quantity

    try:
        quantity = parse_quantity(str(value).strip())
    except (ValueError, TypeError, InvalidOperation) as exc:
        raise ValueError(f"invalid quantity {value!r}: {exc}") from None
    if not isinstance(quantity, Decimal) or not quantity.is_finite():
        raise ValueError(f"invalid quantity {value!r}: not a finite number")
    return quantity


_BINARY_SUFFIXES = (
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
)


def format_quantity(n: int) -> str:
    """Whole bytes as a Kubernetes quantity, exactly: ``1073741824`` is ``"1Gi"``, ``1536`` is
    ``"1536"`` rather than a rounded ``"1.5Ki"``; :func:`parse_quantity_bytes` reads it back."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"bytes must be an integer, got {type(n).__name__} {n!r}")
    for suffix, size in _BINARY_SUFFIXES:
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)
