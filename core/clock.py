"""The wall clock that budget windows are read on, replaceable in tests.

``clock()`` is ``time.time`` unless ``$ROUTER_CLOCK_FILE`` names a file: then it is ``time.time()``
plus the number of seconds written in that file (read on every call; a missing or empty file is 0).
The tests move every gateway process of a run past a day boundary by writing one number, instead of
waiting for midnight; nothing else reads the variable. A test in one process sets a store's ``clock``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

Clock = Callable[[], float]
ENV = "ROUTER_CLOCK_FILE"


class FileClock:
    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> float:
        try:
            with open(self.path, encoding="ascii") as file:
                text = file.read().strip()
        except OSError:
            text = ""
        return time.time() + (float(text) if text else 0.0)


def clock() -> Clock:
    path = os.environ.get(ENV)
    return FileClock(path) if path else time.time
