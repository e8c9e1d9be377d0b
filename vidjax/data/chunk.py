"""Long videos -> short constant-rate H.264 chunks + a manifest.

    python -m vidjax.data.chunk SRC DST [--chunk-seconds 15] [--short-side 288]
        [--fps N] [--gop 32] [--bframes 7] [--crf 23] [--preset veryfast]
        [--tune fastdecode] [--x264-params K=V:...] [--workers N]
        [--profile default|sparse]

writes `DST/<video_id>/<start_second>.mp4` and one line per finished video in
`DST/manifest.jsonl` (`video_id`, `fps`, `num_frames`, `width`, `height`,
`chunk_seconds`, plus `frame_rate` as an exact fraction, the absolute
`source` path and the `encoding` settings). Videos that fail are listed with
the reason in `DST/errors.jsonl`; the others go on (also when one crashes its
worker process). Re-running skips the videos already in the manifest.

Why chunks: a clip then opens a small file and decodes from a keyframe a few
frames back, instead of seeking in an hour-long file with keyframes seconds
apart. Frame `i` of a video (on the constant-rate grid at `fps`) lives in
chunk `k = floor(i / fps / chunk_seconds)`, at local index
`i - ceil(k * chunk_seconds * fps)` (exact fractions; see `chunk_start_frames`).

Encoding defaults, chosen for decoding speed per byte on real footage
(`python -m vidjax.bench.loader --sweep`; the measured figures are in
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

`--profile sparse` (`PROFILES`; explicit flags still win) is for recipes
whose clips take a few frames far apart, AVION's 4-frame pretraining clips:
such a frame decodes from its keyframe, so keyframes every 2 frames and no
B-frames (`--gop 2 --bframes 0`) decode 1.5 frames per delivered frame
instead of ~2.9, for about 3x the disk (`python -m vidjax.bench.pipeline`).
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Iterable, Iterator
import concurrent.futures as futures
from concurrent.futures.process import BrokenProcessPool
import dataclasses
import fractions
import json
import math
import multiprocessing
import os
from pathlib import Path
import shutil
import sys

from absl import logging
import av
import numpy as np
import tqdm

from vidjax import errors

VIDEO_EXTENSIONS = (
  ".mp4",
  ".mkv",
  ".mov",
  ".avi",
  ".webm",
  ".m4v",
  ".mpg",
  ".mpeg",
  ".flv",
  ".wmv",
  ".ts",
  ".3gp",
)
# Encoder settings per recipe kind (`--profile`), over `ChunkOptions`'.
PROFILES = {"default": {}, "sparse": {"gop": 2, "bframes": 0}}
MANIFEST = "manifest.jsonl"
ERRORS = "errors.jsonl"


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
  threads: int = 0  # x264 threads; 0 = auto.

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


def find_videos(src: str | os.PathLike) -> list[Path]:
  """Source videos: one file, a folder (searched recursively) or a list file.

  A `.txt` file lists one path per line (blank lines and `#` comments skipped).
  """
  src = Path(src)
  if src.is_dir():
    return sorted(
      p
      for p in src.rglob("*")
      if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS
    )
  if not src.is_file():
    raise errors.PathError(f"{src}: no such file or folder")
  if src.suffix.lower() == ".txt":
    lines = (line.strip() for line in src.read_text().splitlines())
    return [Path(line) for line in lines if line and not line.startswith("#")]
  return [src]


_TORN_SEEN: set[tuple[str, str]] = set()  # Torn lines warned about.


def manifest_lines(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
  """Yields `('FILE:LINE', entry)` for each entry of a manifest file.

  A last line without its newline that is not JSON is a line still being
  written (a chunker appending to a live store) or a killed run's: it is
  skipped, with a warning (once per process).

  Raises:
    errors.DataFileError: a line that is not a JSON object with a
      `video_id`.
  """
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().split("\n")
  except UnicodeDecodeError:
    raise errors.DataFileError(f"{path}: not a manifest (not text)") from None
  for lineno, line in enumerate(lines, 1):
    if line.strip():
      where = f"{os.fspath(path)}:{lineno}"
      try:
        entry = json.loads(line)
      except json.JSONDecodeError as e:
        if lineno == len(lines):  # No newline after it: not finished.
          if (where, line) not in _TORN_SEEN:
            _TORN_SEEN.add((where, line))
            logging.warning(
              "%s: skipped: the last line is incomplete (being "
              "written, or cut short by a killed chunker)",
              where,
            )
          continue
        raise errors.DataFileError(
          f"{where}: not JSON ({e.msg}): not a manifest line",
          hint="delete the line; chunking again redoes its video",
        ) from None
      if not isinstance(entry, dict) or not isinstance(
        entry.get("video_id"), str
      ):
        raise errors.DataFileError(
          f"{where}: not a manifest entry (a JSON object with a video_id)"
        )
      yield where, entry


def _end_last_line(path: Path) -> None:
  """Before appending: a finished last line gets its newline, a torn one
  (its video is redone) is cut off."""
  if not path.exists() or path.stat().st_size == 0:
    return
  data = path.read_bytes()
  if data.endswith(b"\n"):
    return
  try:
    json.loads(data[data.rfind(b"\n") + 1 :])
  except ValueError:
    with open(path, "r+b") as f:
      f.truncate(data.rfind(b"\n") + 1)
  else:
    with open(path, "ab") as f:
      f.write(b"\n")


def read_manifest(dst: str | os.PathLike) -> dict[str, dict]:
  """Manifest entries of the store `dst` by video id ({} when there is no
  manifest yet); raises as `manifest_lines`."""
  path = Path(dst) / MANIFEST
  if not path.exists():
    return {}
  return {entry["video_id"]: entry for _, entry in manifest_lines(path)}


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
  i, prev = 0, None
  for t, frame in frames:
    if prev is not None:
      midpoint = (prev[0] + t) / 2
      while i / fps <= midpoint + 1e-9:
        yield prev[1]
        i += 1
    prev = (t, frame)
  if prev is not None:
    while i / fps <= prev[0] + tail or i == 0:
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


def _chunk_or_error(src: Path, dst: Path, video_id: str, opts: ChunkOptions):
  try:
    return chunk_video(src, dst, video_id, opts), None
  except ChunkError as e:
    shutil.rmtree(Path(dst) / video_id, ignore_errors=True)
    return None, str(e)
  except Exception as e:  # pylint: disable=broad-except  # One bad file never stops the rest.
    shutil.rmtree(Path(dst) / video_id, ignore_errors=True)
    return None, f"{src}: {type(e).__name__}: {e}"


def _chunk_in_workers(
  todo: list[tuple[str, Path]],
  dst: Path,
  opts: ChunkOptions,
  workers: int,
  finish,
) -> None:
  """Chunks the (video id, source) pairs `todo` in `workers` processes and
  calls `finish(video_id, source, entry, error)` for each.

  A worker process that dies (an FFmpeg crash, the out-of-memory killer)
  breaks the pool and ends every video in flight, and which of them killed
  it is not known: those are retried one at a time, and one that kills its
  worker alone fails. The other videos go on.
  """
  queue, suspects = collections.deque(todo), collections.deque()
  while queue or suspects:
    if suspects:
      lost = _chunk_in_pool(suspects, dst, opts, 1, finish)
    else:
      lost = _chunk_in_pool(queue, dst, opts, workers, finish)
    if len(lost) == 1:  # Alone in flight, it killed its worker.
      ((vid, path),) = lost
      shutil.rmtree(dst / vid, ignore_errors=True)
      finish(
        vid,
        path,
        None,
        f"{path}: the worker process chunking it died "
        "(an FFmpeg crash, or out of memory?)",
      )
    else:
      suspects.extend(lost)


def _chunk_in_pool(
  queue: collections.deque, dst: Path, opts: ChunkOptions, workers: int, finish
) -> list[tuple[str, Path]]:
  """Chunks videos from `queue` in a new pool until the queue is empty or a
  worker dies; returns the videos that were in flight when it died."""
  running: dict[futures.Future, tuple[str, Path]] = {}
  ctx = multiprocessing.get_context("spawn")
  with futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
    try:
      while queue or running:
        while queue and len(running) < workers:  # A crash loses no more.
          vid, path = queue[0]
          running[pool.submit(_chunk_or_error, path, dst, vid, opts)] = (
            queue.popleft()
          )
        done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
        for job in done:
          finish(*running[job], *job.result())
          del running[job]
    except BrokenProcessPool:
      pass  # Shutting the pool down ends every job still in `running`.
  lost = []
  for job, (vid, path) in running.items():
    if isinstance(job.exception(), BrokenProcessPool):
      lost.append((vid, path))
    else:  # Finished before the crash.
      finish(vid, path, *job.result())
  return lost


def chunk_videos(
  src: str | os.PathLike,
  dst: str | os.PathLike,
  opts: ChunkOptions = ChunkOptions(),
  workers: int = 1,
  progress: bool = True,
) -> dict:
  """Chunks every video under `src` into `dst`, skipping finished ones.

  Returns:
    Summary dict: `done` (newly chunked), `skipped` (already in the manifest),
    `failed` (list of {"source", "video_id", "error"}).

  Raises:
    errors.UserError: `src` missing, two sources with the same video id, or
      a bad manifest in `dst` (before anything is chunked).
  """
  by_id: dict[str, Path] = {}
  for path in find_videos(src):
    if path.stem in by_id:
      raise errors.DataError(
        f"two source videos map to video id "
        f"{path.stem!r}: {by_id[path.stem]} and {path}",
        hint="rename one of them",
      )
    by_id[path.stem] = path
  dst = Path(dst)
  finished = read_manifest(dst)
  dst.mkdir(parents=True, exist_ok=True)
  _end_last_line(dst / MANIFEST)
  todo = [(vid, path) for vid, path in by_id.items() if vid not in finished]
  failed, done = [], 0
  threads = opts.threads or max(1, (os.cpu_count() or 1) // max(workers, 1))
  opts = dataclasses.replace(opts, threads=threads)
  bar = tqdm.tqdm(
    total=len(todo),
    unit="video",
    desc="chunking",
    disable=not progress or not todo,
  )
  with open(dst / MANIFEST, "a") as manifest:

    def finish(vid, path, entry, error):
      nonlocal done
      if entry:
        manifest.write(json.dumps(entry) + "\n")
        manifest.flush()
        done += 1
      else:
        failed.append({"source": str(path), "video_id": vid, "error": error})
        tqdm.tqdm.write(f"FAILED {error}", file=sys.stderr)
      bar.update()

    if workers <= 1:
      for vid, path in todo:
        finish(vid, path, *_chunk_or_error(path, dst, vid, opts))
    else:
      _chunk_in_workers(todo, dst, opts, workers, finish)
  bar.close()
  with open(dst / ERRORS, "w") as f:
    for failure in failed:
      f.write(json.dumps(failure) + "\n")
  return {"done": done, "skipped": len(by_id) - len(todo), "failed": failed}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.data.chunk",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  parser.add_argument("src", help="a video, a folder of videos, or a .txt list")
  parser.add_argument("dst", help="output root (chunks + manifest.jsonl)")
  parser.add_argument(
    "--profile",
    choices=sorted(PROFILES),
    default="default",
    help="encoder settings for a kind of clip (sparse: a few frames far "
    "apart, as AVION's 4-frame clips); set the defaults of the flags below",
  )
  # The profile first: it sets the defaults (and -h shows them).
  first = argparse.ArgumentParser(prog=parser.prog, add_help=False)
  first.add_argument("--profile", choices=sorted(PROFILES), default="default")
  profile = first.parse_known_args(argv)[0].profile
  d = dataclasses.replace(ChunkOptions(), **PROFILES[profile])
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
    opts = ChunkOptions(
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
    summary = chunk_videos(args.src, args.dst, opts, workers=args.workers)
  except (errors.UserError, OSError) as e:  # Bad input: no traceback.
    message = e.describe() if isinstance(e, errors.UserError) else str(e)
    parser.exit(errors.EXIT_USAGE, f"{parser.prog}: error: {message}\n")
  print(
    f"chunked {summary['done']}, already done {summary['skipped']}, "
    f"failed {len(summary['failed'])}"
    + (f" (listed in {Path(args.dst) / ERRORS})" if summary["failed"] else "")
  )
  return 1 if summary["failed"] else 0


if __name__ == "__main__":
  sys.exit(main())
