"""``CallContext``: who makes one model call and how, fixed before it runs.

The HTTP layer builds it from the authenticated request (``source="api"``); the batch runner builds it
for each line (``source="job"``, the batch's id) and hands it to the gateway's own app in the ASGI
scope's state, under :data:`CONTEXT`, where no HTTP request can put anything. The pipeline reads the
caller, the endpoint and the ids from it, and the usage record is written from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from billing.store import Principal
from core.types import Endpoint, Source

CONTEXT = "call"  # the scope["state"] key of an in-process call's context (jobs/calls.py)


@dataclass(slots=True)
class CallContext:
    principal: Principal  # the caller: its key and group
    request_id: str | None = None  # our x-request-id of the call
    source: Source = "api"
    endpoint: Endpoint = "chat"
    batch_id: str | None = None  # the batch a job line belongs to (usage records have no column for it yet)

    @property
    def group_id(self) -> int:
        return self.principal.group_id

    @property
    def key_id(self) -> int:
        return self.principal.key_id
