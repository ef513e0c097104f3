"""Size grammars of docs/planner.md §7: Accumulo-style sizes and Kubernetes quantities."""

from __future__ import annotations

import pytest

from kompaktor.policy.sizes import format_quantity, parse_accumulo_size, parse_quantity_bytes

KI, MI, GI, TI = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (1, 1),
        (104857600, 104857600),
        ("0", 0),
        ("1048576", 1048576),
        ("7B", 7),
        ("7b", 7),
        ("1K", KI),
        ("1k", KI),
        ("32M", 32 * MI),
        ("32m", 32 * MI),
        ("32Mi", 32 * MI),
        ("32mi", 32 * MI),
        ("2G", 2 * GI),
        ("2g", 2 * GI),
        ("2Gi", 2 * GI),
        ("3Ki", 3 * KI),
        ("1Ti", TI),
        ("100M", 104857600),
        ("500M", 524288000),
        (" 32M ", 32 * MI),
        ("007K", 7 * KI),
        ("99999999999999999999G", 99999999999999999999 * GI),
    ],
)
def test_accumulo_size_accepts(value: int | str, expected: int) -> None:
    assert parse_accumulo_size(value) == expected


def test_accumulo_size_leaves_range_checks_to_callers() -> None:
    assert parse_accumulo_size(-5) == -5


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "M",
        "1.5M",
        "-1M",
        "+1M",
        "-5",
        "1T",  # Accumulo has no T; only Ti
        "1KB",
        "1kib",
        "1Mb ",
        "1 M",
        "1e6",
        "32MiB",
        "1P",
        "1Pi",
        "0x10",
        "1_000",
        "\uff11\uff12",  # non-ASCII (fullwidth) digits
        True,
        False,
        1.5,
        None,
        [1],
    ],
)
def test_accumulo_size_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_accumulo_size(value)  # type: ignore[arg-type]


def test_accumulo_size_error_is_clear() -> None:
    with pytest.raises(ValueError, match=r"invalid size '1\.5M'.*K, M, G"):
        parse_accumulo_size("1.5M")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (123, 123),
        ("123", 123),
        ("32M", 32_000_000),
        ("32Mi", 32 * MI),
        ("1k", 1000),
        ("1Ki", KI),
        ("2G", 2_000_000_000),
        ("2Gi", 2 * GI),
        ("1T", 10**12),
        ("1Ti", TI),
        ("1.5k", 1500),
        ("1.5Ki", 1536),
        ("0.5", 1),  # a fraction rounds up to a whole byte
        ("100m", 1),
        ("1001m", 2),
        ("1000m", 1),
        ("1e3", 1000),
        ("1E3", 1000),
        ("0.1Ki", 103),  # 102.4 -> 103
    ],
)
def test_quantity_bytes_accepts(value: int | str, expected: int) -> None:
    assert parse_quantity_bytes(value) == expected


@pytest.mark.parametrize("value", ["", "abc", "1.5.5", "1Q", "32 MB", "1MiB", "Mi", True, None, 1.5, [], "nan", "inf"])
def test_quantity_bytes_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity_bytes(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1, "1"),
        (1536, "1536"),
        (1 << 10, "1Ki"),
        (3 << 20, "3Mi"),
        (1 << 30, "1Gi"),
        (1536 << 20, "1536Mi"),
        (5 << 40, "5Ti"),
        (10**9, "1000000000"),
    ],
)
def test_format_quantity_is_exact_and_reads_back(n: int, text: str) -> None:
    assert format_quantity(n) == text
    assert parse_quantity_bytes(text) == n


@pytest.mark.parametrize("value", [True, 1.5, "1Gi", None])
def test_format_quantity_takes_whole_bytes_only(value: object) -> None:
    with pytest.raises(ValueError):
        format_quantity(value)  # type: ignore[arg-type]
