"""Small conveniences that keep lesson notebooks thin: quick mode, the machine line, self-checks.

Introduced in lesson 00.
"""

from __future__ import annotations

import os

__all__ = ["QUICK", "choose", "lesson_setup", "self_check"]

QUICK = os.environ.get("COURSE_QUICK") == "1"
"""True when COURSE_QUICK=1 (the tests set it): durations and grids shrink, the story stays the same."""


def choose(full, quick):
    """Pick the full-mode value, or the quick-mode one when COURSE_QUICK=1 (lesson 00)."""
    return quick if QUICK else full


def lesson_setup() -> dict:
    """Print one line about this machine and the mode, set plot defaults; return the machine info (lesson 00)."""
    import matplotlib as mpl

    from helpers.machine import describe_machine, machine

    mpl.rcParams.update({"figure.figsize": (9, 4), "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3})
    info = machine()
    mode = "quick mode (short runs)" if QUICK else "full mode"
    print(f"{describe_machine()} | {mode}")
    return info


def self_check(passed: bool, success: str, hint: str) -> None:
    """Print a cheer when `passed`, else fail with a friendly hint of what to look at (lesson 00)."""
    if not passed:
        raise AssertionError(f"Not yet: {hint}")
    print(f"✔ {success}")
