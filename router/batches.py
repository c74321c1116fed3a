"""``/v1/batches``: the OpenAI Batch API. A batch runs the requests of an uploaded JSONL file through
the gateway's own router path in the background (jobs/), billed as job calls (``source=job``).

    POST /v1/batches               {input_file_id, endpoint, completion_window: "24h", metadata}
    GET  /v1/batches               the group's batches, newest first (``after``, ``limit``)
    GET  /v1/batches/{id}
    POST /v1/batches/{id}/cancel

Status: validating → in_progress → finalizing → completed, or failed (validation), expired (24 h),
cancelling → cancelled. When a batch ends every request is in exactly one of its two files, so
``request_counts.completed + failed == total``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from core.errors import GatewayError, InvalidRequest, NotFound
from core.inputs import decode_json
from gateway.state import Gateway
from jobs.store import BatchRow, new_batch_id
from jobs.validate import ENDPOINTS
from router.chat import read_json_body
from router.files import Files, int_param, job_caller, list_page
from router.replies import JSONBytes

_encode = msgspec.json.Encoder().encode
WINDOW_SECONDS = {"24h": 24 * 3600}


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "batch_not_cancellable"


class CreateBatch(msgspec.Struct):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None


class BatchErrors(msgspec.Struct, omit_defaults=False):
    data: list[dict[str, Any]]
    object: str = "list"


class RequestCounts(msgspec.Struct, omit_defaults=False):
    total: int
    completed: int
    failed: int


class InputDetails(msgspec.Struct, omit_defaults=False):
    cached_tokens: int


class OutputDetails(msgspec.Struct, omit_defaults=False):
    reasoning_tokens: int


class BatchUsage(msgspec.Struct, omit_defaults=False):
    input_tokens: int
    input_tokens_details: InputDetails
    output_tokens: int
    output_tokens_details: OutputDetails
    total_tokens: int


class BatchObject(msgspec.Struct, kw_only=True, omit_defaults=False):
    id: str
    object: str = "batch"
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    usage: BatchUsage
    metadata: dict[str, str] | None


def batch_object(b: BatchRow) -> BatchObject:
    usage = BatchUsage(
        b.input_tokens,
        InputDetails(b.cached_tokens),
        b.output_tokens,
        OutputDetails(b.reasoning_tokens),
        b.input_tokens + b.output_tokens,
    )
    return BatchObject(
        id=b.id,
        endpoint=b.endpoint,
        errors=BatchErrors(b.errors) if b.errors else None,
        input_file_id=b.input_file_id,
        completion_window=b.completion_window,
        status=b.status,
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        created_at=b.created_at,
        in_progress_at=b.in_progress_at,
        expires_at=b.expires_at,
        finalizing_at=b.finalizing_at,
        completed_at=b.completed_at,
        failed_at=b.failed_at,
        expired_at=b.expired_at,
        cancelling_at=b.cancelling_at,
        cancelled_at=b.cancelled_at,
        request_counts=RequestCounts(b.total, b.completed, b.failed),
        usage=usage,
        metadata=b.metadata,
    )


def parse_create(raw: bytes) -> CreateBatch:
    data = decode_json(raw)
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    try:
        body = msgspec.convert(data, CreateBatch)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = text.rpartition("`$.")[2].rstrip("`").split(".")[0] if "`$." in text else None
        if text.startswith("Object missing required field"):
            param = text.split("`")[1]
            raise InvalidRequest(
                f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
            ) from None
        raise InvalidRequest(f"Invalid request: {text}.", param=param, code="invalid_value") from None
    if body.endpoint not in ENDPOINTS:
        raise InvalidRequest(
            f"Unsupported endpoint {body.endpoint!r}: this gateway runs batches of {', '.join(ENDPOINTS)}.",
            param="endpoint",
            code="invalid_value",
        )
    if body.completion_window not in WINDOW_SECONDS:
        raise InvalidRequest(
            "'completion_window' must be '24h'.", param="completion_window", code="invalid_value"
        )
    meta = body.metadata or {}
    if len(meta) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in meta.items()):
        raise InvalidRequest(
            "'metadata' holds at most 16 pairs, keys up to 64 and values up to 512 characters.",
            param="metadata",
            code="invalid_value",
        )
    return body


class Batches:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def create(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        body = parse_create(
            await read_json_body(
                request, 64 * 1024, self.gw.settings.reliability.body_timeout, self.gw.deadlines
            )
        )
        source = await runner.store.get_file(principal.group_id, body.input_file_id)
        if source is None:
            raise NotFound(
                f"No such File object: {body.input_file_id}", param="input_file_id", code="file_not_found"
            )
        if source.purpose != "batch":
            raise InvalidRequest(
                f"The file {source.id} has purpose {source.purpose!r}; a batch's input file is "
                "uploaded with purpose 'batch'.",
                param="input_file_id",
                code="invalid_value",
            )
        now = int(time.time())
        row = BatchRow(
            new_batch_id(),
            principal.group_id,
            principal.key_id,
            body.endpoint,
            source.id,
            body.completion_window,
            "validating",
            now,
            now + WINDOW_SECONDS[body.completion_window],
            metadata=body.metadata,
        )
        await runner.store.create_batch(row)
        runner.poke()
        return JSONBytes(_encode(batch_object(row)))

    async def list(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        limit = int_param(request, "limit", 20, 1, 100)
        rows = await runner.store.list_batches(
            principal.group_id, request.query_params.get("after"), limit + 1
        )
        data = [batch_object(r) for r in rows[:limit]]
        return JSONBytes(_encode(list_page(data, len(rows) > limit)))

    async def retrieve(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        batch_id = request.path_params["batch_id"]
        row = await runner.store.get_batch(principal.group_id, batch_id)
        if row is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id", code="batch_not_found")
        return JSONBytes(_encode(batch_object(row)))

    async def cancel(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        batch_id = request.path_params["batch_id"]
        row = await runner.store.cancel_batch(principal.group_id, batch_id, int(time.time()))
        if row is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id", code="batch_not_found")
        if row.status not in ("cancelling", "cancelled"):
            raise Conflict(f"The batch {batch_id} is {row.status} and can no longer be cancelled.")
        runner.poke()
        return JSONBytes(_encode(batch_object(row)))


def routes(gateway: Gateway) -> list[Route]:
    """The Batch API's routes (``/v1/files`` and ``/v1/batches``)."""
    files, batches = Files(gateway), Batches(gateway)
    return [
        Route("/v1/files", files.create, methods=["POST"]),
        Route("/v1/files", files.list, methods=["GET"]),
        Route("/v1/files/{file_id}", files.retrieve, methods=["GET"]),
        Route("/v1/files/{file_id}", files.delete, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", files.content, methods=["GET"]),
        Route("/v1/batches", batches.create, methods=["POST"]),
        Route("/v1/batches", batches.list, methods=["GET"]),
        Route("/v1/batches/{batch_id}", batches.retrieve, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", batches.cancel, methods=["POST"]),
    ]
