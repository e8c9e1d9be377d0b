"""The chunker's command line: long videos -> short constant-rate chunks.

    python -m vidjax.data.chunk SRC DST [--chunk-seconds 15] [--short-side 288]
        [--fps N] [--gop 32] [--bframes 7] [--crf 23] [--preset veryfast]
        [--tune fastdecode] [--x264-params K=V:...] [--workers N] [--shard K/N]
        [--profile default|sparse]
    python -m vidjax.data.chunk --status DST
    python -m vidjax.data.chunk --merge DST

writes `DST/<video_id>/<start_second>.mp4` and one line per finished video in
`DST/manifest.jsonl` (see `vidjax.data.chunk`). Videos that fail twice are
listed with the reason in `DST/errors.jsonl`; the others go on. Re-running
skips the videos already in the manifest. `--shard K/N` chunks shard K of N
(about equal in bytes), its lines in `DST/shards/K-of-N/`: the N shards run
side by side (a SLURM array: launch/chunk_slurm.sh), readers see the union,
`--merge` joins them into `DST/manifest.jsonl` once all are finished.
`--status` prints the progress of every part and an ETA.

`--profile sparse` (`PROFILES`; explicit flags still win) is for recipes
whose clips take a few frames far apart, AVION's 4-frame pretraining clips:
such a frame decodes from its keyframe, so keyframes every 2 frames and no
B-frames (`--gop 2 --bframes 0`) decode 1.5 frames per delivered frame
instead of ~2.9, for about 3x the disk (`python -m benchmarks.pipeline`).

Exit status: 0 every video chunked; 1 some failed (listed); 2 refused (bad
arguments or input, a source without videos, another chunker on the same
part); 75 stopped by
SIGTERM or Ctrl-C (the same command resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
import signal
import sys

from vidjax.base import errors
from vidjax.data.chunk import encode, manifest as manifest_lib, parts, store


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.data.chunk",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  parser.add_argument(
    "src", nargs="?", help="a video, a folder of videos, or a .txt list"
  )
  parser.add_argument(
    "dst", nargs="?", help="output root (chunks + manifest.jsonl)"
  )
  parser.add_argument(
    "--profile",
    choices=sorted(encode.PROFILES),
    default="default",
    help="encoder settings for a kind of clip (sparse: a few frames far "
    "apart, as AVION's 4-frame clips); set the defaults of the flags below",
  )
  # The profile first: it sets the defaults (and -h shows them).
  first = argparse.ArgumentParser(prog=parser.prog, add_help=False)
  first.add_argument(
    "--profile", choices=sorted(encode.PROFILES), default="default"
  )
  profile = first.parse_known_args(argv)[0].profile
  d = dataclasses.replace(encode.ChunkOptions(), **encode.PROFILES[profile])
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
  parser.add_argument(
    "--shard",
    type=_shard,
    default=argparse.SUPPRESS,
    metavar="K/N",
    help="chunk only shard K of N (the sources split by size), its lines in "
    "DST/shards/K-of-N/; run the N side by side, on one machine or many",
  )
  parser.add_argument(
    "--status",
    metavar="DST",
    default=argparse.SUPPRESS,
    help="print the store's progress (every shard's), its failures and an "
    "ETA, then exit",
  )
  parser.add_argument(
    "--merge",
    metavar="DST",
    default=argparse.SUPPRESS,
    help="join the finished shards of DST into DST/manifest.jsonl (refusing "
    "gaps, lost lines and duplicates), then exit",
  )
  args = parser.parse_args(argv)
  try:
    if hasattr(args, "status") or hasattr(args, "merge"):
      return _report(args)
  except (errors.UserError, OSError) as e:
    parser.exit(errors.EXIT_USAGE, f"{parser.prog}: error: {_describe(e)}\n")
  if args.dst is None:
    parser.error("give SRC and DST (or --status DST, or --merge DST)")
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
  shard = getattr(args, "shard", None)
  previous = signal.getsignal(signal.SIGTERM)
  signal.signal(signal.SIGTERM, _stop)
  try:
    summary = store.chunk_videos(
      args.src, args.dst, opts, workers=args.workers, shard=shard
    )
  except (errors.UserError, OSError) as e:  # Bad input: no traceback.
    parser.exit(errors.EXIT_USAGE, f"{parser.prog}: error: {_describe(e)}\n")
  except KeyboardInterrupt:
    print(
      f"{parser.prog}: stopped; the same command resumes (the videos under "
      "way are chunked again)",
      file=sys.stderr,
    )
    return errors.EXIT_PREEMPTED
  finally:
    signal.signal(signal.SIGTERM, previous)
  print(
    f"chunked {summary['done']}, already done {summary['skipped']}, "
    f"failed {len(summary['failed'])}"
    + (
      f" (listed in "
      f"{manifest_lib.part_dir(args.dst, shard) / manifest_lib.ERRORS})"
      if summary["failed"]
      else ""
    )
  )
  return 1 if summary["failed"] else 0


def _shard(text: str) -> tuple[int, int]:
  """'K/N' -> (K, N), 1 <= K <= N."""
  try:
    k, n = (int(x) for x in text.split("/"))
  except ValueError:
    k = n = 0
  if not 1 <= k <= n:
    raise argparse.ArgumentTypeError(
      f"{text!r}: give K/N with whole numbers 1 <= K <= N, e.g. 3/8"
    )
  return k, n


def _stop(signum, frame):  # SIGTERM: as Ctrl-C, the part's lock released.
  del signum, frame
  raise KeyboardInterrupt


def _describe(e: Exception) -> str:
  return e.describe() if isinstance(e, errors.UserError) else str(e)


def _report(args) -> int:
  """--status DST or --merge DST."""
  if hasattr(args, "status"):
    print(parts.status(args.status))
    return 0
  merged = parts.merge(args.merge)
  print(
    f"merged {merged['shards']} shards into "
    f"{Path(args.merge) / manifest_lib.MANIFEST}: {merged['videos']} videos"
    + (
      f", {merged['failed']} failed (listed in "
      f"{Path(args.merge) / manifest_lib.ERRORS})"
      if merged["failed"]
      else ""
    )
  )
  return 0
