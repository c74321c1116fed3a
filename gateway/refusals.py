"""Which refused calls leave a usage record: all of them, up to ``PER_SECOND`` a second per group and
error code; past that, a flood (a burst refused 429, a group out of credit calling in a loop) is
counted (``router_refusals_unrecorded_total{code}``) and the next record kept says how many it
stands for. A thousand refusals in a second would otherwise be a thousand rows written on the event
loop's group commit while the other groups wait (docs/operations.md, "Tenant isolation")."""

from __future__ import annotations

from core import metrics

PER_SECOND = 10


class Refusals:
    def __init__(self, per_second: int = PER_SECOND) -> None:
        self.per_second = per_second
        self._windows: dict[tuple[int, str], list[float]] = {}  # (group, code) -> [second, kept, skipped]

    def keep(self, group_id: int, code: str, now: float) -> int | None:
        """None: do not record this one (counted); else record it, noting the number it stands for
        beyond itself (those left out since the last one kept)."""
        second = float(int(now))
        window = self._windows.get((group_id, code))
        if window is None:
            if len(self._windows) > 10_000:
                self._windows.clear()
            window = self._windows[(group_id, code)] = [second, 0, 0]
        elif window[0] != second:
            window[0], window[1] = second, 0
        if window[1] >= self.per_second:
            window[2] += 1
            metrics.refusal_unrecorded(code)
            return None
        window[1] += 1
        skipped, window[2] = int(window[2]), 0
        return skipped
