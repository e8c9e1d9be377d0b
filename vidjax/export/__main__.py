"""`python -m vidjax.export RUN_OR_STEP OUT --format avion|open_clip|hf|safetensors`.

Exit status: 0 written; 2 refused (no checkpoint, a format that cannot hold
the model, an existing OUT: `vidjax.base.errors`), with the reason and a
hint and no traceback; 74 OUT could not be written (a full disk: nothing is
left at OUT).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import os
import sys

from vidjax.base import errors

PROG = "python -m vidjax.export"


def _refuse(e: errors.UserError) -> int:
  print(f"{PROG}: error: {e.describe()}", file=sys.stderr)
  return e.exit_code


def main(argv: Sequence[str] | None = None) -> int:
  """The command line (see the module docstring); returns the exit status."""
  from vidjax import export

  parser = argparse.ArgumentParser(
    prog=PROG,
    description="A trained model's parameters in the layout another "
    "codebase loads, with a model card (OUT/README.md).",
  )
  parser.add_argument(
    "run",
    help="a run's workdir (its best checkpoint if recorded, else its "
    "latest), its checkpoints/ directory, or one step directory",
  )
  parser.add_argument("out", help="the directory to write (must not exist)")
  parser.add_argument(
    "--format",
    required=True,
    choices=sorted(export.FORMATS),
    help="avion: AVION/LaViLa's CLIP or CLIP classifier (.pt with torch, "
    ".safetensors); open_clip: a one-frame CLIP for OpenCLIP; hf: a "
    "VideoMAE for transformers; safetensors: vidjax's own names",
  )
  parser.add_argument(
    "--frames",
    type=int,
    choices=(1,),
    help="1: a video CLIP as it embeds one frame (for --format open_clip)",
  )
  args = parser.parse_args(argv)
  try:
    files = export.export(args.run, args.out, args.format, frames=args.frames)
  except errors.UserError as e:
    return _refuse(e)
  except OSError as e:
    return _refuse(
      errors.WriteError(
        f"{args.out} could not be written: {e.strerror or e} (nothing was "
        "left there)",
        "free space, or choose a writable OUT",
      )
    )
  out = os.path.abspath(args.out)
  for name in sorted(os.listdir(out)):
    print(os.path.join(out, name))
  for line in files.notes + files.skipped:
    print(f"note: {line}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
