"""The gateway as a module-level ASGI app, for any ASGI server (settings from ``$ROUTER_CONFIG``):

    ROUTER_CONFIG=router.toml uvicorn router.asgi:app --loop uvloop --http httptools --no-access-log

``router serve`` (hypercorn) is the default; docs/benchmarks.md has the measured figures.
"""

from core.config import load_settings
from router.app import create_app
from server.serve import tune_gc

app = create_app(load_settings(None))
tune_gc()
