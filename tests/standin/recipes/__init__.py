"""The stand-in's `recipes` package: its own `train`, and every other module from the repository's recipes/ (the
job runs with this directory first on sys.path, as its working directory; the repository is on PYTHONPATH)."""

from pathlib import Path

import common

__path__.append(str(Path(common.__file__).resolve().parents[1] / "recipes"))  # noqa: F821 (a package's __path__)
