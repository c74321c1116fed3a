"""Errors the gateway returns, always in the OpenAI shape so the OpenAI SDK raises its matching class.

Body: ``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``.

    GatewayError                       (base; never raised itself)
     ├── InvalidRequest        400  invalid_request_error   bad JSON, wrong types, missing fields,
     │                                                      a capability the model lacks
     ├── Unauthorized          401  invalid_request_error   missing / malformed / unknown / revoked key
     ├── InsufficientCredits   402  insufficient_credits    the group cannot afford the worst case
     ├── PermissionDenied      403  permission_error        model not allowed for this key
     ├── NotFound              404  invalid_request_error   unknown model (code model_not_found) or path
     ├── MethodNotAllowed      405  invalid_request_error
     ├── RequestTimeout        408  invalid_request_error   the request body arrived too slowly
     ├── PayloadTooLarge       413  invalid_request_error   request body over the limit
     ├── UnsupportedMediaType  415  invalid_request_error   body is not application/json
     ├── RateLimited           429  rate_limit_error        carries Retry-After
     ├── UpstreamTooLarge      429  tokens                  the call alone is over the provider account's
     │                                                      tokens per minute: no wait cures it (no
     │                                                      Retry-After, x-should-retry: false)
     ├── StoreUnavailable      503  server_error            the store cannot reserve now (store_unavailable,
     │                                                      carries Retry-After; billing/ledger.py)
     └── UpstreamError         502  upstream_error          the provider failed or answered garbage
          ├── UpstreamUnavailable   503                     no healthy upstream / provider overloaded
          ├── UpstreamTimeout       504                     the provider did not answer in time
          └── UpstreamFinal         502                     another try at the same upstream would fail too:
               ├── UpstreamAuthFailed     upstream_auth_failed      the gateway's own credentials were refused
               ├── UpstreamNotFound       upstream_not_found        the deployment has no such model or endpoint (404)
               ├── UpstreamQuotaExceeded  upstream_quota_exceeded   the gateway's account there is out of credit
               └── UpstreamStreamError (adapters.base)              the provider failed mid-stream

Retries (gateway/reliability.py) follow the classes: rate limits and upstream failures are retried,
``UpstreamFinal`` and ``UpstreamTooLarge`` ones are not (another deployment or a fallback model may
still serve any of them but a caller's own 4xx).

An error that no wait cures (``final``: the class's, or ``final=True`` on one ``RateLimited``: a
call over a ceiling it can never fit) says ``x-should-retry: false``, which the OpenAI SDKs obey
before their own rule (they retry a 429 and a 5xx twice by default).

After a stream has started, an error goes out as one SSE event ``data: {"error": ...}`` instead.

On Anthropic's Messages API (``/v1/messages``) the same errors speak Anthropic's dialect
(:func:`anthropic_error`): ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's types,
the gateway's unavailable upstream as 529 ``overloaded_error`` (what its clients retry), and in a
stream one ``event: error``.
"""

from __future__ import annotations

import msgspec


class ErrorBody(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


_encode = msgspec.json.Encoder().encode


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None
    final: bool = False  # no wait cures it: the clients are told not to retry (x-should-retry: false)

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        final: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}
        if final is not None:
            self.final = final
        if self.final:
            self.headers["x-should-retry"] = "false"

    def body(self) -> ErrorEnvelope:
        return ErrorEnvelope(ErrorBody(self.message, self.type, self.param, self.code))

    def render(self) -> bytes:
        return _encode(self.body())


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"  # when no more precise code is given: a 400 never says "code": null


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"
    final = True  # a key no wait mends (Claude Code retries a 401 ten times over three minutes otherwise)


class InsufficientCredits(GatewayError):
    status = 402
    type = "insufficient_credits"
    code = "insufficient_credits"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    input_tpm: int | None = None  # the provider's limit of input tokens a minute that its message named


class UpstreamTooLarge(GatewayError):
    """OpenAI's "Request too large" (a 429 of type ``tokens``): the call's input and ``max_tokens``
    together are over what the gateway's account there may use in a minute. Another deployment (a
    larger account) or a fallback model may serve it; this one never will, so it is neither retried
    nor a reason to rest the deployment or count against its circuit: other callers' calls fit."""

    status = 429
    type = "tokens"
    code = "rate_limit_exceeded"
    final = True


class StoreUnavailable(GatewayError):
    """The store cannot take a reservation (or find the key) now: unreachable, its connection lost, locked
    past its busy timeout. Nothing was reserved and nothing was sent upstream; the caller may retry."""

    status = 503
    type = "server_error"
    code = "store_unavailable"

    def __init__(
        self,
        message: str = "The gateway's store cannot be reached right now; nothing was charged and "
        "nothing was sent upstream. Retry shortly.",
        *,
        retry_after: int = 2,
    ) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    status = 503
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamFinal(UpstreamError):
    """An upstream failure that trying the same upstream again would not mend."""


class UpstreamAuthFailed(UpstreamFinal):
    code = "upstream_auth_failed"
    final = True  # until the operator fixes the gateway's credentials


class UpstreamNotFound(UpstreamFinal):
    """The deployment answered 404: it does not have the model, or not the endpoint. The gateway's
    configuration, not the caller's request: another deployment may serve the call (gateway/reliability.py)."""

    code = "upstream_not_found"
    final = True  # until the operator mends the deployment


class UpstreamQuotaExceeded(UpstreamFinal):
    code = "upstream_quota_exceeded"
    final = True  # until the operator tops the account up


# Anthropic's error types by HTTP status (its API reference, "Errors"); what has no status of its own there
# keeps ours with the nearest type
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class AnthropicBody(msgspec.Struct):
    type: str
    message: str


class AnthropicEnvelope(msgspec.Struct):
    error: AnthropicBody
    type: str = "error"


def anthropic_status(exc: GatewayError) -> tuple[int, str]:
    """The status and Anthropic error type of ``exc``: an upstream that is unavailable or overloaded is
    529 ``overloaded_error`` (Anthropic's SDKs and Claude Code retry it)."""
    status = 529 if isinstance(exc, UpstreamUnavailable) else exc.status
    return status, ANTHROPIC_TYPES.get(status, "api_error")


def anthropic_error(exc: GatewayError) -> tuple[int, bytes]:
    """``exc`` in Anthropic's dialect: (status, body). A prompt over the model's context window (any
    provider's) says "Prompt is too long", the words by which Claude Code compacts its conversation; a
    group out of credits says "Your credit balance is too low" (Claude Code: "Credit balance is too low")."""
    status, kind = anthropic_status(exc)
    message = exc.message
    if exc.code == "context_length_exceeded" and not message.startswith("Prompt is too long"):
        message = f"Prompt is too long: {message}"
    elif exc.code == "insufficient_credits":  # the words by which Claude Code tells its user what it is
        message = f"Your credit balance is too low. {message}"
    return status, _encode(AnthropicEnvelope(AnthropicBody(kind, message)))
