"""Emulator of Azure OpenAI's chat completions: the OpenAI wire (the ``openai`` flavour's answers and
checks) under Azure's URL shape and auth, with its errors and content-filter annotations
(docs/providers.md, "Azure OpenAI"; the ``openai`` SDK's ``AzureOpenAI`` client proves it in the tests).

    POST /openai/deployments/{deployment}/chat/completions?api-version=...   key in the api-key header
    POST /openai/deployments/{deployment}/embeddings, /images/generations, /images/edits   (the same)

A request without ``api-version`` is a 404 ``Resource not found``, a wrong key a 401, a deployment the
resource does not have a 404 ``DeploymentNotFound``. The answer names the deployment's model, not the
deployment. Every answer carries ``prompt_filter_results`` and each choice ``content_filter_results``;
a stream opens with a frame that has no choices and only the prompt's filter results. ``[filtered]``
in the last user message: the prompt is refused with Azure's 400 ``content_filter``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from emulators.common import DEPLOYED, encode, retry_after
from emulators.embeddings import OpenAIEmbeddings
from emulators.images import OpenAIImages
from emulators.openai import OpenAIEmulator

CATEGORIES = ("hate", "self_harm", "sexual", "violence")
SAFE = {name: {"filtered": False, "severity": "safe"} for name in CATEGORIES}
PROMPT_RESULTS = [
    {
        "prompt_index": 0,
        "content_filter_results": {**SAFE, "jailbreak": {"filtered": False, "detected": False}},
    }
]
DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key "
    "for an active subscription and use a correct regional API endpoint for your resource."
)


class AzureOpenAIEmulator(OpenAIEmulator):
    """``deployments`` maps each deployment of the emulated resource to its model (None: any name is a
    deployment of the model of that name)."""

    def __init__(
        self, api_key: str = "emu-azure-key", deployments: dict[str, str] | None = None, rpm: int = 0
    ) -> None:
        self.deployments = deployments
        super().__init__("openai", api_key, rpm)

    def routes(self) -> None:
        self.app.router.add_post("/openai/deployments/{deployment}/chat/completions", self.deployment_chat)
        embeddings, images = OpenAIEmbeddings(self), OpenAIImages(self)
        for path, handler in (
            ("embeddings", embeddings.handle),
            ("images/generations", images.generations),
            ("images/edits", images.edits),
        ):
            self.app.router.add_post(f"/openai/deployments/{{deployment}}/{path}", self.deployed(handler))

    def deployed(self, handler: Any) -> Any:
        """An OpenAI endpoint under Azure's URL shape and auth: the deployment names the model."""

        async def handle(request: web.Request) -> web.StreamResponse:
            refused = self._refused(request)
            if refused is not None:
                return refused
            return await handler(request)

        return handle

    def _refused(self, request: web.Request) -> web.Response | None:
        """Azure's answer to a request its resource does not take (no api-version, a wrong key, a
        deployment it does not have), else None (and the deployment's model noted on the request)."""
        if not request.query.get("api-version"):
            return self.azure_error(404, "404", "Resource not found")
        if request.headers.get("api-key") != self.api_key:
            return self.azure_error(401, "401", DENIED)
        name = request.match_info["deployment"]
        model = name if self.deployments is None else self.deployments.get(name)
        if model is None:
            return self.azure_error(
                404,
                "DeploymentNotFound",
                "The API deployment for this resource does not exist. "
                "If you created the deployment within the last 5 minutes, please wait a moment "
                "and try again.",
            )
        request[DEPLOYED] = model
        return None

    def _authorised(self, request: web.Request) -> bool:
        return DEPLOYED in request  # (checked by _refused: the api-key header)

    async def body(self, request: web.Request) -> dict[str, Any] | web.Response:
        body = await super().body(request)
        if isinstance(body, dict) and DEPLOYED in request:  # (the body as received stays in ``requests``)
            return {
                **body,
                "model": request[DEPLOYED],
            }  # the deployment decides the model, whatever the body says
        return body

    def azure_error(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        body = {"error": {"code": code, "message": message}}
        return web.Response(
            status=status, body=encode(body), content_type="application/json", headers=headers
        )

    def rate_limited(self, wait: float) -> web.Response:
        seconds = retry_after(wait)
        return self.azure_error(
            429,
            "429",
            "Requests to the ChatCompletions_Create Operation under Azure OpenAI API have "
            f"exceeded call rate limit of your current OpenAI S0 pricing tier. Please retry after {seconds} "
            "second(s). Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase "
            "the default rate limit.",
            {"retry-after": seconds, "x-ratelimit-remaining-requests": "0"},
        )

    async def deployment_chat(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = await self.body(request)
        if isinstance(body, web.Response):
            return body
        if "[filtered]" in _last_user_text(body):
            return self.filtered()
        return await self.answer(request, body)

    def filtered(self) -> web.Response:
        """The prompt refused by the content filter (HTTP 400, code content_filter)."""
        result = {**SAFE, "violence": {"filtered": True, "severity": "high"}}
        body = {
            "error": {
                "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management "
                "policy. Please modify your prompt and retry. To learn more about our content filtering "
                "policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": result},
            }
        }
        return web.Response(status=400, body=encode(body), content_type="application/json")

    def annotate(self, out: dict[str, Any]) -> None:
        choices = out.get("choices")
        if not choices:
            return  # the usage chunk carries no annotation
        if out.get("object") == "chat.completion":
            out["prompt_filter_results"] = PROMPT_RESULTS
        for choice in choices:
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else True
            choice["content_filter_results"] = SAFE if text else {}

    def preamble(self) -> list[bytes]:
        frame = {
            "choices": [],
            "created": 0,
            "id": "",
            "model": "",
            "object": "",
            "prompt_filter_results": PROMPT_RESULTS,
        }
        return [b"data: " + encode(frame) + b"\n\n"]


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
