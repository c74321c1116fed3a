"""Azure OpenAI as a deployment kind of openai/: the emulator's Azure flavour proven by the openai
SDK's own ``AzureOpenAI`` client (URL shape, api-version, api-key, errors, content-filter results),
and the plain OpenAI SDK through the gateway to an Azure deployment."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from core.config import Settings, StoreSettings, parse_settings
from emulators.azure import SAFE, AzureOpenAIEmulator
from tests.conftest import Stack

KEY = "emu-azure-key"
VERSION = "2024-10-21"
MODELS = {
    "gpt-4o-mini": "gpt-4o-mini-2024-07-18",
    "mini-eu": "gpt-4o-mini-2024-07-18",
    "img-eu": "gpt-image-1",
    "emb-eu": "text-embedding-3-small",
}


def azure_settings(tmp: str) -> object:
    def configure(urls: dict[str, str]) -> Settings:
        settings = parse_settings(
            {
                "providers": {
                    "openai": {
                        "deployments": [
                            {
                                "name": "azure-eu",
                                "kind": "azure",
                                "base_url": urls["azure"],
                                "api_version": VERSION,
                                "api_key": KEY,
                                "model_names": {
                                    "gpt-4o-mini": "mini-eu",
                                    "gpt-image-1": "img-eu",
                                    "text-embedding-3-small": "emb-eu",
                                },
                            },
                        ]
                    }
                },
            }
        )
        return Settings(store=StoreSettings(url=f"sqlite:///{tmp}/router.db"), providers=settings.providers)

    return configure


@pytest.fixture(scope="module")
def azure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("azure")
    extra = {"azure": AzureOpenAIEmulator(KEY, MODELS), "limited": AzureOpenAIEmulator(KEY, rpm=1)}
    stack = Stack(tmp, extra=extra, configure=azure_settings(str(tmp))).start()  # type: ignore[arg-type]
    yield stack
    stack.stop()


def azure_client(stack: Stack, name: str = "azure", **kw: object) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(
        azure_endpoint=stack.extra_urls[name], api_key=KEY, api_version=VERSION, max_retries=0, **kw
    )  # type: ignore[arg-type]


def test_azure_sdk_chat_and_content_filter_results(azure_stack: Stack) -> None:
    with azure_client(azure_stack) as client:
        out = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello"}]
        )
    assert out.choices[0].message.content and out.choices[0].finish_reason == "stop"
    assert out.model == "gpt-4o-mini-2024-07-18"  # the deployment's model, not the deployment's name
    assert out.usage is not None and out.usage.total_tokens > 0
    extra = out.model_extra or {}
    assert extra["prompt_filter_results"][0]["content_filter_results"]["hate"] == {
        "filtered": False,
        "severity": "safe",
    }
    assert (out.choices[0].model_extra or {})["content_filter_results"] == SAFE


def test_azure_sdk_stream_opens_with_the_prompt_filter_frame(azure_stack: Stack) -> None:
    with azure_client(azure_stack, azure_deployment="mini-eu") as client:
        chunks = list(
            client.chat.completions.create(
                model="ignored-with-azure-deployment",
                stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": "Hello"}],
            )
        )
    first = chunks[0]
    assert first.choices == [] and first.id == "" and (first.model_extra or {})["prompt_filter_results"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]


def test_azure_errors_as_the_sdk_raises_them(azure_stack: Stack) -> None:
    url = azure_stack.extra_urls["azure"]
    with openai.AzureOpenAI(
        azure_endpoint=url, api_key="wrong", api_version=VERSION, max_retries=0
    ) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
    with azure_client(azure_stack) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(
                model="gpt-5-nowhere", messages=[{"role": "user", "content": "Hi"}]
            )
        assert missing.value.code == "DeploymentNotFound"
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "[filtered]"}]
            )
        assert refused.value.code == "content_filter"
        assert refused.value.body["innererror"]["code"] == "ResponsibleAIPolicyViolation"  # type: ignore[index]
    no_version = httpx.post(
        f"{url}/openai/deployments/gpt-4o-mini/chat/completions",
        headers={"api-key": KEY},
        json={"messages": [{"role": "user", "content": "Hi"}]},
    )
    assert no_version.status_code == 404 and no_version.json()["error"]["message"] == "Resource not found"


def test_an_emulator_told_its_rpm_answers_429_with_retry_after(azure_stack: Stack) -> None:
    with azure_client(azure_stack, "limited") as client:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
    assert 55 <= int(limited.value.response.headers["retry-after"]) <= 60  # 1 RPM: the next one a minute on
    emulator = azure_stack.extra["limited"]
    assert (emulator.served, emulator.refused) == (1, 1)


def test_the_plain_sdk_through_the_gateway_to_an_azure_deployment(azure_stack: Stack) -> None:
    client = azure_stack.client()
    emulator = azure_stack.extra["azure"]
    out = client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "Hello"}]
    )
    assert out.model == "openai/gpt-4o-mini" and out.choices[0].message.content
    assert emulator.requests[-1]["model"] == "mini-eu"  # the deployment's name for the model
    chunks = list(
        client.chat.completions.create(
            model="openai/gpt-4o-mini",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Hello"}],
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"  # Azure's prompt filter frame is not passed on
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == out.choices[0].message.content
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == out.usage.total_tokens  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "[filtered]"}]
        )
    assert refused.value.code == "content_filter"


def test_responses_through_an_azure_deployment_go_through_chat(azure_stack: Stack) -> None:
    client = azure_stack.client()
    emulator = azure_stack.extra["azure"]
    before = emulator.served
    out = client.responses.create(model="openai/gpt-4o-mini", input="Hello")
    assert out.output_text and out.model == "openai/gpt-4o-mini" and out.usage is not None
    assert emulator.served == before + 1 and emulator.requests[-1]["model"] == "mini-eu"  # Azure's chat
    events = list(client.responses.create(model="openai/gpt-4o-mini", input="Hello", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"


def test_embeddings_and_images_on_azure_as_the_sdk_and_the_gateway_send_them(azure_stack: Stack) -> None:
    """Azure serves embeddings and images under its URL shape (the deployment in the path, api-key):
    the AzureOpenAI SDK proves the emulator, then the gateway sends both there (it sent images to
    OpenAI's URL with a bearer token, and got 404)."""
    emulator = azure_stack.extra["azure"]
    with azure_client(azure_stack) as sdk:
        vectors = sdk.embeddings.create(model="emb-eu", input=["one", "two"])
        drawn = sdk.images.generate(model="img-eu", prompt="a red square", size="1024x1024")
    assert (
        len(vectors.data) == 2
        and len(vectors.data[0].embedding) == 1536
        and drawn.data
        and drawn.data[0].b64_json
    )
    client = azure_stack.client()
    assert len(client.embeddings.create(model="openai/text-embedding-3-small", input="one").data) == 1
    assert emulator.requests[-1]["model"] == "emb-eu"
    image = client.images.generate(model="openai/gpt-image-1", prompt="a red square", size="1024x1024")
    assert image.data and image.data[0].b64_json and emulator.requests[-1]["model"] == "img-eu"
