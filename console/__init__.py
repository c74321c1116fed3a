"""The management console: server-rendered pages at ``/console`` and the admin JSON API at
``/console/api``. ``console_app(gateway)`` builds the sub-app that ``create_app`` mounts."""

from console.site import console_app

__all__ = ["console_app"]
