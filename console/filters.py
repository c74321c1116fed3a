"""The calls page's query string: what to show (source, period, model, key, status, provider, endpoint,
stream, request id, end user, deployment, batch), how many rows, which page. Everything is in the URL,
so a view can be shared or bookmarked; a bad value is reported beside the filters and ignored.

The model filter takes what people type: a model id, an alias or a snapshot id (resolved through the
catalog to the model it names), or the start of ids (``claude``, ``anthropic/``, ``gpt-4o``) matched
against the models the group has called, and reports when nothing matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from billing.usage_filter import Filter
from console import periods
from console.forms import PAGE_SIZES, SOURCES, Invalid, cursor
from core.catalog import Catalog
from core.deployments import is_name
from core.errors import GatewayError
from core.inputs import natural

STATUSES = ("ok", "error", "interrupted", "rejected")
STREAMS = {"": None, "yes": True, "no": False}
TEXT_LIMIT = 256
# the filters shown as removable chips: (field, label)
CHIPS = (
    ("model", "model"),
    ("key", "key"),
    ("status", "status"),
    ("provider", "provider"),
    ("endpoint", "endpoint"),
    ("stream", "stream"),
    ("request", "request id"),
    ("user", "user"),
    ("deployment", "deployment"),
    ("batch", "batch"),
)


def query_string(values: dict[str, Any], changes: dict[str, Any]) -> str:
    """``values`` with ``changes`` as a query string (None or "" drops a parameter); a period preset
    in ``changes`` drops the dates."""
    merged = {**values, **changes}
    if changes.get("period") is not None:
        merged["from"] = merged["to"] = None
    return urlencode({k: v for k, v in merged.items() if v not in (None, "")})


@dataclass(frozen=True, slots=True)
class Link:
    """A page's query string, to make links that change part of it (the period picker's)."""

    values: dict[str, Any]

    def params(self) -> dict[str, Any]:
        return self.values

    def query(self, **changes: Any) -> str:
        return query_string(self.values, changes)


def period_params(p: periods.Period) -> dict[str, Any]:
    return {"period": p.key if p.key not in ("custom", "7d") else None, "from": p.start, "to": p.end}


@dataclass(frozen=True, slots=True)
class CallsQuery:
    source: str = "all"
    period: periods.Period = field(default_factory=lambda: periods.Period("7d", None, None))
    model: str = ""
    key: int | None = None
    status: str = ""
    provider: str = ""
    endpoint: str = ""
    stream: str = ""
    request: str = ""
    user: str = ""
    deployment: str = ""
    batch: str = ""
    limit: int = 50
    before: int | None = None
    after: int | None = None
    page: int | None = None

    def filter(self, group_id: int | None, models: tuple[str, ...] | None = None) -> Filter:
        """The records this query is about (``models``: what the model filter resolved to)."""
        return Filter(
            group_id,
            source=SOURCES[self.source],
            key_id=self.key,
            since=self.period.since,
            until=self.period.until,
            models=models if self.model else None,
            status=self.status or None,
            provider=self.provider or None,
            endpoint=self.endpoint or None,
            stream=STREAMS[self.stream],
            request_id=self.request or None,
            end_user=self.user or None,
            deployment=self.deployment or None,
            batch_id=self.batch or None,
        )

    def params(self) -> dict[str, Any]:
        return {
            "source": self.source if self.source != "all" else None,
            **period_params(self.period),
            "model": self.model,
            "key": self.key,
            "status": self.status,
            "provider": self.provider,
            "endpoint": self.endpoint,
            "stream": self.stream,
            "request": self.request,
            "user": self.user,
            "deployment": self.deployment,
            "batch": self.batch,
            "limit": self.limit if self.limit != 50 else None,
        }

    def query(self, **changes: Any) -> str:
        """This query string with some parameters changed (None or "" drops one); the page cursors
        only if given."""
        return query_string(self.params(), changes)

    def kept(self) -> str:
        """The query string of what every link to another page keeps: the Jobs/API toggle and the period."""
        return query_string(
            {"source": self.source if self.source != "all" else None, **period_params(self.period)}, {}
        )

    def chips(self) -> list[tuple[str, str, str]]:
        """The filters in force: (label, value, the query string without it)."""
        out = []
        for name, label in CHIPS:
            value = getattr(self, name)
            if value not in (None, ""):
                out.append((label, str(value), self.query(**{name: None})))
        return out

    @property
    def paging(self) -> bool:
        return self.before is not None or self.after is not None


def text(params: dict[str, str], name: str) -> str:
    return params.get(name, "").strip()[:TEXT_LIMIT]


def parse(
    params: dict[str, str], zone: ZoneInfo, now: float, errors: dict[str, str], default_period: str = "7d"
) -> CallsQuery:
    """The query of a calls page; a bad value is reported in ``errors`` and left out."""

    def take(name: str, parse_it: Any, default: Any) -> Any:
        try:
            return parse_it()
        except Invalid as exc:
            errors[exc.field or name] = exc.message
            return default

    q = CallsQuery(
        period=take(
            "period",
            lambda: periods.choose(params, zone, now, default_period),
            periods.choose({}, zone, now, default_period),
        )
    )
    source = params.get("source", "all") or "all"
    if source not in SOURCES:
        errors["source"] = "The source is all, api or job."
        source = "all"
    status = params.get("status", "")
    if status and status not in STATUSES:
        errors["status"] = f"The status is one of {', '.join(STATUSES)}."
        status = ""
    deployment = text(params, "deployment")
    if deployment and not is_name(deployment):
        errors["deployment"] = "Not a deployment name (letters, digits, '.', '_' or '-')."
        deployment = ""
    stream = params.get("stream", "")
    if stream not in STREAMS:
        errors["stream"] = "Stream is yes or no."
        stream = ""
    size = natural(params.get("limit", "")) or 50
    size = size if size in PAGE_SIZES else 50
    page = natural(params.get("page", "")) or 0
    return replace(
        q,
        source=source,
        model=text(params, "model").lower(),
        key=take("key", lambda: cursor(params.get("key", ""), "key"), None),
        status=status,
        provider=text(params, "provider"),
        endpoint=text(params, "endpoint"),
        stream=stream,
        request=text(params, "request"),
        user=text(params, "user"),
        deployment=deployment,
        batch=text(params, "batch"),
        limit=size,
        before=take("before", lambda: cursor(params.get("before", ""), "before"), None),
        after=take("after", lambda: cursor(params.get("after", ""), "after"), None),
        page=page if 0 < page < 10**9 else None,
    )


def resolve_models(typed: str, catalog: Catalog, used: list[str]) -> tuple[str, ...]:
    """The model ids a typed model filter means: the catalog's model for an id, alias or snapshot,
    plus every model called (``used``) whose id, or name after the provider, starts with it."""
    typed = typed.strip().lower()
    found: list[str] = []
    try:
        found.append(catalog.resolve(typed).id)
    except GatewayError:
        pass
    for model in used:
        name = model.split("/", 1)[-1]
        if model.startswith(typed) or name.startswith(typed):
            found.append(model)
    return tuple(dict.fromkeys(found))
