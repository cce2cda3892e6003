"""`python -m data_prep ...`: see `python -m data_prep --help`."""

import sys

from data_prep.cli import main

if __name__ == "__main__":  # worker processes (spawn) import this module too: only the real entry runs
    sys.exit(main())
