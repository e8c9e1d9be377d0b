"""What two of `read_clip`'s steps cost, against the obvious way to do them.

    python -m benchmarks.loader    (prints this table too)

On the chunk files and decoded frames of one store, one thread:

  open     `av.open` as is (FFmpeg's stream probing decodes the first frame
           with a decoder of its own) against `read_clip`'s options, which
           skip that probe decode;
  convert  a crop of a decoded 4:2:0 frame to RGB at the output size: one
           swscale pass (scale + convert to packed RGB, which swscale does in
           plain C) against `read_clip`'s two passes (scale as planar YUV,
           then convert unscaled, both with SIMD code). Both are compared
           with the crop cut from the frame's RGB and resized by OpenCV
           (INTER_AREA): PSNR in dB.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
import time

import av
import numpy as np

from benchmarks import footage
from vidjax.data import chunk, video


def _cpu_ms(fn, items, repeats: int = 3) -> float:
  """Best-of-`repeats` CPU milliseconds per item."""
  best = float("inf")
  for _ in range(repeats):
    t0 = time.process_time()
    for item in items:
      fn(item)
    best = min(best, (time.process_time() - t0) / len(items) * 1e3)
  return best


def one_pass(frame: av.VideoFrame, window, size: int) -> np.ndarray:
  """The crop copied out, then one swscale pass to RGB at size x size."""
  x, y, w, h = window
  planes = chunk.yuv_planes(frame)
  cropped = chunk.yuv_frame(
    planes[0][y : y + h, x : x + w],
    *(p[y // 2 : (y + h) // 2, x // 2 : (x + w) // 2] for p in planes[1:]),
  )
  return cropped.reformat(
    width=size, height=size, format="rgb24", threads=1
  ).to_ndarray()


def measure(store: Path, video_id: str, clips, size: int = 224) -> dict:
  """Per-open and per-frame CPU milliseconds (and PSNR) of both ways."""
  info = video.video_info(store, video_id)
  files = sorted(str(p) for p in (store / video_id).glob("*.mp4"))

  def open_plain(path):
    with av.open(path) as container:
      next(container.demux(container.streams.video[0]))

  def open_fast(path):
    with av.open(path, **video.OPEN_OPTIONS) as container:
      next(container.demux(container.streams.video[0]))

  frames = []  # (decoded frame, crop window) pairs from the clips' crops.
  with av.open(files[0]) as container:
    decoded = [f for _, f in zip(range(len(clips)), container.decode(video=0))]
  for frame, (_, box) in zip(decoded, clips):
    window = video.even_window(
      footage.pixels(box, info.width, info.height), info.width, info.height
    )
    frames.append((frame, window))
  out_wh = (size, size)
  results = {
    "open_ms": {
      "av.open": _cpu_ms(open_plain, files * 10),
      "read_clip": _cpu_ms(open_fast, files * 10),
    },
    "convert_ms": {
      "one pass": _cpu_ms(lambda fw: one_pass(*fw, size), frames),
      "read_clip": _cpu_ms(lambda fw: video.crop_to_rgb(*fw, out_wh), frames),
    },
  }
  if importlib.util.find_spec("cv2"):

    def score(convert):
      return float(
        np.mean(
          [
            footage.psnr(
              convert(f, w),
              footage.reference_crop(f.to_ndarray(format="rgb24"), w, size),
            )
            for f, w in frames
          ]
        )
      )

    results["convert_psnr_db"] = {
      "one pass": score(lambda f, w: one_pass(f, w, size)),
      "read_clip": score(lambda f, w: video.crop_to_rgb(f, w, out_wh)),
    }
  return results


def report(results: dict) -> None:
  opens, conv = results["open_ms"], results["convert_ms"]
  psnr = results.get("convert_psnr_db", {})
  print(
    f"\nread_clip's steps (CPU ms, one thread)\n"
    f"open a chunk:        av.open {opens['av.open']:.2f}, read_clip "
    f"{opens['read_clip']:.2f} ({opens['av.open'] / opens['read_clip']:.1f}x)"
    f"\ncrop -> RGB, frame:  one pass {conv['one pass']:.3f}, read_clip "
    f"{conv['read_clip']:.3f} ({conv['one pass'] / conv['read_clip']:.1f}x)"
    + (
      f"; PSNR vs OpenCV {psnr['one pass']:.1f} / {psnr['read_clip']:.1f} dB"
      if psnr
      else ""
    )
  )
