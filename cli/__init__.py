"""The ``router`` command (``python -m cli``): serving the gateway, the demo, the emulators, and the
store's groups, keys, budgets, webhooks and console password from the shell."""
