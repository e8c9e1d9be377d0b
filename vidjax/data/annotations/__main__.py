"""`python -m vidjax.data.annotations convert-ego4d|convert-relevancy IN OUT`:
one-time conversions of pickled annotations (`vidjax.data.annotations`)."""

import sys

from vidjax.data import annotations

if __name__ == "__main__":
  sys.exit(annotations.main())
