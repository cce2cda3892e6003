"""`python -m recipes.preflight --run-dir RUN_DIR`: the entry of the network preflight stage
(recipes/observability/preflight.py)."""

import sys

from recipes.observability.preflight import main

if __name__ == "__main__":
    sys.exit(main())
