"""``/v1/files``: batch input files up (multipart, ``purpose=batch``), output and error files down.

    POST   /v1/files                upload (multipart/form-data: ``file``, ``purpose``)
    GET    /v1/files                list the group's files (``purpose``, ``after``, ``limit``, ``order``)
    GET    /v1/files/{id}           the file object
    GET    /v1/files/{id}/content   the bytes
    DELETE /v1/files/{id}

A key sees only its group's files. Contents live in the jobs store (on disk beside the SQLite database,
or in PostgreSQL); the upload limit is ``[jobs] max_file_bytes``.
"""

from __future__ import annotations

import re
import time
from typing import Generic, Protocol, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from billing.store import Principal
from core.deadlines import Deadlines
from core.errors import InvalidRequest, NotFound, PayloadTooLarge, UnsupportedMediaType
from core.inputs import natural
from core.redact import redact_keys
from gateway.state import Gateway
from jobs.runner import JobRunner
from jobs.store import FileRow, new_file_id
from router.chat import principal_of, read_body
from router.logs import trace_of
from router.replies import JSONBytes

_encode = msgspec.json.Encoder().encode
MULTIPART_SLACK = 64 * 1024  # bytes of multipart framing and form fields allowed beyond the file itself
_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')
MAX_FILENAME = 255  # characters of a stored file name (what one name may have on common file systems)
_NOT_IN_A_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f/\\]")  # control characters and path separators


class FileObject(msgspec.Struct, kw_only=True, omit_defaults=False):
    id: str
    object: str = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class Identified(Protocol):
    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=Identified)


class ListPage(msgspec.Struct, Generic[Item], omit_defaults=False):
    """One page of an OpenAI list (files, batches); ``after=<last_id>`` asks for the next."""

    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: str = "list"


def list_page(data: list[Item], more: bool) -> ListPage[Item]:
    return ListPage(data, data[0].id if data else None, data[-1].id if data else None, more)


class FileDeleted(msgspec.Struct, omit_defaults=False):
    id: str
    deleted: bool
    object: str = "file"


def file_object(row: FileRow) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        filename=row.filename,
        purpose=row.purpose,
        expires_at=row.expires_at,
    )


async def job_caller(gw: Gateway, request: Request) -> tuple[Principal, JobRunner]:
    """The authenticated caller and the jobs runner (whose store the endpoints use)."""
    if not gw.started:
        await gw.start()
    principal = await principal_of(gw, request)
    trace_of(request.scope).caller = principal  # the access log's key and group
    if not isinstance(gw.jobs, JobRunner):
        raise NotFound("The Batch API is not enabled on this gateway.")
    return principal, gw.jobs


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    number = natural(value)
    if number is None or not low <= number <= high:
        raise InvalidRequest(
            f"'{name}' must be an integer from {low} to {high}.", param=name, code="invalid_value"
        )
    return number


# -- multipart ---------------------------------------------------------------------------------------------
class Part(msgspec.Struct):
    name: str
    filename: str | None
    data: bytes


def _params(header: str) -> dict[str, str]:
    return {k.lower(): v.strip('"') for k, v in _PARAM.findall(header)}


def boundary_of(content_type: str) -> bytes:
    kind = content_type.split(";", 1)[0].strip().lower()
    boundary = _params(content_type).get("boundary", "")
    if kind != "multipart/form-data" or not boundary:
        raise UnsupportedMediaType(
            f"Upload files as multipart/form-data with a boundary (got {content_type or 'none'!r}).",
            code="unsupported_content_type",
        )
    return boundary.encode("latin-1")


def parse_multipart(body: bytes, boundary: bytes) -> dict[str, Part]:
    """The parts of a multipart/form-data body, by field name (RFC 7578)."""
    delimiter = b"\r\n--" + boundary
    data = b"\r\n" + body
    parts: dict[str, Part] = {}
    pos = data.find(delimiter)
    if pos < 0:
        raise InvalidRequest(
            "The multipart body has no part with the announced boundary.", code="invalid_multipart"
        )
    while True:
        pos += len(delimiter)
        if data[pos : pos + 2] == b"--":
            return parts  # the closing delimiter
        head_end = data.find(b"\r\n\r\n", pos)
        end = data.find(delimiter, pos)
        if head_end < 0 or end < 0 or head_end > end:
            raise InvalidRequest("The multipart body is cut short or malformed.", code="invalid_multipart")
        disposition = ""
        for line in data[pos:head_end].decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                disposition = value
        params = _params(disposition)
        if "name" in params:
            filename = params.get("filename")
            if filename is None and "filename*" in params:
                filename = params["filename*"].rpartition("'")[2]
            parts[params["name"]] = Part(params["name"], filename, data[head_end + 4 : end])
        pos = end


def file_name(given: str, key_prefix: str) -> str:
    """The name an upload is stored and listed under: as the client sent it (the OpenAI SDKs send the
    file's own name, without its directory), or ``upload.jsonl`` for none; a key of the gateway's in it
    redacted (core/redact.py). A name too long, with a control character or a path separator, or ``.``
    or ``..``, is a 400 naming ``file``: refused, not altered, so a listing shows what was sent."""
    if len(given) > MAX_FILENAME or _NOT_IN_A_NAME.search(given) or given in (".", ".."):
        raise InvalidRequest(
            f"The file's name must be at most {MAX_FILENAME} characters, without control characters "
            "or path separators ('/', '\\').",
            param="file",
            code="invalid_file_name",
        )
    return redact_keys(given, key_prefix) or "upload.jsonl"


async def read_upload(request: Request, limit: int, seconds: float, deadlines: Deadlines) -> bytes:
    too_large = (
        f"The file is larger than the limit of {limit - MULTIPART_SLACK} bytes ([jobs] max_file_bytes)."
    )
    return await read_body(
        request, limit, seconds, deadlines, too_large=too_large, code="file_too_large", what="upload"
    )


# -- endpoints -----------------------------------------------------------------------------------------------
class Files:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def create(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        boundary = boundary_of(request.headers.get("content-type", ""))
        limit = self.gw.settings.jobs.max_file_bytes
        timeout = max(self.gw.settings.reliability.body_timeout, 300.0)
        parts = parse_multipart(
            await read_upload(request, limit + MULTIPART_SLACK, timeout, self.gw.deadlines), boundary
        )
        purpose = parts.get("purpose")
        if purpose is None:
            raise InvalidRequest(
                "Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter"
            )
        if purpose.data.decode("utf-8", "replace").strip() != "batch":
            raise InvalidRequest(
                "This gateway stores files for the Batch API only: 'purpose' must be 'batch'.",
                param="purpose",
                code="invalid_value",
            )
        upload = parts.get("file")
        if upload is None or upload.filename is None:
            raise InvalidRequest(
                "Missing required parameter: 'file' (a file part).",
                param="file",
                code="missing_required_parameter",
            )
        if len(upload.data) > limit:
            raise PayloadTooLarge(
                f"The file is larger than the limit of {limit} bytes ([jobs] max_file_bytes).",
                param="file",
                code="file_too_large",
            )
        if not upload.data.strip():
            raise InvalidRequest(
                "The file is empty: a batch input file is a JSONL of requests.",
                param="file",
                code="invalid_file",
            )
        name = file_name(upload.filename, self.gw.settings.server.key_prefix)
        row = FileRow(
            new_file_id(),
            principal.group_id,
            principal.key_id,
            "batch",
            name,
            len(upload.data),
            int(time.time()),
        )
        await runner.store.create_file(row, upload.data)
        return JSONBytes(_encode(file_object(row)))

    async def list(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        limit = int_param(request, "limit", 10_000, 1, 10_000)
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order", code="invalid_value")
        rows = await runner.store.list_files(
            principal.group_id,
            request.query_params.get("purpose"),
            request.query_params.get("after"),
            limit + 1,
            order == "asc",
        )
        data = [file_object(r) for r in rows[:limit]]
        return JSONBytes(_encode(list_page(data, len(rows) > limit)))

    async def retrieve(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        return JSONBytes(_encode(file_object(await self._file(runner, principal, request))))

    async def content(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        row = await self._file(runner, principal, request)
        data = await runner.store.file_content(principal.group_id, row.id)
        if data is None:
            raise NotFound(f"No such File object: {row.id}", param="file_id", code="file_not_found")
        return Response(data, media_type="application/jsonl")

    async def delete(self, request: Request) -> Response:
        principal, runner = await job_caller(self.gw, request)
        file_id = request.path_params["file_id"]
        if not await runner.store.delete_file(principal.group_id, file_id):
            raise NotFound(f"No such File object: {file_id}", param="file_id", code="file_not_found")
        return JSONBytes(_encode(FileDeleted(file_id, True)))

    @staticmethod
    async def _file(runner: JobRunner, principal: Principal, request: Request) -> FileRow:
        file_id = request.path_params["file_id"]
        row = await runner.store.get_file(principal.group_id, file_id)
        if row is None:
            raise NotFound(f"No such File object: {file_id}", param="file_id", code="file_not_found")
        return row
