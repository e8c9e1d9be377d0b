"""Clip loading speed: the naive way vs chunks vs vidjax's fused `read_clip`.

    python -m vidjax.bench.loader [--clips 200] [--frames 16] [--stride 4]
        [--size 224] [--minutes 3] [--src-width 568 --src-height 320]
        [--src-gop 250] [--video PATH] [--sweep]

Makes (or takes) a long video encoded as cameras and datasets are (x264's
default keyframe interval of 250), chunks it with the chunker's defaults,
then loads the SAME random clips and crops three ways, each in a fresh process
with one thread:

  naive        seek in the unchunked video, decode every frame from the
               keyframe, whole frames to RGB, crop + resize with OpenCV (what a
               typical PyTorch loader does);
  chunked      the same on the chunk files (no fused crop, no packet dropping);
  read_clip    vidjax: chunks, unneeded packets dropped, crop before scale.

It prints clips/s, decoded frames per delivered frame and peak RSS for each,
and the speed-ups. `--sweep` also chunks with other keyframe intervals and
B-frame counts and prints size and `read_clip` speed for each (how the
chunker's defaults were chosen).
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import multiprocessing
import os
import resource
import tempfile
import time
from pathlib import Path

import av
import numpy as np

from vidjax.data import chunk, crop as crop_lib, video


def make_source(path: Path, minutes: float, width: int, height: int,
                fps: int, gop: int) -> None:
  """A long camera-like video: a slow pan over a texture plus moving blobs."""
  import cv2  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  base = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
  texture = cv2.resize(base, (width * 2, height * 2),
                       interpolation=cv2.INTER_CUBIC)  # Smooth, 2x the view.
  num_frames = int(minutes * 60 * fps)
  with av.open(str(path), "w") as out:
    stream = out.add_stream("libx264", rate=fps)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.codec_context.options = {"g": str(gop), "crf": "23",
                                    "preset": "veryfast"}
    for k in range(num_frames):
      t = k / fps
      x = int((np.sin(t / 7) + 1) / 2 * width)
      y = int((np.cos(t / 11) + 1) / 2 * height)
      img = texture[y:y + height, x:x + width].copy()
      cx, cy = int((t * 40) % width), int(height / 2 + height / 3 * np.sin(t))
      img[max(cy - 20, 0):cy + 20, max(cx - 20, 0):cx + 20] = (255, 40, 40)
      frame = av.VideoFrame.from_ndarray(img, format="rgb24")
      frame.pts = k
      out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def sample_clips(num_clips: int, num_frames: int, frames: int, stride: int,
                 seed: int) -> list[tuple[np.ndarray, tuple[float, ...]]]:
  """Random clips: frame ids and a crop as fractions of the frame (x, y, w, h).

  AVION's training crop: random-resized with scale (0.5, 1).
  """
  rng = np.random.default_rng(seed)
  span = (frames - 1) * stride + 1
  clips = []
  for _ in range(num_clips):
    start = int(rng.integers(0, num_frames - span))
    box = crop_lib.random_resized_crop(rng, 10_000, 10_000, scale=(0.5, 1.0))
    clips.append((start + stride * np.arange(frames),
                  (box.x / 1e4, box.y / 1e4, box.w / 1e4, box.h / 1e4)))
  return clips


def _pixels(fraction_box, width, height):
  x, y, w, h = fraction_box
  return (int(x * width), int(y * height), max(2, int(w * width)),
          max(2, int(h * height)))


def decode_then_crop(path: str, ids: np.ndarray, box, size: int,
                     stats: video.DecodeStats) -> list[np.ndarray]:
  """The baseline: seek, decode every frame up to the last id, whole frames to
  RGB, then crop and resize (OpenCV, bilinear)."""
  import cv2  # pylint: disable=import-outside-toplevel
  out = {}
  with av.open(path) as container:
    stream = container.streams.video[0]
    stream.codec_context.thread_count = 1
    tb, start = stream.time_base, stream.start_time or 0
    rate = stream.average_rate
    first, last, wanted = int(ids.min()), int(ids.max()), set(ids.tolist())
    # A few frames early: the mp4 index is by decode time.
    container.seek(max(start, int(start + (first - 4) / rate / tb)),
                   stream=stream, backward=True)
    for frame in container.decode(stream):
      stats.decoded += 1
      j = round((frame.pts - start) * tb * rate)
      if j in wanted:
        rgb = frame.to_ndarray(format="rgb24")
        x, y, w, h = _pixels(box, frame.width, frame.height)
        out[j] = cv2.resize(rgb[y:y + h, x:x + w], (size, size),
                            interpolation=cv2.INTER_LINEAR)
      if j >= last:
        break
  stats.delivered += len(ids)
  return [out[i] for i in ids.tolist()]


def _run(method: str, clips, source: str, store: str, size: int) -> dict:
  """Loads all clips one way; runs in a fresh single-threaded process."""
  import cv2  # pylint: disable=import-outside-toplevel
  cv2.setNumThreads(1)
  stats = video.DecodeStats()
  info = video.video_info(store, Path(source).stem)
  starts = info.chunk_starts
  bounds = list(starts) + [info.num_frames]
  t0 = time.perf_counter()
  for ids, box in clips:
    if method == "naive":
      decode_then_crop(source, ids, box, size, stats)
    elif method == "chunked":
      for k in sorted(set(np.searchsorted(starts, ids, side="right") - 1)):
        local = ids[(ids >= bounds[k]) & (ids < bounds[k + 1])]
        path = os.path.join(store, info.video_id,
                            chunk.chunk_name(k, info.chunk_seconds))
        decode_then_crop(path, local - starts[k], box, size, stats)
    else:
      video.read_clip(store, info.video_id, ids,
                      crop=_pixels(box, info.width, info.height),
                      size=(size, size), stats=stats)
  seconds = time.perf_counter() - t0
  return {"method": method, "clips_per_s": len(clips) / seconds,
          "decoded_per_delivered": stats.decoded / stats.delivered,
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(method, clips, source, store, size) -> dict:
  ctx = multiprocessing.get_context("spawn")
  with futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
    return pool.submit(_run, method, clips, source, store, size).result()


def main(argv=None):
  p = argparse.ArgumentParser(prog="python -m vidjax.bench.loader",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--clips", type=int, default=200)
  p.add_argument("--frames", type=int, default=16)
  p.add_argument("--stride", type=int, default=4)
  p.add_argument("--size", type=int, default=224, help="output side")
  p.add_argument("--video", help="use this video instead of making one")
  p.add_argument("--minutes", type=float, default=3.0)
  p.add_argument("--src-width", type=int, default=568)
  p.add_argument("--src-height", type=int, default=320)
  p.add_argument("--src-gop", type=int, default=250)
  p.add_argument("--fps", type=int, default=30)
  p.add_argument("--gop", type=int, default=chunk.ChunkOptions.gop)
  p.add_argument("--bframes", type=int, default=chunk.ChunkOptions.bframes)
  p.add_argument("--short-side", type=int, default=chunk.ChunkOptions.short_side)
  p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(),
                                                   "vidjax_bench_loader"))
  p.add_argument("--sweep", action="store_true",
                 help="also measure other --gop/--bframes chunk settings")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)

  work = Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  if args.video:
    source = Path(args.video)
  else:
    source = work / (f"long_{args.src_width}x{args.src_height}_{args.minutes:g}"
                     f"min_gop{args.src_gop}.mp4")
    if not source.exists():
      print(f"making a {args.minutes:g}-minute {args.src_width}x"
            f"{args.src_height} video (GOP {args.src_gop}) at {source} ...")
      make_source(source, args.minutes, args.src_width, args.src_height,
                  args.fps, args.src_gop)

  def store_for(gop, bframes):
    store = work / f"chunks_{source.stem}_gop{gop}_b{bframes}_s{args.short_side}"
    opts = chunk.ChunkOptions(gop=gop, bframes=bframes,
                              short_side=args.short_side)
    summary = chunk.chunk_videos(source, store, opts)
    if summary["failed"]:
      raise SystemExit(f"chunking failed: {summary['failed']}")
    return store

  store = store_for(args.gop, args.bframes)
  info = video.video_info(store, source.stem)
  clips = sample_clips(args.clips, info.num_frames, args.frames, args.stride,
                       args.seed)
  print(f"\n{args.clips} clips of {args.frames} frames at stride {args.stride}"
        f" -> {args.size}x{args.size}; source {source.name}; chunks "
        f"{info.width}x{info.height}, GOP {args.gop}, {args.bframes} B-frames; "
        "one process, one thread each\n")
  rows = [measure(m, clips, str(source), str(store), args.size)
          for m in ("naive", "chunked", "read_clip")]
  print(f"{'method':<10} {'clips/s':>8} {'decoded/delivered':>18} "
        f"{'peak RSS MB':>12}")
  for r in rows:
    print(f"{r['method']:<10} {r['clips_per_s']:8.1f} "
          f"{r['decoded_per_delivered']:18.2f} {r['peak_rss_mb']:12.0f}")
  naive, chunked, fused = rows
  print(f"\nread_clip / naive:   {fused['clips_per_s'] / naive['clips_per_s']:.2f}x")
  print(f"read_clip / chunked: {fused['clips_per_s'] / chunked['clips_per_s']:.2f}x")
  results = {"config": vars(args), "results": rows}

  if args.sweep:
    print(f"\nchunk settings (read_clip, same clips):\n{'gop':>4} {'bframes':>7}"
          f" {'MB/min':>7} {'clips/s':>8} {'decoded/delivered':>18}")
    results["sweep"] = []
    minutes = info.num_frames / float(info.frame_rate) / 60
    for gop, bframes in ((1, 0), (8, 0), (16, 0), (16, 3), (32, 3), (64, 3),
                         (32, 7), (64, 7)):
      s = store_for(gop, bframes)
      mb = sum(f.stat().st_size for f in (s / source.stem).iterdir()) / 2**20
      r = measure("read_clip", clips, str(source), str(s), args.size)
      r.update(gop=gop, bframes=bframes, mb_per_min=mb / minutes)
      results["sweep"].append(r)
      print(f"{gop:4d} {bframes:7d} {r['mb_per_min']:7.2f} "
            f"{r['clips_per_s']:8.1f} {r['decoded_per_delivered']:18.2f}")
  (work / "results.json").write_text(json.dumps(results, indent=1))
  print(f"\nwritten {work / 'results.json'}")


if __name__ == "__main__":
  main()
