"""The one redaction rule for connection URLs (kompaktor.model.redact)."""

from __future__ import annotations

import pytest

from kompaktor.model.redact import redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://***@h:6379/0"),
        ("rediss://user:pw@h:6380/1", "rediss://***@h:6380/1"),
        ("redis://user@h/0", "redis://***@h/0"),
        ("redis://:p@ss/w%40rd@h/0", "redis://***@h/0"),  # an unencoded '@' and '/' in the password
        ("redis://:p@ss@h/0", "redis://***@h/0"),
        ("redis://h/0?password=pw&socket_timeout=1", "redis://h/0?password=***&socket_timeout=1"),
        ("unix:///run/redis.sock?db=0&password=pw", "unix:///run/redis.sock?db=0&password=***"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_finds_every_url_and_leaves_the_rest() -> None:
    text = "Redis at 'redis://:pw1@a:1/0' failed; fallback rediss://u:pw2@b/0, mail me@example.com"
    out = redact_text(text)
    assert "pw1" not in out and "pw2" not in out
    assert out == "Redis at 'redis://***@a:1/0' failed; fallback rediss://***@b/0, mail me@example.com"
