"""`python -m vidjax.embed`: every moment of your own videos embedded into a
searchable INDEX. The command's code is `vidjax.search.embed`."""

import sys

from vidjax.base import internals
from vidjax.report import console
from vidjax.search import embed

if __name__ == "__main__":
  console.setup_console()  # Process-wide: not for library use.
  internals.import_flax_without_ipython()
  sys.exit(embed.main())
