"""latecast's exceptions: one type per family, all subclasses of ``LatecastError``.

Every message names the file or value, what was expected and what was found, so the CLI
can print it as one line (exit code 1) without a traceback.
"""


class LatecastError(Exception):
    """Base class of every error latecast raises on bad input or a fault it detected."""


class FormatError(LatecastError):
    """A data file (IDX, CIFAR binary, image, store) is malformed or of the wrong kind."""


class DownloadError(LatecastError):
    """Every mirror of a file failed, or a download did not match its pinned SHA-256."""


class ConfigError(LatecastError):
    """A bad argument: unknown name, out-of-range number, impossible combination."""


class WriteError(LatecastError):
    """A file or folder could not be written: no space left, read-only, a name too long."""


class DeviceError(LatecastError):
    """The device cannot do what was asked (no CUDA, dataset does not fit in memory)."""


class CheckpointError(LatecastError):
    """A checkpoint is corrupt, foreign, or does not match the run resuming from it."""


class TrainingError(LatecastError):
    """Training diverged (NaN/inf loss), a distributed peer failed, or its output could not
    be written (a full disk, a folder gone read-only)."""


class BatchError(LatecastError):
    """A batch from a wrapped iterable (``latecast.wrap``) that cannot cross as it was
    declared: float images where uint8 was declared, a value out of range, an ambiguous
    layout. The message names the field."""
