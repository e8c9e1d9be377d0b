"""`python -m vidjax.search INDEX "query"`: text search and zero-shot labels
over an INDEX (`vidjax.search`)."""

import sys

from vidjax import search
from vidjax.report import console

if __name__ == "__main__":
  console.setup_console()  # Process-wide: not for library use.
  sys.exit(search.main())
