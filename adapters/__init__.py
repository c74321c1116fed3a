"""Upstream adapters: one per wire protocol, plus the shared transport.

An adapter is pure translation (structs in, bytes/dicts out, no I/O); all networking lives in
:mod:`adapters.transport`. ``ADAPTERS`` is the one registry: a catalog ``protocol`` → its adapter
class, checked at import against the protocols the catalog accepts (:data:`core.catalog.PROTOCOLS`),
so a provider of any catalog can always be served.
"""

from __future__ import annotations

from adapters.anthropic import AnthropicAdapter
from adapters.base import Adapter, Call, StreamTranslator, UpstreamRequest
from adapters.gemini import GeminiAdapter
from adapters.openai import OpenAIAdapter
from core.catalog import PROTOCOLS, ProviderSpec

ADAPTERS: dict[str, type[Adapter]] = {
    "openai": OpenAIAdapter,
    "anthropic": AnthropicAdapter,
    "gemini": GeminiAdapter,
}


def check_registry(adapters: dict[str, type[Adapter]], protocols: tuple[str, ...]) -> None:
    """Every protocol the catalog accepts has exactly one adapter, registered under its own name."""
    missing = sorted(set(protocols) - set(adapters))
    extra = sorted(set(adapters) - set(protocols))
    misnamed = sorted(name for name, cls in adapters.items() if cls.protocol != name)
    if missing or extra or misnamed:
        raise TypeError(
            f"adapter registry does not match the catalog's protocols: missing {missing}, "
            f"unknown {extra}, registered under another name {misnamed}"
        )


check_registry(ADAPTERS, PROTOCOLS)


def adapter_for(prefix: str, spec: ProviderSpec) -> Adapter:
    """The adapter serving the provider ``prefix`` of the catalog."""
    return ADAPTERS[spec.protocol](prefix, spec)


__all__ = [
    "ADAPTERS",
    "Adapter",
    "Call",
    "StreamTranslator",
    "UpstreamRequest",
    "adapter_for",
    "check_registry",
]
