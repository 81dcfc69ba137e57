"""``python -m latecast``. The package imports nothing heavy (see ``__init__``), so a Ctrl-C
before ``main`` runs is caught here: one line, exit code 130."""

import sys

try:
    from .tools.cli import main
except KeyboardInterrupt:
    sys.stderr.write("latecast: interrupted\n")
    sys.exit(130)

if __name__ == "__main__":  # not when a spawned worker imports it
    sys.exit(main())
