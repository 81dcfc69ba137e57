"""The trainer behind ``latecast train``: the loop (``loop``), the step captured in a CUDA
graph (``graphed``), checkpoints (``checkpoint``), the output folder (``rundir``) and the
models (``models``). Imports the core and storage."""
