"""A key of this service pasted where a key does not go (``model``, ``user``, ``x-request-id``, a path)
is redacted before anything logs, stores or echoes it: only the Authorization header carries a key.

    redact_keys(text, prefix)   ``text`` with the secret of every key of this form cut out:
                                ``sk-mr-v1-…[redacted]`` (the prefix stays: it says what was pasted)
    holds_key(text, prefix)     whether ``text`` holds one

A key is ``<prefix>-v1-`` and url-safe characters (gateway/auth.py mints them; ``[server] key_prefix``,
``sk-mr`` unless configured). Any run of them after ``<prefix>-v1-`` is taken as a secret, a cut-off one
too, in any case (an upper-cased key is still most of a key). The prefix is the configured one, so a
caller's own ids (``app-v1-<uuid>``) are never taken for keys.
"""

from __future__ import annotations

import functools
import re

DEFAULT_KEY_PREFIX = "sk-mr"
REDACTED = "…[redacted]"


@functools.lru_cache(maxsize=8)
def _form(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"({re.escape(prefix)}-v1-)[A-Za-z0-9_-]+", re.IGNORECASE)


def _may_hold(text: str) -> bool:
    """A cheap first look (every call's model and path pass here): a key's form has ``-v1-`` (any case)."""
    return "-v1-" in text or "-V1-" in text


def redact_keys(text: str, prefix: str) -> str:
    """``text`` with every key of ``prefix``'s form redacted (``text`` itself when it holds none)."""
    return _form(prefix).sub(r"\1" + REDACTED, text) if _may_hold(text) else text


def holds_key(text: str, prefix: str) -> bool:
    return _may_hold(text) and _form(prefix).search(text) is not None
