"""``python -m primus_energon.synthetic``: the same CLI as the ``primus-synth`` console script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
