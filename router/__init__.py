"""An OpenAI-compatible gateway in front of five upstream LLM provider groups."""

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from router.app import create_app

        return create_app
    raise AttributeError(name)
