"""Upstream adapters: one module per wire protocol, plus the shared transport and the emulators.

An adapter is pure translation (structs in, bytes/dicts out, no I/O); all networking lives in
:mod:`adapters.transport`. ``ADAPTERS`` maps a catalog ``protocol`` to its adapter class.
"""

from __future__ import annotations

from adapters.base import Adapter, Call, StreamTranslator, UpstreamRequest
from adapters.openai import OpenAIAdapter

ADAPTERS: dict[str, type[Adapter]] = {"openai": OpenAIAdapter}


def register(protocol: str, adapter: type[Adapter]) -> None:
    ADAPTERS[protocol] = adapter


def _optional() -> None:
    # Adapters of other protocols register themselves when their module exists.
    import importlib

    for name in ("adapters.anthropic", "adapters.gemini"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


_optional()

__all__ = ["ADAPTERS", "Adapter", "Call", "StreamTranslator", "UpstreamRequest", "register"]
