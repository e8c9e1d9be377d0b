"""Whole input pipeline throughput: workers, threads, and time spent waiting.

    python -m vidjax.bench.pipeline [--workers 1,2] [--threads 2]
        [--batch 16] [--batches 20] [--frames 16] [--stride 4] [--size 224]
        [--consumer-clips-per-s 0] [--memory-clips 0] [--smoke]

Chunks the loader benchmark's real footage (`vidjax.bench.footage`, reused
if present) with the chunker's defaults, annotates random 4-second clips, and
runs the real pipeline (Grain + `ClipLoader` + `read_clip` + device transfer)
with each setting, printing clips/s, the speed-up over the single-worker
run, and the CPU cores busy meanwhile (main process and workers: a run that
keeps every core busy cannot go faster). With `--consumer-clips-per-s R` it also simulates a training loop that
needs R clips/s and prints the share of its time spent waiting for data.
With `--memory-clips N` it reports the host RSS (main process + workers)
growth over N clips through 2 workers.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import tempfile
import time

import jax
import ml_collections
import numpy as np

try:  # Not a dependency of vidjax: the `[bench]` extra brings it.
  import psutil
except ModuleNotFoundError:
  psutil = None

from vidjax import bench, defaults, sharding
from vidjax.bench import footage
from vidjax.data import annotations, chunk, pipeline, video


def write_records(
  store: Path,
  video_id: str,
  path: Path,
  num_clips: int = 200,
  seconds: float = 4,
) -> Path:
  """Random `seconds`-long clip records of one video, as JSONL."""
  info = video.video_info(store, video_id)
  length = info.num_frames / float(info.frame_rate)
  starts = np.random.default_rng(0).uniform(0, length - seconds, num_clips)
  annotations.write_jsonl(
    [
      annotations.ClipRecord(
        video_id, float(s), float(s) + seconds, label=i % 10
      )
      for i, s in enumerate(starts)
    ],
    path,
  )
  return path


def data_config(
  store: Path, records: Path, frames: int, stride: int, size: int
) -> ml_collections.ConfigDict:
  # The task decides which targets the batches carry: a label each.
  config = ml_collections.ConfigDict(
    {"seed": 0, "task": "classification", "data": defaults.data_config()}
  )
  config.data.update(
    root=str(store),
    train_annotations=str(records),
    num_frames=frames,
    sampling="stride",
    stride=stride,
    size=size,
  )
  return config


def rss_mb(proc: psutil.Process) -> float:
  """Resident memory of a process and its children (Grain workers), MB."""
  total = proc.memory_info().rss
  for child in proc.children(recursive=True):
    try:
      total += child.memory_info().rss
    except psutil.NoSuchProcess:
      pass
  return total / 2**20


def cpu_seconds(proc: psutil.Process) -> float:
  """CPU time of a process and its children (Grain workers), seconds."""
  total = 0.0
  for p in [proc] + proc.children(recursive=True):
    try:
      times = p.cpu_times()
    except psutil.NoSuchProcess:
      continue
    total += times.user + times.system
  return total


def run(config, mesh, batch: int, batches: int, consumer_rate: float) -> dict:
  """clips/s after warm-up, and the CPU cores busy meanwhile (main process
  and workers); with a consumer rate, the share of time waiting."""
  proc = psutil.Process()
  pipe = pipeline.make_pipeline(config, mesh, train=True, batch_size=batch)
  for _ in range(3):  # Worker start-up and first compilations.
    jax.block_until_ready(next(pipe)["video"])
  step = batch / consumer_rate if consumer_rate else 0.0
  wait = 0.0
  cpu0, t0 = cpu_seconds(proc), time.perf_counter()
  for _ in range(batches):
    t = time.perf_counter()
    jax.block_until_ready(next(pipe)["video"])
    wait += time.perf_counter() - t
    if step:
      time.sleep(step)  # The training step's compute.
  total = time.perf_counter() - t0
  cores = (cpu_seconds(proc) - cpu0) / total
  pipe.close()
  return {
    "clips_per_s": batch * batches / total,
    "wait_share": wait / total,
    "cores": cores,
  }


# The speed columns of both tables (this benchmark's and the loader's).
SPEED_HEADER = f"{'clips/s':>8} {'vs 1 worker':>11} {'cores busy':>10}"


def speed_cells(row: dict, one: float | None) -> str:
  """A row's `SPEED_HEADER` cells; `one`: the 1-worker clips/s, if run."""
  ratio = f"{row['clips_per_s'] / one:10.2f}x" if one else f"{'-':>11}"
  return f"{row['clips_per_s']:8.1f} {ratio} {row['cores']:10.2f}"


def scaling(
  store: Path,
  video_id: str,
  work: Path,
  workers: list[int],
  *,
  size: int = 224,
  frames: int = 16,
  stride: int = 4,
  batch: int = 16,
  batches: int = 20,
) -> dict[int, dict]:
  """clips/s of the whole pipeline with each number of Grain workers.

  Returns and prints, by worker count: `clips_per_s`, `vs_one` (over the
  1-worker run, if measured) and `cores` (CPU cores busy).
  """
  records = write_records(
    store, video_id, work / f"pipeline_clips_{video_id}.jsonl"
  )
  config = data_config(store, records, frames, stride, size)
  mesh = sharding.make_mesh()
  print(
    f"\nwhole pipeline: {batch} x {frames} frames (stride {stride}) -> "
    f"{size}x{size} per batch, {batches} batches, {os.cpu_count()} CPUs\n"
    f"{'workers':>7} {SPEED_HEADER}",
    flush=True,
  )
  rows = {}
  for w in workers:
    config.data.workers, config.data.threads = w, 0
    rows[w] = run(config, mesh, batch, batches, 0.0)
    one = rows.get(1, {}).get("clips_per_s")
    rows[w]["vs_one"] = rows[w]["clips_per_s"] / one if one else None
    print(f"{w:7d} {speed_cells(rows[w], one)}", flush=True)
  return rows


def memory(config, mesh, batch: int, clips: int) -> tuple[float, float]:
  proc = psutil.Process()
  pipe = pipeline.make_pipeline(config, mesh, train=True, batch_size=batch)
  for _ in range(5):
    next(pipe)
  before = rss_mb(proc)
  for _ in range(clips // batch):
    jax.block_until_ready(next(pipe)["video"])
  after = rss_mb(proc)
  pipe.close()
  return before, after


# --smoke: every step once at the smallest sizes (CI), not a measurement.
SMOKE = dict(
  workers="0,1", threads=0, batch=2, batches=2, frames=4, size=32, seconds=8
)


def main(argv=None):
  p = argparse.ArgumentParser(
    prog="python -m vidjax.bench.pipeline",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  p.add_argument(
    "--workers", default="0,1,2", help="comma-separated worker counts"
  )
  p.add_argument(
    "--threads",
    type=int,
    default=2,
    help="also run 0 workers with this many reader threads (0: skip)",
  )
  p.add_argument("--batch", type=int, default=16, help="clips per batch")
  p.add_argument("--batches", type=int, default=20, help="batches timed")
  p.add_argument("--frames", type=int, default=16, help="frames per clip")
  p.add_argument("--stride", type=int, default=4, help="frame stride")
  p.add_argument(
    "--consumer-clips-per-s",
    type=float,
    default=0.0,
    help="simulate a training loop consuming this many clips/s",
  )
  p.add_argument(
    "--memory-clips",
    type=int,
    default=0,
    help="measure RSS growth over this many clips (0: skip)",
  )
  p.add_argument(
    "--workdir",
    default=os.path.join(tempfile.gettempdir(), "vidjax_bench_loader"),
    help="where the source and chunk store are kept",
  )
  footage.add_arguments(p)
  p.add_argument("--smoke", action="store_true", help=bench.SMOKE_HELP)
  args = p.parse_args(argv)
  if psutil is None:
    p.exit(
      2,
      f"{p.prog}: measures processes with psutil: pip install psutil "
      "(or 'vidjax[bench]')\n",
    )
  if args.smoke:
    vars(args).update(SMOKE)
  work = Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  source = footage.prepare_source(work, args.seconds, 568, 320)
  store = footage.store_for(source, chunk.ChunkOptions(), work)
  records = write_records(
    store, source.stem, work / f"pipeline_clips_{source.stem}.jsonl"
  )
  config = data_config(store, records, args.frames, args.stride, args.size)
  mesh = sharding.make_mesh()
  settings = [(int(w), 0) for w in args.workers.split(",")]
  if args.threads:
    settings.append((0, args.threads))
  print(
    f"\n{args.batch} x {args.frames} frames (stride {args.stride}) -> "
    f"{args.size}x{args.size} per batch, {args.batches} batches, "
    f"{psutil.cpu_count()} CPUs\n"
  )
  print(
    f"{'workers':>7} {'threads':>7} {SPEED_HEADER}"
    + (f" {'waiting':>8}" if args.consumer_clips_per_s else "")
  )
  results = {}
  for workers, threads in settings:
    config.data.workers, config.data.threads = workers, threads
    results[(workers, threads)] = run(
      config, mesh, args.batch, args.batches, 0.0
    )
    if args.consumer_clips_per_s:
      results[(workers, threads)]["wait_share"] = run(
        config, mesh, args.batch, args.batches, args.consumer_clips_per_s
      )["wait_share"]
  one = results.get((1, 0), {}).get("clips_per_s")
  for (workers, threads), r in results.items():
    wait = f" {r['wait_share']:8.0%}" if args.consumer_clips_per_s else ""
    print(f"{workers:7d} {threads:7d} {speed_cells(r, one)}{wait}")
  if args.consumer_clips_per_s:
    print(
      f"\nwaiting: share of a training loop's time spent waiting for data "
      f"when each step consumes {args.batch} clips at "
      f"{args.consumer_clips_per_s:g} clips/s"
    )
  if args.memory_clips:
    config.data.workers, config.data.threads = 2, 0
    before, after = memory(config, mesh, args.batch, args.memory_clips)
    print(
      f"\nhost RSS (main + 2 workers) over {args.memory_clips} clips: "
      f"{before:.0f} MB -> {after:.0f} MB ({after - before:+.0f} MB)"
    )


if __name__ == "__main__":
  main()
