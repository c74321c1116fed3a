"""What the gateway hands a caller to give back unchanged, sealed: authenticated encryption (AES-256-GCM)
with the gateway's key, so a caller can neither read nor alter it, and a blob the gateway did not seal
is told apart at once.

    Sealer(key).seal(payload)           a JSON-able dict -> "rtr1.<base64url(nonce + ciphertext)>"
    Sealer(key).open(text, where)       -> the dict; a tampered or foreign blob is a 400 naming ``where``
    sealed(text)                        whether a text has the gateway's form (else it is another's: dropped)

Used for the provider's state of a translated Responses tool turn (Anthropic's signed thinking blocks,
Gemini's thought signatures) that a caller keeping nothing (``store: false``, as Codex) sends back in a
reasoning item's ``encrypted_content`` (gateway/responses_translate.py). The key is ``[responses]
seal_key`` (or ``$ROUTER_SEAL_KEY``), else one the first replica made and keeps in the store.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from core.errors import InvalidRequest
from core.inputs import key_of

__all__ = ["PREFIX", "Sealer", "key_of", "sealed"]

PREFIX = "rtr1."
_AAD = b"model-router reasoning state v1"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def sealed(text: Any) -> bool:
    return isinstance(text, str) and text.startswith(PREFIX)


class Sealer:
    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, payload: dict[str, Any]) -> str:
        nonce = os.urandom(12)
        body = self._aead.encrypt(nonce, _encode(payload), _AAD)
        return PREFIX + base64.urlsafe_b64encode(nonce + body).decode().rstrip("=")

    def open(self, text: str, where: str) -> dict[str, Any]:
        """The payload of a sealed ``text``; a text that is not the gateway's form at all is another's
        (an empty dict: the caller drops it)."""
        if not sealed(text):
            return {}
        refused = InvalidRequest(
            f"'{where}' was not sealed by this gateway, or was altered: send back the "
            "reasoning item as it came, or leave it out.",
            param=where,
            code="invalid_encrypted_content",
        )
        data = text[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
            value = _decode(self._aead.decrypt(raw[:12], raw[12:], _AAD)) if len(raw) > 28 else None
        except (ValueError, binascii.Error, InvalidTag, msgspec.DecodeError):
            raise refused from None
        if not isinstance(value, dict):
            raise refused
        return value
