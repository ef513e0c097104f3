"""The one redaction rule for connection URLs (docs/kubernetes.md "Security settings"): whatever
names a credential — the userinfo of a URL (``redis://:PASSWORD@host``,
``rediss://user:PASSWORD@host``) or a secret query parameter (``?password=…``) — is replaced by
``***`` before it reaches an error message, a log line, a status field or a metric label. Pure: no I/O.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://USERINFO@ — greedy up to the last '@' before a space, quote, '?' or '#': a password
# may hold an unencoded '@' or '/' (redacting too much is the safe side)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s?#'\"]*@")
# ?password=… &token=… (redis-py reads ?password= too)
_SECRET_PARAM = re.compile(r"(?i)([?&;](?:sentinel_password|password|passwd|pass|pwd|token|secret|auth)=)[^&;#\s'\"]*")


def redact_url(url: str) -> str:
    """``url`` with its userinfo and secret query parameters replaced by ``***``:
    ``redis://:pw@h:6379/0`` → ``redis://***@h:6379/0``. A URL without credentials is unchanged."""
    return redact_text(url)


def redact_text(text: str) -> str:
    """Every URL inside ``text`` redacted as :func:`redact_url` does (for messages that may quote
    a URL: exception texts, log lines)."""
    return _SECRET_PARAM.sub(rf"\1{MASK}", _USERINFO.sub(rf"\1{MASK}@", text))
