"""One long video -> short constant-rate H.264 chunks, and its manifest entry.

`chunk_video(src, dst, video_id, opts)` writes `dst/<video_id>/<start_second>.mp4`
and returns the video's manifest entry (`video_id`, `fps`, `num_frames`,
`width`, `height`, `chunk_seconds`, plus `frame_rate` as an exact fraction,
the absolute `source` path and the `encoding` settings).

Why chunks: a clip then opens a small file and decodes from a keyframe a few
frames back, instead of seeking in an hour-long file with keyframes seconds
apart. Frame `i` of a video (on the constant-rate grid at `fps`) lives in
chunk `k = floor(i / fps / chunk_seconds)`, at local index
`i - ceil(k * chunk_seconds * fps)` (exact fractions; see `chunk_start_frames`).

Encoding defaults, chosen for decoding speed per byte on real footage
(`python -m benchmarks.loader --sweep`; the measured figures are in
BENCHMARKS.md, Chunk settings):
- `--tune fastdecode` (CAVLC instead of CABAC, no deblocking, no weighted
  prediction): decoding is most of the reader's time and CABAC its slowest
  part; a markedly faster `read_clip` for a little more disk.
- `--bframes 7` non-reference B-frames: the reader drops the packets of
  those no requested frame needs before the decoder, so only every 8th frame
  is on the reference chain: fewer decoded frames per delivered one than
  with 3 B-frames, for both dense and sparse clips, for slightly more disk.
- `--gop 32`, closed: a frame decodes from a keyframe at most 31 back; GOP
  16 costs more disk for no clear gain, 64 saves some for longer lead-ins.
- `--crf 23 --preset veryfast --short-side 288`: x264's default quality at
  AVION's resolution (~38 dB at 224x224 against the source).
Together clearly faster to read than the previous defaults (`--bframes 3
--tune ''`) for somewhat more disk. Chunks are yuv420p,
BT.601 limited range; the manifest records each video's encoding, and
`read_clip` reads any H.264 chunks (older stores included).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
import dataclasses
import fractions
import math
import os
from pathlib import Path
import shutil

import av
import numpy as np

from vidjax.base import errors

# Encoder settings per kind of clip (`--profile`), over `ChunkOptions`'.
PROFILES = {"default": {}, "sparse": {"gop": 2, "bframes": 0}}


@dataclasses.dataclass(frozen=True)
class ChunkOptions:
  """How chunks are encoded. See the module docstring for the defaults' why."""

  chunk_seconds: float = 15
  short_side: int = 288  # 0 keeps the source resolution.
  fps: float | None = None  # None keeps the source's average rate.
  gop: int = 32
  bframes: int = 7
  crf: int = 23
  preset: str = "veryfast"
  tune: str = "fastdecode"
  x264_params: str = ""  # Extra x264 options, "key=value:key=value".
  # Threads of each video's decoder and of its encoder; 0: FFmpeg's choice
  # (chunk_videos gives each worker its share of the cores).
  threads: int = 0

  def __post_init__(self):
    # A chunk of no length never ends: readers would loop forever.
    if not (math.isfinite(self.chunk_seconds) and self.chunk_seconds > 0):
      raise errors.ConfigError(
        f"chunk_seconds (--chunk-seconds) must be a "
        f"positive number, not {self.chunk_seconds}"
      )
    if self.fps is not None and not (math.isfinite(self.fps) and self.fps > 0):
      raise errors.ConfigError(
        f"fps (--fps) must be positive (or unset: the "
        f"source's rate), not {self.fps}"
      )


class ChunkError(Exception):
  """A source video could not be chunked; the message names file and reason."""


def chunk_start_frames(
  num_frames: int, fps: fractions.Fraction, chunk_seconds: float
) -> list[int]:
  """First global frame index of every chunk: `ceil(k * chunk_seconds * fps)`.

  Args:
    num_frames: frames in the video on the constant-rate grid.
    fps: exact frame rate.
    chunk_seconds: nominal chunk length in seconds.

  Returns:
    Increasing start indices, the first one 0; chunk k holds frames
    `[starts[k], starts[k+1])` (the last one up to `num_frames`).
  """
  step = _seconds(chunk_seconds) * fps
  if step <= 0:
    raise ValueError(
      f"chunk_seconds {chunk_seconds} and fps {fps} must be positive"
    )
  starts, k = [], 0
  while (start := math.ceil(k * step)) < max(num_frames, 1):
    starts.append(start)
    k += 1
  return starts


def chunk_name(k: int, chunk_seconds: float) -> str:
  """File name of chunk k: its start second, e.g. `0.mp4`, `15.mp4`, `7.5.mp4`."""
  start = _seconds(chunk_seconds) * k
  return f"{int(start) if start.denominator == 1 else float(start)}.mp4"


def _seconds(chunk_seconds: float) -> fractions.Fraction:
  # Through str so that 0.1 means 1/10, not the nearest binary fraction.
  return fractions.Fraction(str(chunk_seconds))


def output_size(width: int, height: int, short_side: int) -> tuple[int, int]:
  """(width, height) with the short side scaled to `short_side`, both even."""
  if short_side <= 0:  # Keep the size: drop an odd last row/column.
    return max(2, width // 2 * 2), max(2, height // 2 * 2)
  scale = short_side / min(width, height)
  return (
    max(2, round(width * scale / 2) * 2),
    max(2, round(height * scale / 2) * 2),
  )


def _source_frames(container, stream) -> Iterator[tuple[float, av.VideoFrame]]:
  """Decoded frames with their time in seconds from the stream's start."""
  start = stream.start_time or 0
  tb = float(stream.time_base)
  last = None
  for frame in container.decode(stream):
    if frame.pts is not None:
      t = (frame.pts - start) * tb
    else:  # No timestamp: assume the nominal rate after the previous frame.
      t = 0.0 if last is None else last + 1 / float(stream.average_rate or 30)
    if last is not None and t <= last:  # Drop duplicates/out-of-order stamps.
      continue
    last = t
    yield t, frame


def _constant_rate(
  frames: Iterable[tuple[float, av.VideoFrame]],
  fps: fractions.Fraction,
  source_rate: float,
) -> Iterator[av.VideoFrame]:
  """Places frames on the grid t_i = i / fps: output i shows the source frame
  nearest to t_i (ties to the earlier), duplicating or dropping as needed.

  The last source frame also takes the grid times up to half a frame after
  its own (half the shorter of a source and an output frame): coarse
  timestamps, such as MKV's milliseconds, can put it just before its grid
  time, and it must not be lost.
  """
  tail = 0.5 / max(float(fps), source_rate)
  # Grid times as floats (integer division, correctly rounded): Fraction
  # arithmetic per frame was a few % of the chunker's time.
  den, num = fps.denominator, fps.numerator
  i, prev = 0, None
  for t, frame in frames:
    if prev is not None:
      midpoint = (prev[0] + t) / 2
      while i * den / num <= midpoint + 1e-9:
        yield prev[1]
        i += 1
    prev = (t, frame)
  if prev is not None:
    while i * den / num <= prev[0] + tail or i == 0:
      yield prev[1]
      i += 1


_REFORMAT = av.video.reformatter


def _upright(
  frame: av.VideoFrame, width: int, height: int, rotation: int
) -> av.VideoFrame:
  """Scales to (width, height) of the *displayed* picture, yuv420p, upright.

  Colours are converted to BT.601 limited range, what an untagged H.264
  stream means and what the reader assumes: HD sources tagged BT.709 (or
  full-range ones) would otherwise come back with shifted colours.
  `rotation` is the display matrix's counter-clockwise angle (PyAV/FFmpeg).
  """
  quarter = (round(rotation / 90)) % 4
  stored = (height, width) if quarter % 2 else (width, height)
  out = frame.reformat(
    width=stored[0],
    height=stored[1],
    format="yuv420p",
    dst_colorspace=_REFORMAT.Colorspace.ITU601,
    dst_color_range=_REFORMAT.ColorRange.MPEG,
  )
  if not quarter:
    return out
  planes = yuv_planes(out)
  rotated = [np.ascontiguousarray(np.rot90(p, quarter)) for p in planes]
  return yuv_frame(*rotated)


def yuv_planes(frame: av.VideoFrame) -> list[np.ndarray]:
  """Views of the Y, U, V planes of a yuv420p frame, without line padding."""
  out = []
  for plane in frame.planes:
    rows = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)
    out.append(rows[:, : plane.width])
  return out


def yuv_frame(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> av.VideoFrame:
  """A yuv420p frame from uint8 planes Y [H, W], U and V [H/2, W/2]."""
  h, w = y.shape
  flat = np.concatenate([y.ravel(), u.ravel(), v.ravel()]).reshape(-1, w)
  return av.VideoFrame.from_ndarray(flat, format="yuv420p")


class _ChunkWriter:
  """Writes one chunk to a temporary name; `close()` renames it into place."""

  def __init__(
    self,
    path: Path,
    width: int,
    height: int,
    fps: fractions.Fraction,
    opts: ChunkOptions,
  ):
    self.path, self.tmp = path, path.with_name(path.stem + ".tmp.mp4")
    self.container = av.open(str(self.tmp), "w")
    self.stream = self.container.add_stream("libx264", rate=fps)
    self.stream.width, self.stream.height = width, height
    self.stream.pix_fmt = "yuv420p"
    self.stream.codec_context.time_base = 1 / fps
    self.stream.codec_context.thread_count = opts.threads
    params = (
      f"keyint={opts.gop}:min-keyint={opts.gop}:scenecut=0:"
      f"bframes={opts.bframes}:b-adapt=0:b-pyramid=none:open-gop=0"
    )
    options = {
      "crf": str(opts.crf),
      "preset": opts.preset,
      "x264-params": params
      + (f":{opts.x264_params}" if opts.x264_params else ""),
    }
    if opts.tune:
      options["tune"] = opts.tune
    self.stream.codec_context.options = options
    self.count = 0

  def write(self, frame: av.VideoFrame):
    frame.pts, frame.time_base = self.count, self.stream.codec_context.time_base
    frame.pict_type = av.video.frame.PictureType.NONE
    self.container.mux(self.stream.encode(frame))
    self.count += 1

  def close(self):
    self.container.mux(self.stream.encode(None))
    self.container.close()
    os.replace(self.tmp, self.path)


def chunk_video(
  src: str | os.PathLike,
  dst: str | os.PathLike,
  video_id: str | None = None,
  opts: ChunkOptions = ChunkOptions(),
) -> dict:
  """Chunks one video into `dst/<video_id>/` and returns its manifest entry.

  Raises:
    ChunkError: the file is missing, not a video, or undecodable/truncated.
  """
  src = Path(src)
  video_id = video_id or src.stem
  out_dir = Path(dst) / video_id
  try:
    container = av.open(str(src))
  except av.error.InvalidDataError as e:
    raise ChunkError(
      f"{src}: "
      + (
        "empty file (0 bytes)"
        if src.stat().st_size == 0
        else "not a video (no format FFmpeg knows)"
      )
    ) from e
  except (av.error.FFmpegError, OSError) as e:
    raise ChunkError(f"{src}: cannot open: {e.strerror or e}") from e
  with container:
    if not container.streams.video:
      raise ChunkError(f"{src}: no video stream (audio-only or not a video)")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    stream.codec_context.thread_count = opts.threads
    fps = (
      fractions.Fraction(opts.fps).limit_denominator(1001)
      if opts.fps
      else (stream.average_rate or stream.guessed_rate)
    )
    if not fps or fps <= 0:
      raise ChunkError(f"{src}: unknown frame rate; pass --fps")
    fps = fractions.Fraction(fps)
    source_rate = float(stream.average_rate or stream.guessed_rate or fps)
    if out_dir.exists():  # Leftovers of an interrupted run: start over.
      shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    step = _seconds(opts.chunk_seconds) * fps
    writer, size, num_frames, next_start, k = None, None, 0, 0, 0
    try:
      for frame in _constant_rate(
        _source_frames(container, stream), fps, source_rate
      ):
        if size is None:
          rotation = int(frame.rotation or 0)
          w, h = (
            (frame.height, frame.width)
            if round(rotation / 90) % 2
            else (frame.width, frame.height)
          )
          size = output_size(w, h, opts.short_side)
        if num_frames == next_start:  # First frame of chunk k.
          if writer:
            writer.close()
          writer = _ChunkWriter(
            out_dir / chunk_name(k, opts.chunk_seconds), *size, fps, opts
          )
          k += 1
          next_start = math.ceil(k * step)
        writer.write(_upright(frame, *size, rotation))
        num_frames += 1
    except av.error.FFmpegError as e:
      raise ChunkError(
        f"{src}: decoding failed at frame {num_frames}: {e}"
      ) from e
    if writer:
      writer.close()
    if not num_frames:
      raise ChunkError(f"{src}: no decodable video frames")
    expected = (
      float(container.duration) / av.time_base if container.duration else None
    )
    if expected and num_frames / fps < 0.9 * expected - 1:
      raise ChunkError(
        f"{src}: truncated: decoded {float(num_frames / fps):.1f}"
        f" s of {expected:.1f} s"
      )
  return {
    "video_id": video_id,
    "fps": float(fps),
    "frame_rate": str(fps),
    "num_frames": num_frames,
    "width": size[0],
    "height": size[1],
    "chunk_seconds": opts.chunk_seconds,
    "source": os.path.abspath(src),
    "encoding": encoding(opts),
  }


def encoding(opts: ChunkOptions) -> dict:
  """How chunks were encoded, as recorded in the manifest (for the record
  only: reading a store never depends on it)."""
  return {
    "codec": "h264",
    "gop": opts.gop,
    "bframes": opts.bframes,
    "crf": opts.crf,
    "preset": opts.preset,
    "tune": opts.tune,
    "x264_params": opts.x264_params,
    "short_side": opts.short_side,
  }
