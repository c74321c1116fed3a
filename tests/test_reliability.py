"""Retries, fallbacks, circuit breaking and timeouts, driven by the emulators' fault injection."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from cli.console import store_password
from console import auth
from core.catalog import NANO
from core.config import ReliabilitySettings, Settings, StoreSettings
from core.deployments import Deployment
from core.errors import RateLimited, UpstreamTooLarge
from gateway.reliability import (
    PASS,
    REFUSED,
    Breaker,
    Breakers,
    backoff,
    breaker_failure,
    failover,
    retryable,
)
from tests.conftest import Stack, free_port, http_post, metric, raw_request, use_deployment
from tests.test_console import PASSWORD, Client

EXTRA = """
[[models]]
id = "upstage/solar-mini-fb"
upstream = "solar-mini-250422"
price = { input = "0.15", output = "0.15" }
fallbacks = ["mistral/mistral-small-latest"]
"""


@pytest.fixture(scope="module")
def rstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("reliability")
    (tmp / "extra.toml").write_text(EXTRA)
    settings = Settings(
        store=StoreSettings(url=f"sqlite:///{tmp}/router.db"),
        reliability=ReliabilitySettings(
            max_retries=2,
            backoff_base=0.01,
            backoff_max=0.05,
            breaker_threshold=3,
            breaker_cooldown=0.5,
            first_byte_timeout=0.5,
            stream_keepalive=0.2,
            deadline=5,
        ),
    )
    settings.catalog.path = str(tmp / "extra.toml")
    s = Stack(tmp, settings).start()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _fresh_breakers(rstack: Stack) -> Iterator[None]:
    gw = rstack.gateway
    saved = dict(gw.providers)
    gw.breakers = Breakers(3, 0.5, 30, gw.providers)
    yield
    for deployment in saved.values():
        use_deployment(gw, deployment)
    rstack.close_clients()


def _dead(rstack: Stack, prefix: str) -> None:
    good = rstack.gateway.providers[prefix]
    use_deployment(
        rstack.gateway, Deployment(prefix, f"http://127.0.0.1:{free_port()}/v1", good.api_key, 1, 5)
    )


def _requests_with(rstack: Stack, prefix: str, text: str) -> int:
    return sum(1 for r in rstack.emulator(prefix).requests if text in json.dumps(r.get("messages") or r))


def test_retry_until_the_upstream_recovers(rstack: Stack) -> None:
    group = rstack.group(10)
    client = rstack.client(rstack.key(group=group))
    text = f"retry me {time.time()} [flaky:2]"
    out = client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": text}]
    )
    assert out.choices[0].message.content
    assert _requests_with(rstack, "openai", text) == 3  # two 503s, then success
    [record] = rstack.run(rstack.store.usage(group=group))
    assert record.status == "ok" and record.credits > 0  # one call, one record


def test_retries_are_bounded(rstack: Stack) -> None:
    text = f"always down {time.time()} [flaky:10]"
    with pytest.raises(openai.InternalServerError) as info:
        rstack.client().chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": text}]
        )
    assert info.value.status_code == 503
    assert _requests_with(rstack, "openai", text) == 3  # 1 + max_retries


def test_429_retry_after_is_honoured(rstack: Stack) -> None:
    text = f"limited {time.time()} [limited:1]"
    began = time.monotonic()
    out = rstack.client().chat.completions.create(
        model="mistral/mistral-small-latest", messages=[{"role": "user", "content": text}]
    )
    assert out.choices[0].message.content
    assert time.monotonic() - began >= 0.1  # waited the upstream's retry-after
    assert _requests_with(rstack, "mistral", text) == 2


def test_no_retry_after_the_first_byte(rstack: Stack) -> None:
    text = f"mid {time.time()} [midfail]"
    with pytest.raises(openai.APIError):
        list(
            rstack.client().chat.completions.create(
                model="openai/gpt-4o-mini", stream=True, messages=[{"role": "user", "content": text}]
            )
        )
    assert _requests_with(rstack, "openai", text) == 1


def test_an_upstream_silent_mid_stream_for_its_read_timeout_ends_the_stream_billed_for_what_came(
    rstack: Stack,
) -> None:
    """A deployment's ``read_timeout`` bounds each read of a stream (the gateway's own deadline since
    aiohttp's per-read timer went): the upstream sends its first event (the role), then nothing for
    longer; the caller gets it, then the in-band error, at the timeout, not when the upstream resumes;
    the call is settled as an error that produced nothing (no charge) and its reservation released."""
    good = rstack.gateway.providers["openai"]
    use_deployment(rstack.gateway, Deployment("openai", good.base_url, good.api_key, 1, 0.4))
    group = rstack.group(10)
    client = rstack.client(rstack.key(group=group))
    began = time.monotonic()
    stream = client.chat.completions.create(
        model="openai/gpt-4o-mini",
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": f"stall {time.time()} [tokens:6] [delay:1500]"}],
    )
    roles = []
    with pytest.raises(openai.APIError) as failed:
        for chunk in stream:
            roles += [c.delta.role for c in chunk.choices if c.delta.role]
    assert time.monotonic() - began < 1.3  # the next event was 1.5 s away: the read timed out at 0.4 s
    assert roles == ["assistant"] and "lost mid-stream" in failed.value.message
    [record] = rstack.run(rstack.store.usage(group=group))
    assert record.status == "error" and "TimeoutError" in (record.error or "")
    assert record.credits == 0 and not record.usage_exact
    assert rstack.run(rstack.store.get_group(group)).balance == 10 * NANO


def test_the_providers_refusal_of_the_gateways_key_is_a_502_nobody_retries(rstack: Stack) -> None:
    """The provider refuses the gateway's own key (401): 502 upstream_auth_failed, never blamed on the
    caller's key, not retried by the gateway (UpstreamFinal) nor by the openai SDK with its default two
    retries (x-should-retry: false), so the provider sees one request a call."""
    good = rstack.gateway.providers["mistral"]
    use_deployment(rstack.gateway, Deployment("mistral", good.base_url, "not-the-gateways-key", 1, 5))
    count = 'router_upstream_errors_total{provider="mistral",status="401"}'
    before = metric(rstack, count)
    with openai.OpenAI(base_url=rstack.base_url, api_key=rstack.key(), max_retries=2) as sdk:
        with pytest.raises(openai.InternalServerError) as info:
            sdk.chat.completions.create(
                model="mistral/mistral-small-latest", messages=[{"role": "user", "content": "x"}]
            )
    assert info.value.status_code == 502 and info.value.code == "upstream_auth_failed"  # type: ignore[attr-defined]
    assert "not a problem with your API key" in info.value.message
    assert info.value.response.headers["x-should-retry"] == "false"
    assert metric(rstack, count) == before + 1


def test_request_fallback_list_serves_and_bills_the_fallback(rstack: Stack) -> None:
    _dead(rstack, "upstage")
    group = rstack.group(10)
    client = rstack.client(rstack.key(group=group))
    out = client.chat.completions.create(
        model="upstage/solar-mini",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"models": ["mistral/mistral-small-latest"]},
    )
    assert out.model == "mistral/mistral-small-latest"  # the model that actually served
    assert "models" not in rstack.emulator("mistral").requests[-1]  # our field, not sent upstream
    records = rstack.run(rstack.store.usage(group=group))
    served = next(r for r in records if r.status == "ok")
    failed = next(r for r in records if r.status == "error")
    assert served.model == "mistral/mistral-small-latest" and served.provider == "mistral"
    assert failed.model == "upstage/solar-mini" and failed.credits == 0
    expected = -(-(served.prompt_tokens * 100_000_000 + served.completion_tokens * 300_000_000) // 10**6)
    assert served.credits == expected  # billed at mistral-small's prices
    tries = json.loads(failed.attempts or "[]")  # the first candidate's tries, each refused
    assert len(tries) == 3 and all(t[0] == "upstage" and t[1] != "ok" for t in tries)
    assert served.attempts is None  # (one attempt: the record's deployment says it)
    # the served call's page in the console lists the candidate it fell back from, and the other way round
    rstack.run(store_password(rstack.store, auth.hash_password(PASSWORD)))
    console = Client(rstack)
    assert console.login(PASSWORD).status == 303
    page = console.get(f"/console/calls/{served.id}").text
    assert f'<a href="/console/calls/{failed.id}">Call {failed.id}</a>: upstage/solar-mini' in page
    assert "One attempt, on mistral" in page
    page = console.get(f"/console/calls/{failed.id}").text
    assert (
        f"Call {served.id}</a>: mistral/mistral-small-latest" in page and page.count("<td>upstage</td>") == 3
    )


def test_catalog_fallback_and_stream(rstack: Stack) -> None:
    _dead(rstack, "upstage")
    chunks = list(
        rstack.client().chat.completions.create(
            model="upstage/solar-mini-fb",
            stream=True,
            messages=[{"role": "user", "content": "hi [tokens:3]"}],
        )
    )
    assert {c.model for c in chunks} == {"mistral/mistral-small-latest"}
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_bad_request_does_not_fall_back(rstack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        rstack.client().chat.completions.create(
            model="openai/gpt-4o-mini",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"models": "not-a-list"},
        )
    assert info.value.code == "invalid_value" and info.value.param == "models"  # type: ignore[attr-defined]


def test_circuit_opens_then_probes_back(rstack: Stack) -> None:
    good = rstack.gateway.providers["upstage"]
    _dead(rstack, "upstage")
    client = rstack.client()
    for _ in range(3):  # 3 calls (of 3 attempts each, a call counts once) in a row failed: the circuit opens
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(
                model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}]
            )
    assert rstack.gateway.breakers["upstage"].state == "open"
    began = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(
            model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.code == "circuit_open" and time.monotonic() - began < 0.2  # type: ignore[attr-defined]
    use_deployment(rstack.gateway, good)  # the upstream comes back
    time.sleep(0.55)  # cool-down over: the next call is the probe
    assert client.chat.completions.create(
        model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}]
    )
    assert rstack.gateway.breakers["upstage"].state == "closed"


@pytest.mark.parametrize("poison", ["[fault:500]", "[slow:3000]"])
def test_one_groups_failing_calls_open_the_circuit_for_that_group_only(rstack: Stack, poison: str) -> None:
    """A provider that fails on what one tenant sends (a 500 on its input, no answer within the
    first-byte timeout for its long calls) opens the circuit for that tenant's group, not for the
    others: their calls are served, and the first that succeeds closes it. A failure two groups share
    is the provider's: then the circuit is open for every group."""
    ask = {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
    a, b, c = rstack.client(), rstack.client(), rstack.client()  # three groups
    for _ in range(3):  # 3 failed calls (each tried 3 times, counted once), all group A's
        with pytest.raises(openai.InternalServerError):
            a.chat.completions.create(
                **{**ask, "messages": [{"role": "user", "content": f"{time.time()} {poison}"}]}
            )
    assert rstack.gateway.breakers["openai"].state == "open"
    with pytest.raises(openai.InternalServerError) as info:  # A's calls are refused at once meanwhile
        a.chat.completions.create(**ask)
    assert info.value.code == "circuit_open"  # type: ignore[attr-defined]
    assert b.chat.completions.create(**ask).choices[0].message.content  # another group is served
    assert rstack.gateway.breakers["openai"].state == "closed"  # and its success closed the circuit
    assert a.chat.completions.create(**ask).choices[0].message.content

    _dead(rstack, "openai")  # now the provider itself is down
    for client in (a, b, a):
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(**ask)
    began = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:  # two groups failed: open for everyone
        c.chat.completions.create(**ask)
    assert info.value.code == "circuit_open" and time.monotonic() - began < 0.2  # type: ignore[attr-defined]


def test_two_groups_failing_calls_leave_a_third_groups_calls_served(rstack: Stack) -> None:
    """The fault probe's scenario: two groups send calls the provider fails on (a 500 on their input),
    each tried three times, between a third group's ordinary calls. A call counts once, and the third
    group's answers close the circuit between them, so the third group is always served; when the two
    groups' failures do open it for everyone, the third group, answered a moment ago, is still served
    and its answer closes it for all. The circuit never counts what a provider says about one call's
    content (a 400)."""
    gw = rstack.gateway
    gw.breakers = Breakers(3, 30, 30, gw.providers)  # a cool-down no test step outlasts
    ask = {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
    a, b, c, d = rstack.client(), rstack.client(), rstack.client(), rstack.client()  # four groups

    def fail(client: openai.OpenAI, poison: str = "[fault:500]") -> None:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(
                **{**ask, "messages": [{"role": "user", "content": f"{time.time()} {poison}"}]}
            )
        assert info.value.code != "circuit_open"  # type: ignore[attr-defined]

    for _ in range(3):
        fail(a)
        fail(b)  # six attempts of two groups: two failed calls, below the threshold of three
        assert gw.breakers["openai"].failures == 2
        assert c.chat.completions.create(**ask).choices[0].message.content  # served, and closes it
        assert gw.breakers["openai"].state == "closed"
    for _ in range(5):  # a provider's 400 is about the call's content: never counted
        with pytest.raises(openai.BadRequestError):
            a.chat.completions.create(
                **{**ask, "messages": [{"role": "user", "content": f"{time.time()} [fault:400]"}]}
            )
    assert gw.breakers["openai"].failures == 0

    fail(a), fail(b), fail(a)  # three failed calls in a row, from two groups: open for every group
    assert gw.breakers["openai"].state == "open"
    with pytest.raises(openai.InternalServerError) as info:  # a group the provider has not answered lately
        d.chat.completions.create(**ask)
    assert info.value.code == "circuit_open"  # type: ignore[attr-defined]
    assert c.chat.completions.create(**ask).choices[0].message.content  # answered lately: served
    assert gw.breakers["openai"].state == "closed"  # and its answer closed it for everyone
    assert d.chat.completions.create(**ask).choices[0].message.content


def test_first_byte_timeout(rstack: Stack) -> None:
    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        rstack.client().chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": f"{time.time()} [slow:3000]"}]
        )
    assert info.value.status_code == 504
    assert time.monotonic() - began < 2.5  # 3 attempts of 0.5 s, not 3 s each


def test_idle_gap_between_chunks_times_out(rstack: Stack) -> None:
    good = rstack.gateway.providers["openai"]
    use_deployment(rstack.gateway, Deployment("openai", good.base_url, good.api_key, 1, 0.3))
    with pytest.raises(openai.APIError):
        list(
            rstack.client().chat.completions.create(
                model="openai/gpt-4o-mini",
                stream=True,
                messages=[{"role": "user", "content": "x [tokens:5] [delay:1000]"}],
            )
        )


def test_keepalive_comments_while_a_stream_waits(rstack: Stack) -> None:
    key = rstack.key()
    body = json.dumps(
        {
            "model": "mistral/mistral-small-latest",
            "stream": True,
            "messages": [{"role": "user", "content": "wait [slow:450] [tokens:2]"}],
        }
    ).encode()
    request = http_post(key, body, close=True)
    with socket.create_connection(("127.0.0.1", rstack.port)) as sock:
        sock.sendall(request)
        received = b""
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            received += piece
    text = received.decode()
    assert text.startswith("HTTP/1.1 200")
    assert text.index(": keep-alive") < text.index("data: {")
    assert "data: [DONE]" in text


def _raw_stream(
    rstack: Stack,
    key: str,
    content: str,
    stop_after: bytes | None = None,
    *,
    model: str = "mistral/mistral-small-latest",
    path: str = "/v1/chat/completions",
) -> str:
    """POST a streamed call over a plain socket (chat; ``path="/v1/responses"``: ``content`` is the
    input); everything received (or, with ``stop_after``, up to that text, and then the socket is closed)."""
    if path == "/v1/responses":
        body = json.dumps({"model": model, "stream": True, "input": content}).encode()
    else:
        body = json.dumps(
            {"model": model, "stream": True, "messages": [{"role": "user", "content": content}]}
        ).encode()
    request = http_post(key, body, path, close=True)
    received = b""
    with socket.create_connection(("127.0.0.1", rstack.port)) as sock:
        sock.sendall(request)
        while stop_after is None or stop_after not in received:
            piece = sock.recv(65536)
            if not piece:
                break
            received += piece
    return received.decode()


def test_an_upstream_failing_after_keepalives_began_is_an_error_event(rstack: Stack) -> None:
    """Once keep-alive comments went out (status 200 sent), a failed upstream can only be reported
    in the stream: one error event, then [DONE]."""
    text = _raw_stream(rstack, rstack.key(), f"{time.time()} [slow:300] [fault:500]")
    assert text.startswith("HTTP/1.1 200")
    assert "x-ratelimit" not in text.lower()  # the response began before the limits' headers were known
    error = text.index('data: {"error"')
    assert text.index(": keep-alive") < error < text.index("data: [DONE]")
    assert '"choices"' not in text


def test_a_caller_gone_while_the_upstream_is_slow_is_settled_as_interrupted(rstack: Stack) -> None:
    group = rstack.group()
    _raw_stream(rstack, rstack.key(group=group), "wait [slow:450] [tokens:2]", stop_after=b": keep-alive")
    deadline = time.monotonic() + 5
    records: list[Any] = []
    while time.monotonic() < deadline and not records:
        records = rstack.run(rstack.store.usage(group=group, limit=10))
        time.sleep(0.05)
    assert [r.status for r in records] == ["interrupted"]
    assert records[0].completion_tokens == 0  # the prompt reached the upstream: it is charged, nothing else
    assert rstack.run(rstack.store.get_group(group)).balance == 100 * NANO - records[0].credits


def test_backoff_and_breaker_units() -> None:
    assert backoff(0, 0.25, 4, "2") == 2.0
    assert 0.125 <= backoff(0, 0.25, 4) <= 0.25
    assert 2.0 <= backoff(10, 0.25, 4) <= 4.0
    b = Breaker(threshold=2, cooldown=10, probe_timeout=100)
    b.failure(7, now=0)
    assert b.allow(7, now=1) == PASS
    b.failure(7, now=1)
    assert b.allow(7, now=5) == REFUSED
    assert b.allow(8, now=5) == PASS  # group 7's failures alone: open for group 7 only
    probe = b.allow(7, now=11)  # half-open: this call is the probe
    assert probe > 0
    assert b.allow(7, now=11) == REFUSED  # one probe at a time
    b.release(probe)  # it ended without a verdict (the caller's 402, a hang-up): the next call probes
    second = b.allow(7, now=12)
    assert second > 0 and second != probe
    b.release(probe)  # a stale ticket releases nothing
    assert b.allow(7, now=12) == REFUSED
    assert b.allow(7, now=200) > 0  # a probe nobody released expires
    b.success(7, now=200)
    assert b.allow(7, now=201) == PASS and b.state == "closed"
    b.success(9, now=295)  # group 9's last call was answered at 295
    b.failure(7, now=300)
    b.failure(8, now=301)  # two groups' failures: the provider's, open for every group
    assert b.allow(10, now=302) == REFUSED and b.allow(7, now=302) == REFUSED
    assert b.allow(9, now=302) == PASS  # but the provider answered group 9 less than a cool-down ago
    assert b.open_for(10, now=302) and not b.open_for(9, now=302)
    assert b.allow(9, now=306) == REFUSED  # (not any more)
    b.failure(9, now=306)  # and its failure counts like any other: it is not let through again
    assert b.allow(9, now=307) == REFUSED and b.failures == 3
    b.success(9, now=400)  # a probe answered: closed for everyone
    assert b.allow(7, now=400) == PASS and b.allow(10, now=400) == PASS
    too_large = UpstreamTooLarge("Request too large")  # another deployment may serve it; no wait will
    assert failover(too_large) and not retryable(too_large) and not breaker_failure(too_large)


def test_a_429_naming_the_input_tokens_per_minute_is_too_large_only_for_a_prompt_well_over_it() -> None:
    from adapters.base import map_upstream_error
    from gateway.chat_codec import too_large_for

    body = json.dumps(
        {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": (
                    "This request would exceed the rate limit for your organization (org-x) of 1,000 input tokens per "
                    "minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits."
                ),
            },
        }
    ).encode()
    limited = map_upstream_error("anthropic", 429, body, {"retry-after": "3"})
    assert (
        isinstance(limited, RateLimited)
        and limited.input_tpm == 1000
        and limited.headers["Retry-After"] == "3"
    )

    def ask(words: int) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "word " * words}]}

    assert too_large_for(limited, "anthropic", ask(900)) is limited  # the minute's usage, maybe
    assert too_large_for(limited, "anthropic", ask(1100)) is limited  # within the estimate's margin
    over = too_large_for(limited, "anthropic", ask(2000))
    assert isinstance(over, UpstreamTooLarge) and "limit 1000, requested about 20" in over.message
    assert "org-x" not in over.message and over.headers["x-should-retry"] == "false"
    plain = map_upstream_error(
        "openai", 429, b'{"error": {"message": "Rate limit reached for requests"}}', {}
    )
    assert isinstance(plain, RateLimited) and plain.input_tpm is None


def _open_circuit(rstack: Stack, model: str = "upstage/solar-mini") -> None:
    """Open ``model``'s circuit for every group: three groups' calls fail (one group's alone would
    open it for that group only)."""
    prefix = model.split("/")[0]
    good = rstack.gateway.providers[prefix]
    _dead(rstack, prefix)
    for _ in range(3):  # three groups' calls failed in a row: the circuit opens for all
        with pytest.raises(openai.InternalServerError):
            rstack.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert rstack.gateway.breakers[prefix].state == "open"
    with pytest.raises(openai.InternalServerError) as info:  # a third group
        rstack.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "circuit_open"  # type: ignore[attr-defined]
    use_deployment(rstack.gateway, good)  # the upstream is back
    time.sleep(0.55)  # cool-down over: the next call is the probe


def test_a_probe_refused_with_402_does_not_hold_the_circuit_open(rstack: Stack) -> None:
    """A caller who cannot pay is the probe: its 402 says nothing about the provider, so the next
    caller probes (and closes the circuit) instead of getting circuit_open forever."""
    _open_circuit(rstack)
    broke = rstack.client(rstack.key(credits=0))
    with pytest.raises(openai.APIStatusError) as info:
        broke.chat.completions.create(model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 402
    out = rstack.client().chat.completions.create(
        model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}]
    )
    assert out.choices[0].message.content
    assert rstack.gateway.breakers["upstage"].state == "closed"


def test_a_probe_whose_caller_hangs_up_before_the_first_byte_is_released(rstack: Stack) -> None:
    _open_circuit(rstack, "mistral/mistral-small-latest")
    text = _raw_stream(rstack, rstack.key(), "x [slow:400] [tokens:2]", stop_after=b": keep-alive")
    assert text.startswith("HTTP/1.1 200")  # then the caller hung up while the upstream was still silent
    time.sleep(0.5)
    out = rstack.client().chat.completions.create(
        model="mistral/mistral-small-latest", messages=[{"role": "user", "content": "x"}]
    )
    assert out.choices[0].message.content
    assert rstack.gateway.breakers["mistral"].state == "closed"


def test_circuit_state_in_readyz_and_metrics(rstack: Stack) -> None:
    gw = rstack.gateway
    gw.breakers = Breakers(3, 30, 30, gw.providers)  # a cool-down no step of the test outlasts
    _dead(rstack, "upstage")
    client = rstack.client()
    for _ in range(3):
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(
                model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}]
            )
    ready = raw_request(rstack, "GET", "/readyz")
    assert ready.json()["circuits"]["upstage"] == "open" and ready.json()["circuits"]["openai"] == "closed"
    why = ready.json()["open_circuits"]
    assert list(why) == ["upstage"]  # why it is open: whom it refuses, on what evidence
    assert why["upstage"]["refuses"] == "one group" and why["upstage"]["failed_calls"] == 3
    assert why["upstage"]["groups"] == 1 and why["upstage"]["last_error"]
    assert 0 < why["upstage"]["probe_in_seconds"] <= 30
    with pytest.raises(openai.InternalServerError):  # another group's call fails too: now every group's
        rstack.client().chat.completions.create(
            model="upstage/solar-mini", messages=[{"role": "user", "content": "x"}]
        )
    why = raw_request(rstack, "GET", "/readyz").json()["open_circuits"]["upstage"]
    assert why["refuses"] == "every group" and why["groups"] == 2 and why["failed_calls"] == 4
    scrape = raw_request(rstack, "GET", "/metrics").text
    assert 'router_circuit_state{provider="upstage",state="open"} 1.0' in scrape
    assert 'router_circuit_state{provider="upstage",state="closed"} 0.0' in scrape
    assert 'router_circuit_state{provider="openai",state="closed"} 1.0' in scrape


def test_native_responses_are_retried_too(rstack: Stack) -> None:
    text = f"responses retry {time.time()} [flaky:2]"
    out = rstack.client().responses.create(model="openai/gpt-4o-mini", input=text)
    assert out.status == "completed" and out.output_text
    seen = [r for r in rstack.emulator("openai").requests if text in json.dumps(r)]
    assert len(seen) == 3  # two 503s, then success, all before the caller saw a byte


@pytest.mark.parametrize(
    "model", ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5", "google/gemini-2.5-flash"]
)
def test_an_upstream_account_out_of_credit_is_not_retried(rstack: Stack, model: str) -> None:
    """OpenAI's 429 insufficient_quota, Anthropic's 402 billing_error, Gemini's 400 FAILED_PRECONDITION:
    the gateway's own account there is out of credit. Not the caller's rate limit (no 429), not the
    caller's fault (no 400), and retrying is pointless: one upstream request, and the SDK, with its
    default retries on, does not retry either (``x-should-retry: false`` on our 502)."""
    prefix = model.split("/")[0]
    text = f"broke {time.time()} [fault:402]"
    client = openai.OpenAI(base_url=rstack.base_url, api_key=rstack.key(), max_retries=2)
    try:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    finally:
        client.close()
    assert info.value.status_code == 502 and info.value.code == "upstream_quota_exceeded"  # type: ignore[attr-defined]
    assert info.value.response.headers["x-should-retry"] == "false"
    assert "out of credit" in info.value.message and "not your rate limit" in info.value.message
    assert _requests_with(rstack, prefix, text) == 1


def test_an_upstream_out_of_credit_falls_back(rstack: Stack) -> None:
    text = f"broke {time.time()} [fault:402]"
    out = rstack.client().chat.completions.create(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": text}],
        extra_body={"models": ["mistral/mistral-small-latest"]},
    )
    assert out.model == "mistral/mistral-small-latest"
    assert _requests_with(rstack, "openai", text) == 1


# -- /v1/responses goes through the same lifecycle: breaker, fallbacks, keep-alives ---------------------

PATH = "/v1/responses"


@pytest.mark.parametrize("stream", [False, True])
def test_native_responses_fall_back_to_a_translated_model(rstack: Stack, stream: bool) -> None:
    """An openai/* call (native pass-through) whose upstream is down falls back to the request's
    ``models`` list, here a Claude model (translated): the caller gets a Responses answer either way,
    billed at the model that served."""
    _dead(rstack, "openai")
    group = rstack.group(10)
    client = rstack.client(rstack.key(group=group))
    extra = {"models": ["anthropic/claude-haiku-4-5"]}
    if stream:
        with client.responses.stream(
            model="openai/gpt-4o-mini", input="hi [tokens:3]", extra_body=extra
        ) as events:
            out = events.get_final_response()
    else:
        out = client.responses.create(model="openai/gpt-4o-mini", input="hi [tokens:3]", extra_body=extra)
    assert out.status == "completed" and out.model == "anthropic/claude-haiku-4-5"
    assert len(out.output_text.split()) == 3
    assert "models" not in rstack.emulator("anthropic").requests[-1]
    records = rstack.run(rstack.store.usage(group=group))
    served = next(r for r in records if r.status == "ok")
    assert served.provider == "anthropic" and served.endpoint == "responses" and served.credits > 0
    assert {r.provider for r in records if r.status == "error"} == {"openai"}


def test_native_responses_consult_the_circuit_breaker(rstack: Stack) -> None:
    _dead(rstack, "openai")
    client = rstack.client()
    for _ in range(3):  # 3 failed calls (a call counts once however often it was tried): the circuit opens
        with pytest.raises(openai.InternalServerError):
            client.responses.create(model="openai/gpt-4o-mini", input="x")
    assert rstack.gateway.breakers["openai"].state == "open"
    began = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        client.responses.create(model="openai/gpt-4o-mini", input="x")
    assert info.value.code == "circuit_open" and time.monotonic() - began < 0.2  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "google/gemini-2.5-flash"])
def test_responses_streams_send_keepalives_while_the_upstream_is_slow(rstack: Stack, model: str) -> None:
    text = _raw_stream(
        rstack, rstack.key(), f"wait {time.time()} [slow:450] [tokens:2]", model=model, path=PATH
    )
    assert text.startswith("HTTP/1.1 200")
    assert text.index(": keep-alive") < text.index("event: response.created")
    assert "event: response.completed" in text


def test_a_responses_stream_failing_after_keepalives_is_an_error_event(rstack: Stack) -> None:
    text = _raw_stream(
        rstack, rstack.key(), f"{time.time()} [slow:300] [fault:500]", model="openai/gpt-4o-mini", path=PATH
    )
    assert text.startswith("HTTP/1.1 200")
    error = text.index("event: error\ndata: ")
    assert text.index(": keep-alive") < error
    event = json.loads(text[error:].split("data: ", 1)[1].split("\n", 1)[0])
    assert event["type"] == "error" and event["code"] == "upstream_error" and event["message"]
    assert "response.created" not in text


def test_a_count_is_retried_on_a_transient_failure(rstack: Stack) -> None:
    """count_tokens on an Anthropic model is sent as every call is (gateway/counting.py): a 503 is retried."""
    text = f"count me {time.time()} [flaky:2]"
    claude = rstack.anthropic_client()
    raw = claude.messages.with_raw_response.count_tokens(
        model="anthropic/claude-haiku-4-5", messages=[{"role": "user", "content": text}]
    )
    assert raw.headers["x-router-token-count"] == "provider" and raw.parse().input_tokens > 0
    assert rstack.emulator("anthropic").flakiness.seen["count:" + text] == 3  # two 503s, then the count


def test_an_open_circuit_refuses_a_count_at_once(rstack: Stack) -> None:
    """Calls that failed opened the circuit: a count of the same group is Anthropic's 529 overloaded_error
    at once, without trying the upstream (before, the count went upstream as if nothing had failed)."""
    claude = rstack.anthropic_client()
    for _ in range(3):
        with pytest.raises(anthropic.InternalServerError):
            claude.messages.create(
                model="anthropic/claude-haiku-4-5",
                max_tokens=8,
                messages=[{"role": "user", "content": f"{time.time()} [fault:500]"}],
            )
    assert rstack.gateway.breakers["anthropic"].state == "open"
    text = f"count me {time.time()} [flaky:1]"  # (the emulator counts the tries of a flaky text)
    began = time.monotonic()
    with pytest.raises(anthropic.OverloadedError) as refused:
        claude.messages.count_tokens(
            model="anthropic/claude-haiku-4-5", messages=[{"role": "user", "content": text}]
        )
    assert time.monotonic() - began < 0.2 and refused.value.status_code == 529
    assert refused.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert "circuit open" in refused.value.message
    assert "count:" + text not in rstack.emulator("anthropic").flakiness.seen
