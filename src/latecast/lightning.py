"""Moved to ``latecast.integrations.lightning``; this name stays for programs that import it."""

import warnings

from .integrations.lightning import PrepareOnDevice

warnings.warn(
    "latecast.lightning is now latecast.integrations.lightning (PrepareOnDevice)",
    DeprecationWarning,
    stacklevel=2,
)
__all__ = ["PrepareOnDevice"]
