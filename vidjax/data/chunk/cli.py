"""The chunker's command line: long videos -> short constant-rate chunks.

    python -m vidjax.data.chunk SRC DST [--chunk-seconds 15] [--short-side 288]
        [--fps N] [--gop 32] [--bframes 7] [--crf 23] [--preset veryfast]
        [--tune fastdecode] [--x264-params K=V:...] [--workers N]

writes `DST/<video_id>/<start_second>.mp4` and one line per finished video in
`DST/manifest.jsonl` (see `vidjax.data.chunk`). Videos that fail are listed
with the reason in `DST/errors.jsonl`; the others go on. Re-running skips the
videos already in the manifest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vidjax import errors
from vidjax.data.chunk import encode, manifest as manifest_lib, store


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.data.chunk",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  parser.add_argument("src", help="a video, a folder of videos, or a .txt list")
  parser.add_argument("dst", help="output root (chunks + manifest.jsonl)")
  d = encode.ChunkOptions()
  parser.add_argument(
    "--chunk-seconds",
    type=float,
    default=d.chunk_seconds,
    help="length of each chunk file in seconds",
  )
  parser.add_argument(
    "--short-side",
    type=int,
    default=d.short_side,
    help="output short side in pixels; 0 keeps the size",
  )
  parser.add_argument(
    "--fps",
    type=float,
    default=0,
    help="output frame rate; 0 keeps the source's",
  )
  parser.add_argument(
    "--gop", type=int, default=d.gop, help="keyframe interval in frames"
  )
  parser.add_argument(
    "--bframes",
    type=int,
    default=d.bframes,
    help="non-reference B-frames between P-frames",
  )
  parser.add_argument(
    "--crf",
    type=int,
    default=d.crf,
    help="x264 constant rate factor: lower is better quality and larger files",
  )
  parser.add_argument("--preset", default=d.preset, help="x264 preset")
  parser.add_argument(
    "--tune",
    default=d.tune,
    help="x264 tune; '' for none (fastdecode: CAVLC, no "
    "deblocking, no weighted prediction)",
  )
  parser.add_argument(
    "--x264-params",
    default=d.x264_params,
    help="extra x264 options, key=value:key=value",
  )
  parser.add_argument(
    "--workers", type=int, default=1, help="videos chunked in parallel"
  )
  args = parser.parse_args(argv)
  try:
    opts = encode.ChunkOptions(
      chunk_seconds=args.chunk_seconds,
      short_side=args.short_side,
      fps=args.fps or None,
      gop=args.gop,
      bframes=args.bframes,
      crf=args.crf,
      preset=args.preset,
      tune=args.tune,
      x264_params=args.x264_params,
    )
  except errors.ConfigError as e:
    parser.error(str(e))
  try:
    summary = store.chunk_videos(args.src, args.dst, opts, workers=args.workers)
  except (errors.UserError, OSError) as e:  # Bad input: no traceback.
    message = e.describe() if isinstance(e, errors.UserError) else str(e)
    parser.exit(errors.EXIT_USAGE, f"{parser.prog}: error: {message}\n")
  print(
    f"chunked {summary['done']}, already done {summary['skipped']}, "
    f"failed {len(summary['failed'])}"
    + (
      f" (listed in {Path(args.dst) / manifest_lib.ERRORS})"
      if summary["failed"]
      else ""
    )
  )
  return 1 if summary["failed"] else 0
