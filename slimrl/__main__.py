"""``python -m slimrl``: the same as the ``slimrl`` console script."""

import sys

from slimrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
