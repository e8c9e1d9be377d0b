"""`python -m vidjax.checksums PATH ...`: a checkpoint's files checked
against their checksums. The command's code is `vidjax.checkpoints.checksums`."""

import sys

from vidjax.checkpoints import checksums

if __name__ == "__main__":
  sys.exit(checksums.main(sys.argv))
