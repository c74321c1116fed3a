"""Routing strategies: in which order a call tries the deployments that can serve its model.

Pure functions of the deployments, what is known of their load (:class:`Load`) and a random source:
the state they read lives in gateway/upstream_state.py, the loop that uses the order in
gateway/dispatch.py. Which strategy applies is ``[providers.X] routing`` (or ``model_routing`` for
one model; core/deployments.py).

    simple-shuffle  weighted random: a deployment of weight w comes first w / Σw of the time
    least-busy      fewest calls in flight first
    latency         fastest recently first, by the measure that fits the call (as LiteLLM's
                    lowest-latency routing): a stream by its time to first byte, a non-stream call by
                    seconds per output token (its whole answer's time over its output tokens, so one
                    group's long answers do not make a deployment look slow to everyone's short ones);
                    each a moving average, fed by calls of its kind only. With probability
                    ``exploration`` the order is weighted random instead, and a deployment not yet
                    measured comes first, so every one keeps being measured
    usage           most headroom first: the least used fraction of its RPM and TPM ceilings (a
                    deployment without ceilings has all its headroom)

Ties are broken at random, by weight. The order holds every deployment: the first that is not
cooling down and has room under its ceilings serves, the others are where the call moves to if
that one fails.

Sticky routing (``[providers.X] sticky``) orders by the conversation instead of the strategy: the
weighted rendezvous hash of the caller's key and the conversation (the request's ``user``, else its
first messages) over the deployments. Every replica computes the same order with no shared state, a
deployment of weight w is first for w / Σw of the conversations, and when one cools down only its
own conversations move, each to its next deployment in its hash order, and come back after.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from core.deployments import Deployment, Strategy

_encode = msgspec.json.Encoder().encode
_TWO64 = float(2**64)


class Load(NamedTuple):
    """What routing knows of one deployment's load (this replica's view; with Redis, as of its last
    exchange with the shared state)."""

    in_flight: int = 0
    latency: float | None = None  # streams: seconds to first byte, moving average; None: not measured yet
    headroom: float = 1.0  # 0..1: the least unused fraction of its RPM / TPM ceilings
    per_token: float | None = None  # non-stream calls: seconds per output token, moving average


class Ask(NamedTuple):
    """What a call asks of routing besides its model."""

    tokens: int = 0  # its worst case in tokens, counted against TPM ceilings (0: none declared)
    conversation: bytes | None = None  # the sticky order's digest, if the provider routes conversations
    stream: bool = True  # which latency ranks it, and which average its own measure joins


IDLE = Load()


def _weighted_keys(deps: Sequence[Deployment], rnd: random.Random) -> list[float]:
    """Efraimidis-Spirakis keys: sorting by them, descending, is a weighted random permutation."""
    return [rnd.random() ** (1.0 / d.weight) for d in deps]


def order(
    strategy: Strategy,
    deps: Sequence[Deployment],
    loads: Sequence[Load],
    rnd: random.Random,
    exploration: float = 0.1,
    stream: bool = True,
) -> list[int]:
    """The indexes of ``deps`` in the order to try them (``stream``: the call's kind, for latency)."""
    n = len(deps)
    if n == 1:
        return [0]
    keys = _weighted_keys(deps, rnd)
    if strategy == "least-busy":
        rank: list[Any] = [(loads[i].in_flight, -keys[i]) for i in range(n)]
    elif strategy == "latency" and rnd.random() >= exploration:
        measures = [load.latency if stream else load.per_token for load in loads]
        rank = [(-1.0 if measures[i] is None else measures[i], -keys[i]) for i in range(n)]
    elif strategy == "usage":
        rank = [(-loads[i].headroom, -keys[i]) for i in range(n)]
    else:  # simple-shuffle, and latency's exploration
        rank = [-k for k in keys]
    return sorted(range(n), key=rank.__getitem__)


def conversation(key_id: int, raw: dict[str, Any], first: int) -> bytes:
    """What names a conversation: the caller's key and the request's ``user``, else its first
    ``first`` messages (they stay the same while the conversation grows)."""
    user = raw.get("user")
    if isinstance(user, str) and user:
        seed = b"u" + user.encode()
    else:
        messages = raw.get("messages")
        if not isinstance(messages, list):
            messages = raw.get("input")  # a Responses body
            messages = messages if isinstance(messages, list) else [messages]
        seed = b"m" + _encode(messages[:first])
    return hashlib.blake2b(seed, digest_size=16, key=str(key_id).encode()).digest()


def sticky(digest: bytes, deps: Sequence[Deployment]) -> list[int]:
    """The conversation's order of the deployments: weighted rendezvous hashing, by -w / ln u
    descending, u uniform in (0, 1) from the hash of the conversation and the deployment's name."""
    scores = []
    for dep in deps:
        h = int.from_bytes(hashlib.blake2b(dep.name.encode(), digest_size=8, key=digest).digest())
        scores.append(dep.weight / -math.log((h + 0.5) / _TWO64))
    return sorted(range(len(deps)), key=scores.__getitem__, reverse=True)
