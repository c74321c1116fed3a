"""Amounts of credits: integers of nano-credits (10⁻⁹ credit) inside, decimal strings outside.

to_nano("12.5")    -> 12_500_000_000   (ValueError: not a number, or more than 9 decimals)
to_credits(1500)   -> "0.0000015"       (exact, no trailing zeros)
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

NANO = 10**9  # balances and prices are integers of nano-credits


def to_nano(text: str) -> int:
    try:
        value = Decimal(text) * NANO
    except InvalidOperation:
        raise ValueError(f"{text!r} is not an amount of credits") from None
    if not value.is_finite():
        raise ValueError(f"{text!r} is not an amount of credits")
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} has more than 9 decimals")
    return int(value)


def to_credits(nano: int) -> str:
    """The exact decimal amount, without trailing zeros (``0``, ``1.5``, ``0.000000001``, ``-2.5``):
    the one formatter of nano-credits for a machine (answers, the admin API, the CLI, messages)."""
    whole, frac = divmod(abs(nano), NANO)
    text = f"{whole}.{frac:09d}".rstrip("0").rstrip(".")
    return f"-{text}" if nano < 0 else text
