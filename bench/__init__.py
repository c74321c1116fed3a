"""``make bench``: our gateway, a bare proxy and LiteLLM proxy measured side by side (see bench/README.md)."""
