"""`python -m vidjax.data.chunk`: the chunker's command line (`cli`)."""

import sys

from vidjax.data.chunk import cli

sys.exit(cli.main())
