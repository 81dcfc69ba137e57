"""What the command line and ``latecast doctor`` both print with. Imports nothing of torch:
the command line starts without it."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units: ``512 B``, ``50.2 KB``, ``1.3 GB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
