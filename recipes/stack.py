"""`python -m recipes.stack [check|install|wheels]`: the entry of the training stack check (common/stack.py)."""

import sys

from common.stack import main

if __name__ == "__main__":
    sys.exit(main())
