"""The gateway as a module-level ASGI app, for any ASGI server (settings from ``$ROUTER_CONFIG``):

    ROUTER_CONFIG=router.toml uvicorn router.asgi:app --loop uvloop --http httptools --no-access-log

``router serve`` (hypercorn) is the default; docs/benchmarks.md has the measured figures. Another
ASGI server serves one app on its one listener: the console's own listener (``[console] listen``) is
``router serve``'s alone, and a configuration that sets it is refused here.
"""

from core.catalog import ConfigError
from core.config import load_settings
from router.app import create_app
from server.serve import tune_gc

app = create_app(load_settings(None))
if app.state.console_listener is not None:
    raise ConfigError(
        "[console] listen is served by `router serve` only: under another ASGI server leave it "
        "unset (the console is then at /console on the one listener) or set [console] enabled = false"
    )
tune_gc()
