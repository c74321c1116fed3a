"""``POST /v1/images/generations`` and ``/v1/images/edits``: the GPT image models and Imagen through
the gateway with the openai SDK, the emulators proven with the openai SDK and google-genai, prices
(tokens for GPT image, per image for Imagen), the reservation's worst case, bad input and faults."""

from __future__ import annotations

import base64
import io
import json
import struct
import warnings

import openai
import pytest
from google import genai
from google.genai import types as gtypes
from google.genai._common import ExperimentalWarning

from billing.pricing import PER
from emulators.images import png
from tests.conftest import Stack, raw_request

GPT = ["openai/gpt-image-1", "openai/gpt-image-1.5", "openai/gpt-image-1-mini"]
IMAGEN = [
    "google/imagen-4.0-generate-001",
    "google/imagen-4.0-fast-generate-001",
    "google/imagen-4.0-ultra-generate-001",
]


def size_of(b64: str) -> tuple[int, int]:
    data = base64.b64decode(b64)
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("model", GPT)
def test_gpt_image_models_generate_and_are_billed_by_tokens(stack: Stack, model: str) -> None:
    group = stack.group(50)
    client = stack.client(stack.key(group=group))
    answer = client.images.generate(
        model=model, prompt="a red lighthouse", size="1536x1024", quality="low", n=2
    )
    assert answer.data is not None and len(answer.data) == 2
    assert {size_of(image.b64_json or "") for image in answer.data} == {(1536, 1024)}
    assert answer.usage is not None and answer.usage.output_tokens == 800
    (record,) = stack.run(stack.store.usage(group=group, limit=10))
    assert (record.endpoint, record.status, record.model) == ("images", "ok", model)
    assert (record.prompt_tokens, record.completion_tokens) == (answer.usage.input_tokens, 800)
    prices = stack.gateway.catalog.resolve(model).prices
    assert record.credits == -(-(record.prompt_tokens * prices.input + 800 * prices.output) // PER)
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.spent == record.credits and g.reserved == 0


@pytest.mark.parametrize("model", IMAGEN)
def test_imagen_models_generate_and_are_billed_per_image(stack: Stack, model: str) -> None:
    group = stack.group(50)
    client = stack.client(stack.key(group=group))
    n = 1 if "ultra" in model else 3
    answer = client.images.generate(model=model, prompt="a lighthouse at dusk", size="1408x768", n=n)
    assert answer.data is not None and len(answer.data) == n
    assert {size_of(image.b64_json or "") for image in answer.data} == {(1408, 768)}
    sent = stack.emulator("google").requests[-1]
    assert sent["parameters"] == {"sampleCount": n, "aspectRatio": "16:9"}
    (record,) = stack.run(stack.store.usage(group=group, limit=10))
    assert record.credits == n * stack.gateway.catalog.resolve(model).prices.image > 0
    assert (record.endpoint, record.status) == ("images", "ok")


def test_models_show_image_prices_and_endpoints(stack: Stack) -> None:
    cards = {m.id: m.model_dump() for m in stack.client().models.list().data}
    imagen = cards["google/imagen-4.0-generate-001"]
    assert imagen["endpoints"] == ["images"] and imagen["pricing"]["image"] == "0.04"
    gpt = cards["openai/gpt-image-1.5"]
    assert (
        gpt["endpoints"] == ["images"]
        and gpt["pricing"]["image_input"] == "8"
        and "image" not in gpt["pricing"]
    )


def test_the_reservation_covers_n_images_at_the_largest_size(stack: Stack) -> None:
    """Imagen at 0.04 per image: 4 images need 0.16 credits reserved; a group holding 0.1 is refused
    before the upstream, and 2 images (0.08) go through. GPT image: n x the largest image's tokens."""
    client = stack.client(stack.key(credits=0.1))
    before = len(stack.emulator("google").requests)
    with pytest.raises(openai.APIStatusError) as info:
        client.images.generate(model="google/imagen-4.0-generate-001", prompt="four", n=4)
    assert info.value.status_code == 402 and len(stack.emulator("google").requests) == before
    client.images.generate(model="google/imagen-4.0-generate-001", prompt="two", n=2)
    small = stack.client(stack.key(credits=0.5))  # 10 x 6,240 tokens x 40 per 1M = 2.5 credits worst case
    with pytest.raises(openai.APIStatusError) as gpt:
        small.images.generate(model="openai/gpt-image-1", prompt="ten", n=10)
    assert gpt.value.status_code == 402
    small.images.generate(model="openai/gpt-image-1", prompt="one", n=1, quality="low")


def test_edits_multipart_through_the_gateway(stack: Stack) -> None:
    group = stack.group(50)
    client = stack.client(stack.key(group=group))
    picture = png(64, 64, (10, 20, 30))
    answer = client.images.edit(
        model="openai/gpt-image-1.5",
        image=("in.png", picture, "image/png"),
        prompt="add a moon",
        size="1024x1536",
    )
    assert answer.data is not None and size_of(answer.data[0].b64_json or "") == (1024, 1536)
    assert answer.usage is not None and answer.usage.input_tokens_details.image_tokens == 323
    two = client.images.edit(
        model="openai/gpt-image-1",
        image=[("a.png", picture, "image/png"), ("b.png", picture, "image/png")],
        prompt="merge them",
        n=2,
    )
    assert two.data is not None and len(two.data) == 2
    assert stack.emulator("openai").requests[-1]["n"] == 2
    records = stack.run(stack.store.usage(group=group, limit=10))
    prices = stack.gateway.catalog.resolve("openai/gpt-image-1.5").prices
    first = records[-1]
    text = first.prompt_tokens - 323
    assert first.credits == -(
        -(text * prices.input + 323 * prices.image_input + first.completion_tokens * prices.output) // PER
    )


def _post(stack: Stack, path: str, body: bytes, ctype: str, key: str | None = None) -> tuple[int, dict]:
    reply = raw_request(
        stack, "POST", path, body, {"authorization": f"Bearer {key or stack.key()}", "content-type": ctype}
    )
    return reply.status, reply.json()["error"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            {"model": "openai/gpt-image-1", "prompt": "x", "response_format": "url"},
            "response_format",
            "b64_json",
        ),
        ({"model": "openai/gpt-image-1", "prompt": "x", "size": "512x512"}, "size", "1536x1024"),
        ({"model": "google/imagen-4.0-generate-001", "prompt": "x", "size": "1536x1024"}, "size", "1408x768"),
        ({"model": "google/imagen-4.0-generate-001", "prompt": "x", "n": 5}, "n", "at most 4"),
        ({"model": "google/imagen-4.0-ultra-generate-001", "prompt": "x", "n": 2}, "n", "at most 1 image"),
        ({"model": "openai/gpt-image-1", "prompt": "x", "n": 11}, "n", "1 to 10"),
        ({"model": "openai/gpt-image-1", "prompt": ""}, "prompt", "prompt"),
        ({"model": "openai/gpt-image-1", "prompt": "x", "quality": "ultra"}, "quality", "high"),
        ({"model": "openai/gpt-4o-mini", "prompt": "x"}, "model", "does not serve"),
        ({"model": "anthropic/claude-haiku-4-5", "prompt": "x"}, "model", "does not serve"),
    ],
)
def test_bad_generation_input_is_a_400_naming_the_field(
    stack: Stack, body: dict, param: str, says: str
) -> None:
    status, error = _post(stack, "/v1/images/generations", json.dumps(body).encode(), "application/json")
    assert status == 400 and error["param"] == param and says in error["message"], error


def _form(fields: dict[str, str], files: list[tuple[str, str, bytes]]) -> tuple[bytes, str]:
    out = io.BytesIO()
    for name, value in fields.items():
        out.write(f'--b\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, filename, data in files:
        out.write(
            f'--b\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    out.write(b"--b--\r\n")
    return out.getvalue(), "multipart/form-data; boundary=b"


def test_bad_edit_input(stack: Stack) -> None:
    picture = png(8, 8, (1, 2, 3))
    text, ctype = _form(
        {"model": "openai/gpt-image-1", "prompt": "x"}, [("image", "notes.txt", b"hello, not an image")]
    )
    status, error = _post(stack, "/v1/images/edits", text, ctype)
    assert status == 400 and error["param"] == "image" and error["code"] == "invalid_image_format"
    none, ctype = _form({"model": "openai/gpt-image-1", "prompt": "x"}, [])
    status, error = _post(stack, "/v1/images/edits", none, ctype)
    assert status == 400 and error["param"] == "image"
    imagen, ctype = _form(
        {"model": "google/imagen-4.0-generate-001", "prompt": "x"}, [("image", "a.png", picture)]
    )
    status, error = _post(stack, "/v1/images/edits", imagen, ctype)
    assert status == 400 and error["param"] == "model" and "does not edit" in error["message"]
    status, error = _post(stack, "/v1/images/edits", b'{"model": "openai/gpt-image-1"}', "application/json")
    assert status == 415 or (status == 400 and "multipart" in error["message"])


def test_upstream_failures_cost_nothing(stack: Stack) -> None:
    group = stack.group(50)
    client = stack.client(stack.key(group=group))
    with pytest.raises(openai.InternalServerError):
        client.images.generate(model="openai/gpt-image-1", prompt="boom [fault:503]")
    with pytest.raises(openai.APIStatusError) as bad:
        client.images.generate(model="google/imagen-4.0-generate-001", prompt="garbled [malformed]")
    assert bad.value.status_code == 502
    records = stack.run(stack.store.usage(group=group, limit=10))
    assert [r.status for r in records] == ["error", "error"] and {r.credits for r in records} == {0}
    g = stack.run(stack.store.get_group(group))
    assert g is not None and g.spent == 0 and g.reserved == 0


# -- the emulators with the providers' SDKs ---------------------------------------------------------
def test_openai_sdk_against_the_emulator(stack: Stack) -> None:
    running = stack.emulators["openai"]
    with openai.OpenAI(base_url=running.base_url, api_key=running.api_key, max_retries=0) as sdk:
        made = sdk.images.generate(model="gpt-image-1.5", prompt="same", size="1024x1536")
        again = sdk.images.generate(model="gpt-image-1.5", prompt="same", size="1024x1536")
        assert made.data and again.data and made.data[0].b64_json == again.data[0].b64_json
        assert size_of(made.data[0].b64_json or "") == (1024, 1536)
        assert made.usage is not None and made.usage.output_tokens == 1584
        edited = sdk.images.edit(
            model="gpt-image-1", image=("a.png", png(16, 16, (0, 0, 0)), "image/png"), prompt="x"
        )
        assert edited.usage is not None and edited.usage.input_tokens_details.image_tokens == 323
        with pytest.raises(openai.BadRequestError):
            sdk.images.edit(model="gpt-image-1", image=("a.txt", b"text", "text/plain"), prompt="x")
    with (
        openai.OpenAI(base_url=running.base_url, api_key="wrong", max_retries=0) as wrong,
        pytest.raises(openai.AuthenticationError),
    ):
        wrong.images.generate(model="gpt-image-1", prompt="x")


def test_google_genai_generate_images_against_the_emulator(stack: Stack) -> None:
    """google-genai calls Imagen (generate_images, deprecated there) only in Vertex AI mode: express
    mode (an API key) posts the same :predict body, which the emulator also serves at Vertex's path."""
    running = stack.emulators["google"]
    options = gtypes.HttpOptions(base_url=running.base_url.removesuffix("/v1beta"), api_version="v1beta1")
    with (
        genai.Client(vertexai=True, api_key=running.api_key, http_options=options) as client,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", ExperimentalWarning)
        answer = client.models.generate_images(
            model="imagen-4.0-generate-001",
            prompt="a fox",
            config=gtypes.GenerateImagesConfig(number_of_images=2, aspect_ratio="3:4"),
        )
        images = [g.image.image_bytes for g in answer.generated_images or [] if g.image]
        assert len(images) == 2 and all(
            i is not None and struct.unpack(">II", i[16:24]) == (896, 1280) for i in images
        )
        with pytest.raises(genai.errors.ClientError):
            client.models.generate_images(
                model="imagen-4.0-generate-001",
                prompt="x",
                config=gtypes.GenerateImagesConfig(number_of_images=5),
            )
