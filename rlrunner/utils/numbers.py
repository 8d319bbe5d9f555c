"""Numbers read from untrusted JSON (reward servers' answers, detections)."""

from __future__ import annotations

import math


def is_finite_number(value: object) -> bool:
    """A finite JSON number: not a bool, not NaN or infinite, and not an integer too long for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
