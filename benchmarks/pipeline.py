"""What feeds a GPU: the whole input pipeline against `read_clip` alone.

    python -m benchmarks.pipeline [--smoke] [--clips 768] [--seconds 60]
        [--workers 0,1,2 --threads 2 [--consumer-clips-per-s R]
         [--memory-clips N]]

On the loader benchmark's real footage (`benchmarks.footage`, chunked at
the chunker's defaults and with `--profile sparse`, reused if present), with
random clip records, it prints per CPU-second (the CPU time of the main
process and its workers, so load from other processes counts little):

- clips of the whole pipeline (1 Grain worker, shared memory, batching,
  the transfer thread, device arrays) and of `read_clip` alone (the CPU
  time of its calls, timed in the worker as it runs them:
  `benchmarks.timed_reads`), and their ratio, for AVION's 4-frame clips
  (one frame in each of 4 segments of 2 s), VideoMAE's 16x4 clips (16
  frames, stride 4) and UMT's 8 sparse frames, all to 224x224;
- views with `data.repeats=4` against 1 (16x4: the host decodes a quarter
  of the clips, each its canvas; the views are made on the device);
- a worker's start-up: seconds to the first batch, its memory (RSS) and
  whether jax is loaded in it, starting lean (`vidjax.data.lean_worker`)
  and as Grain would (the trainer's main module);
- the sparse chunk profile against the defaults: decoded frames per
  delivered frame, 4-frame clips per CPU-second, MB per minute of video;
- the cores needed to feed 900 and 1,800 AVION clips/s, VideoMAE at
  ~1,860 clips/s (an H200's rate, masked 90 %) and UMT's 8 sparse frames
  (one from each of 8 segments of a 10 s clip, default and sparse chunks)
  at ~836 (VideoMAE's TFLOP/s), from the measured rates;
- the training order's cost per clip, Grain's `MapDataset.shuffle` against
  `order.EpochShuffle`, from 12 records to 1M.

`--workers 0,1,2` adds the older table: clips/s by number of workers and
threads, cores busy, and with `--consumer-clips-per-s R` the share of a
simulated training loop's time spent waiting; `--memory-clips N` the host
RSS growth over N clips through 2 workers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
import statistics
import tempfile
import time

import grain
import jax
import ml_collections
import numpy as np

try:  # Not a dependency of vidjax: the `[bench]` extra brings it.
  import psutil
except ModuleNotFoundError:
  psutil = None

from benchmarks import (
  SMOKE_HELP,
  SMOKE_NOTE,
  device_batch,
  footage,
  timed_reads,
)
from vidjax import sharding
from vidjax.config import defaults
from vidjax.data import (
  annotations,
  chunk,
  loader,
  order,
  pipeline,
  video,
  workers as workers_lib,
)

# Records in the benchmarks' lists: a real data set's count (K400 has
# 240k, Ego4D's clips 4M).
NUM_RECORDS = 20_000


def write_records(
  store: Path,
  video_id: str,
  path: Path,
  num_clips: int = NUM_RECORDS,
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
  batch = device_batch(batch)
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
  records = write_records(store, video_id, work / "pipeline_clips.jsonl")
  config = data_config(store, records, frames, stride, size)
  mesh = sharding.make_mesh()
  batch = device_batch(batch)
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
  batch = device_batch(batch)
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


# ------------------------------------------- per CPU-second, and sizing ----

# Clip shapes: (data keys, seconds per record).
SHAPES = {
  "4-frame": (dict(num_frames=4, sampling="segment"), 2.0),
  "16x4": (dict(num_frames=16, sampling="stride", stride=4), 4.0),
  # UMT's: one frame from each of 8 segments of a whole Kinetics clip.
  "8-sparse": (dict(num_frames=8, sampling="segment"), 10.0),
}
# The shapes measured on the sparse chunk profile too.
SPARSE_SHAPES = ("4-frame", "8-sparse")
TARGETS = (900, 1800)  # AVION ViT-B clips/s on an H200: unmasked, 50 % masked.
VIDEOMAE_RATE = 1860  # VideoMAE ViT-B 16x4 clips/s on an H200, 90 % masked.
# UMT ViT-B 8-frame clips/s on an H200 at VideoMAE's TFLOP/s: 1860 x 212.6
# / 472.9 GFLOP per training clip (`vidjax.models.flops`; the frozen
# teacher's forward is 61% of UMT's).
UMT_RATE = 836
# Batches before the count starts: the worker's start, and the /dev/shm
# blocks and batch arrays the pipeline then reuses made (as many as it has
# in flight at once: a few batches' worth).
WARM_BATCHES = 6


def shape_config(store: Path, work: Path, video_id: str, shape: str):
  """The data config of a clip shape on `store` (its own clip records)."""
  keys, seconds = SHAPES[shape]
  records = write_records(
    store, video_id, work / f"clips_{store.name}_{shape}.jsonl", seconds=seconds
  )
  config = data_config(store, records, keys["num_frames"], 4, 224)
  config.data.update(keys)
  return config


def _steps(batch: int, clips: int, repeats: int = 1) -> int:
  """Batches of `batch` views counted for `clips` clips (at least one)."""
  return max(1, clips * repeats // batch)


def pipeline_rate(config, batch: int, clips: int, repeats: int = 1) -> dict:
  """The whole pipeline with 1 worker, after `WARM_BATCHES`: clips and
  views per CPU-second of the main process and the worker; and, of the
  same stretch, `read_clip`'s own clips per CPU-second and decoded frames
  per delivered frame, timed in the worker (`benchmarks.timed_reads`)."""
  config = config.copy_and_resolve_references()
  config.data.update(workers=1, threads=0, repeats=repeats)
  batch = device_batch(batch)
  proc = psutil.Process()
  with tempfile.TemporaryDirectory() as folder:
    pipe = pipeline.make_pipeline(
      config,
      sharding.make_mesh(),
      train=True,
      batch_size=batch,
      read_clip=timed_reads.TimedReadClip(folder),
    )
    try:
      for _ in range(WARM_BATCHES):
        jax.block_until_ready(next(pipe)["video"])
      steps = _steps(batch, clips, repeats)
      cpu0, reads0 = cpu_seconds(proc), timed_reads.totals(folder)
      for _ in range(steps):
        jax.block_until_ready(next(pipe)["video"])
      cpu = cpu_seconds(proc) - cpu0
      reads = timed_reads.totals(folder) - reads0
    finally:
      pipe.close()
  return {
    "clips_per_cpu_s": steps * batch / repeats / cpu,
    "views_per_cpu_s": steps * batch / cpu,
    "read_clips_per_cpu_s": reads.clips / reads.cpu_s,
    "decoded_per_delivered": reads.decoded / reads.delivered,
  }


def _workers_of(proc: psutil.Process) -> list[psutil.Process]:
  """Grain's worker processes among `proc`'s children."""
  return [
    p
    for p in proc.children(recursive=True)
    if "spawn_main" in " ".join(p.cmdline())
  ]


def worker_start(config, lean: bool) -> dict:
  """One worker's start: seconds to the first batch, then its RSS (MB),
  CPU seconds and whether jaxlib is mapped in it."""
  config = config.copy_and_resolve_references()
  config.data.update(workers=1, threads=0)
  workers_lib.LEAN = lean
  try:
    t0 = time.perf_counter()
    pipe = pipeline.make_pipeline(
      config, sharding.make_mesh(), train=True, batch_size=device_batch(4)
    )
    jax.block_until_ready(next(pipe)["video"])
    seconds = time.perf_counter() - t0
    (worker,) = _workers_of(psutil.Process())
    times = worker.cpu_times()
    with open(f"/proc/{worker.pid}/maps") as f:
      jax_loaded = "jaxlib" in f.read()
    out = {
      "seconds": seconds,
      "rss_mb": worker.memory_info().rss / 2**20,
      "cpu_s": times.user + times.system,
      "jax": jax_loaded,
    }
    pipe.close()
  finally:
    workers_lib.LEAN = True
  return out


def shuffle_costs(sizes=(12, 100, 10_000, 1_000_000), lookups=2_000) -> None:
  """Prints microseconds a clip of the training order, Grain's shuffle
  against `order.EpochShuffle` (whose first epoch's permutation is
  counted), over the first `lookups` positions of one epoch."""
  print(f"training order, us a clip (the first {lookups} of an epoch)")
  print(f"{'records':>9} {'Grain shuffle':>14} {'EpochShuffle':>13}")
  for size in sizes:
    records = grain.MapDataset.range(size)
    n = min(size, lookups)
    row = []
    for ds in (
      records.shuffle(seed=0),
      order.EpochShuffle(records, seed=0),
    ):
      start = time.perf_counter()
      for i in range(n):
        ds[i]
      row.append((time.perf_counter() - start) / n * 1e6)
    print(f"{size:9d} {row[0]:14.1f} {row[1]:13.1f}")


def cores(rate_per_cpu_s: float, target: float) -> float:
  """Cores busy feeding `target` clips (or views) per second."""
  return target / rate_per_cpu_s


def in_turns(rounds: int, first, second) -> tuple[list, list]:
  """([first() results], [second() results]) of `rounds` rounds, the order
  swapped every round (AB, BA, AB, ...): a machine whose speed drifts
  during the run (clock, neighbours; 20 % over minutes on a shared VM)
  favours neither."""
  a, b = [], []
  for r in range(rounds):
    if r % 2:
      b.append(second())
      a.append(first())
    else:
      a.append(first())
      b.append(second())
  return a, b


def measure(config, batch: int, clips: int, rounds: int) -> dict:
  """`pipeline_rate` `rounds` times: the medians of its figures, and the
  median of the rounds' ratios of the pipeline's clips per CPU-second to
  `read_clip`'s."""
  runs = [pipeline_rate(config, batch, clips) for _ in range(rounds)]
  return {
    **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
    "ratio": statistics.median(
      r["clips_per_cpu_s"] / r["read_clips_per_cpu_s"] for r in runs
    ),
  }


def report(
  stores: dict, work: Path, video_id: str, clips: int, rounds: int = 4
) -> dict:
  """Measures and prints everything of the module docstring but the
  worker-scaling table; returns the figures."""
  out = {}
  print(
    f"\nper CPU-second ({clips} clips, median of {rounds} rounds; 1 worker "
    "for the pipeline)\n"
    f"{'clips':>8} {'chunks':>8} {'read_clip':>9} {'pipeline':>8} "
    f"{'ratio':>7} {'decoded/delivered':>17}"
  )
  for shape in SHAPES:
    for profile in (
      ("default", "sparse") if shape in SPARSE_SHAPES else ("default",)
    ):
      config = shape_config(stores[profile], work, video_id, shape)
      batch = 32 if shape == "4-frame" else 16
      m = out[(shape, profile)] = measure(config, batch, clips, rounds)
      print(
        f"{shape:>8} {profile:>8} {m['read_clips_per_cpu_s']:9.1f} "
        f"{m['clips_per_cpu_s']:8.1f} {m['ratio']:7.1%} "
        f"{m['decoded_per_delivered']:17.2f}",
        flush=True,
      )

  config = shape_config(stores["default"], work, video_id, "16x4")
  canvas = loader.canvas_size(config.data)
  ones, fours = in_turns(
    rounds,
    lambda: pipeline_rate(config, 16, clips)["views_per_cpu_s"],
    lambda: pipeline_rate(config, 32, clips, repeats=4)["views_per_cpu_s"],
  )
  one, four = statistics.median(ones), statistics.median(fours)
  ratio = statistics.median(f / o for o, f in zip(ones, fours))
  out["repeats"] = {1: one, 4: four, "ratio": ratio}
  print(
    f"\n16x4 views per CPU-second: repeats=1 {one:.1f} (224x224 clips), "
    f"repeats=4 {four:.1f} ({canvas[0]}x{canvas[1]} canvases): "
    f"{out['repeats']['ratio']:.2f}x"
  )

  print(
    f"\na worker's start (1 worker, 4-frame clips)\n"
    f"{'start':>16} {'first batch':>11} {'RSS':>8} {'CPU':>6} {'jax':>4}"
  )
  config = shape_config(stores["default"], work, video_id, "4-frame")
  for name, lean in (("lean", True), ("trainer's main", False)):
    w = out[f"worker_{name}"] = worker_start(config, lean)
    print(
      f"{name:>16} {w['seconds']:10.2f}s {w['rss_mb']:6.0f}MB "
      f"{w['cpu_s']:5.2f}s {'yes' if w['jax'] else 'no':>4}",
      flush=True,
    )

  sizes = {
    p: footage.store_mb_per_minute(s, video_id) for p, s in stores.items()
  }
  out["mb_per_minute"] = sizes
  print(
    "\nchunks: "
    + ", ".join(
      f"{p} ({footage.options_name(PROFILE_OPTIONS[p])}) {mb:.1f} MB/min"
      for p, mb in sizes.items()
    )
  )

  print(
    "\ncores needed (the pipeline's clips per CPU-second above)\n"
    f"{'recipe':<34} {'clips/s':>8} {'cores':>6}"
  )
  rows = []
  for profile in ("default", "sparse"):
    rate = out[("4-frame", profile)]["clips_per_cpu_s"]
    rows += [
      (f"AVION 4-frame, {profile} chunks", t, cores(rate, t)) for t in TARGETS
    ]
  rate16 = out[("16x4", "default")]["clips_per_cpu_s"]
  rows.append(("VideoMAE 16x4", VIDEOMAE_RATE, cores(rate16, VIDEOMAE_RATE)))
  rows.append(
    ("VideoMAE 16x4, repeats=4", VIDEOMAE_RATE, cores(four, VIDEOMAE_RATE))
  )
  for profile in ("default", "sparse"):
    rate = out[("8-sparse", profile)]["clips_per_cpu_s"]
    rows.append(
      (f"UMT 8 sparse, {profile} chunks", UMT_RATE, cores(rate, UMT_RATE))
    )
  for name, target, n in rows:
    print(f"{name:<34} {target:8d} {n:6.1f}")
  out["cores"] = rows
  return out


PROFILE_OPTIONS = {
  name: dataclasses.replace(chunk.ChunkOptions(), **settings)
  for name, settings in chunk.PROFILES.items()
}


def main(argv=None):
  p = argparse.ArgumentParser(
    prog="python -m benchmarks.pipeline",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
  p.add_argument(
    "--clips",
    type=int,
    default=768,
    help="clips per figure (the pipeline's count is off by up to the group "
    "a worker is decoding at each end: 24 batches keep that to a few per "
    "cent)",
  )
  p.add_argument("--rounds", type=int, default=4, help="rounds per figure")
  p.add_argument(
    "--workers",
    default="",
    help="comma-separated worker counts for the scaling table ('': skip)",
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
  args = p.parse_args(argv)
  if psutil is None:
    p.exit(
      2,
      f"{p.prog}: measures processes with psutil: pip install psutil "
      "(or 'vidjax[bench]')\n",
    )
  if args.smoke:
    args.seconds, args.clips, args.batches, args.rounds = 10, 8, 2, 1
    print(f"--smoke ({SMOKE_NOTE})", flush=True)
  work = Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  source = footage.prepare_source(work, args.seconds, 568, 320)
  stores = {
    name: footage.store_for(source, opts, work)
    for name, opts in PROFILE_OPTIONS.items()
  }
  print(
    f"real footage: {source} ({args.seconds:g} s), {psutil.cpu_count()} CPUs"
  )
  report(stores, work, source.stem, args.clips, args.rounds)
  shuffle_costs()
  if args.workers:
    scaling_table(stores["default"], source.stem, work, args)


def scaling_table(store: Path, video_id: str, work: Path, args) -> None:
  """clips/s by workers and threads (the module docstring's last part)."""
  records = write_records(store, video_id, work / "pipeline_clips.jsonl")
  config = data_config(store, records, args.frames, args.stride, args.size)
  mesh = sharding.make_mesh()
  args.batch = device_batch(args.batch)
  settings = [(int(w), 0) for w in args.workers.split(",")]
  if args.threads:
    settings.append((0, args.threads))
  print(
    f"\n{args.batch} x {args.frames} frames (stride {args.stride}) -> "
    f"{args.size}x{args.size} per batch, {args.batches} batches\n"
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
