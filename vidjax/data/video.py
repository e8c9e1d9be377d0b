"""A clip from chunk files: fused decode-crop -> uint8 RGB frames.

`read_clip(root, video_id, frame_ids, crop=..., size=..., hflip=...)` reads the
chunks written by `vidjax.data.chunk` and does the least work that yields the
requested frames:

1. Frame ids are grouped by chunk (a clip may span several chunks; the whole
   clip gets the one crop it was given).
2. In each chunk it seeks to the keyframe at or before the first frame needed
   and stops demuxing once every needed frame has been sent to the decoder.
3. Packets that nothing needs never reach the decoder: the packets before that
   keyframe, and non-reference frames (H.264 `nal_ref_idc == 0`, the chunker's
   B-frames) that were not requested.
4. Only requested frames are converted: the crop is cut from the YUV 4:2:0
   planes first, scaled as planar YUV, then converted to RGB (two swscale
   passes with SIMD code, ~2.4x faster than one pass straight to packed
   RGB). Nothing outside the crop is ever scaled or colour-converted.
5. Chunks are opened without FFmpeg's stream probe, which would decode the
   first frame once more (an open costs a third).

`python -m benchmarks.loader` measures all of it on real footage against
naive PyAV and decord (BENCHMARKS.md).

Ids past the last frame are clamped to the last frame (and negative ids to 0),
so samplers may overshoot at the end of a video. Any failure to produce a
frame raises `VideoReadError` naming the file and the frame.
`check_chunk_files` compares manifest lines with the chunk files at start-up.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
import dataclasses
import fractions
import functools
import math
import os
import threading

import av
import numpy as np

from vidjax.base import errors
from vidjax.data import chunk as chunk_lib, reads


class VideoReadError(Exception):
  """A clip could not be read: missing or corrupt chunk, unknown video."""


@dataclasses.dataclass(frozen=True)
class VideoInfo:
  """One video of a chunk store (a line of manifest.jsonl)."""

  video_id: str
  frame_rate: fractions.Fraction
  num_frames: int
  width: int
  height: int
  chunk_seconds: float
  where: str = dataclasses.field(default="", compare=False)  # 'FILE:LINE'

  @functools.cached_property
  def chunk_starts(self) -> list[int]:
    return chunk_lib.chunk_start_frames(
      self.num_frames, self.frame_rate, self.chunk_seconds
    )

  @property
  def num_chunks(self) -> int:
    """len(chunk_starts), without listing them (for any num_frames)."""
    return math.floor((self.num_frames - 1) / self._frames_per_chunk) + 1

  def chunk_start(self, k: int) -> int:
    """chunk_starts[k]: the first frame of chunk k."""
    return math.ceil(k * self._frames_per_chunk)

  @property
  def _frames_per_chunk(self) -> fractions.Fraction:
    return fractions.Fraction(str(self.chunk_seconds)) * self.frame_rate


@dataclasses.dataclass
class DecodeStats:
  """Counters of one `read_clip` call, for benchmarks."""

  decoded: int = 0  # frames out of the decoder
  delivered: int = 0  # frames returned (with repeats)
  packets_sent: int = 0
  packets_skipped: int = 0


@functools.lru_cache(maxsize=16)
def _load_manifest(parts: tuple[tuple[str, int, int], ...]) -> dict:
  """{video id: VideoInfo}: the union of the manifest files `parts` ((path,
  mtime, size): a file appended to, rewritten or added is read again)."""
  videos: dict[str, VideoInfo] = {}
  for path, *_ in parts:
    try:
      for where, entry in chunk_lib.manifest_lines(path):
        videos[entry["video_id"]] = _video_info(entry, where)  # The last.
    except errors.DataFileError as e:
      raise VideoReadError(e.describe()) from None
    except OSError as e:
      raise VideoReadError(f"{path}: cannot read ({e.strerror or e})") from None
  return videos


def _video_info(entry: dict, where: str) -> VideoInfo:
  """The VideoInfo of a manifest entry; VideoReadError('FILE:LINE: ...')."""
  try:
    info = VideoInfo(
      entry["video_id"],
      fractions.Fraction(entry.get("frame_rate", entry["fps"])),
      int(entry["num_frames"]),
      int(entry["width"]),
      int(entry["height"]),
      float(entry["chunk_seconds"]),
      where,
    )
  except KeyError as e:
    raise VideoReadError(f"{where}: no {e} in this manifest entry") from None
  except (TypeError, ValueError, ZeroDivisionError) as e:
    raise VideoReadError(f"{where}: bad manifest entry ({e})") from None
  # Chunk boundaries need a positive chunk length and rate (else no end).
  for name, value in (
    ("chunk_seconds", info.chunk_seconds),
    ("frame rate", info.frame_rate),
    ("num_frames", info.num_frames),
    ("width", info.width),
    ("height", info.height),
  ):
    if not (math.isfinite(value) and value > 0):
      raise VideoReadError(f"{where}: {name} {value} is not a positive number")
  # The id names the video's folder: it must stay inside the store.
  if (
    info.video_id in ("", ".", "..")
    or "/" in info.video_id
    or os.sep in info.video_id
    or "\0" in info.video_id
  ):
    raise VideoReadError(
      f"{where}: video_id {info.video_id!r} is not a "
      "plain name: its chunks would be read outside the "
      "chunk store"
    )
  return info


def manifest(root: str | os.PathLike) -> dict[str, VideoInfo]:
  """Videos of the chunk store at `root`, by id: the union of its manifest
  files, a whole store's and its shards' (cached; reloaded on change)."""
  for _ in range(3):  # A part may go as it is looked at (--merge).
    try:
      parts = tuple(
        (p, (st := os.stat(p)).st_mtime_ns, st.st_size)
        for p in chunk_lib.manifest_files(root)
      )
    except FileNotFoundError:
      continue
    if not parts:
      raise VideoReadError(
        f"{os.path.join(root, chunk_lib.MANIFEST)}: no manifest; chunk the "
        "videos first (python -m vidjax.data.chunk SRC DST)"
      )
    return _load_manifest(parts)
  raise VideoReadError(f"{root}: its manifest files keep changing")


def video_info(root: str | os.PathLike, video_id: str) -> VideoInfo:
  try:
    return manifest(root)[video_id]
  except KeyError:
    # The message starts with the video's own path: failures are counted
    # (and named) per video, not all as the manifest's.
    raise VideoReadError(
      f"{os.path.join(root, video_id)}: no video "
      f"{video_id!r} in {chunk_lib.MANIFEST}"
    ) from None


def read_clip(
  root: str | os.PathLike,
  video_id: str,
  frame_ids: Sequence[int] | np.ndarray,
  *,
  crop: tuple[int, int, int, int] | None = None,
  size: tuple[int, int] | None = None,
  hflip: bool = False,
  stats: DecodeStats | None = None,
  out: np.ndarray | None = None,
) -> np.ndarray:
  """Decodes frames of a chunked video, cropped and scaled in the decoder.

  Args:
    root: chunk store written by `python -m vidjax.data.chunk`.
    video_id: a video of the store's manifest.
    frame_ids: int[T] indices on the video's timeline at the manifest fps, in
      any order, repeats allowed; clamped to [0, num_frames - 1].
    crop: (x, y, w, h) window in stored pixels, the same for every frame;
      rounded to even offsets and sizes (4:2:0 chroma). None: the whole frame.
    size: (H, W) output size; None keeps the crop's size.
    hflip: mirror the output horizontally (in the conversion: the clip is
      contiguous either way).
    stats: if given, decode counters are added to it.
    out: uint8[T, H, W, 3] to write the frames into (a data worker's
      /dev/shm block: `vidjax.data.workers.clip_array`); None: a new array.

  Returns:
    uint8[T, H, W, 3] RGB frames (`out`, if given).

  Raises:
    VideoReadError: unknown video, missing chunk, or undecodable data; the
      message names the file and the frame.
  """
  info = video_info(root, video_id)
  ids = np.clip(
    np.asarray(frame_ids, dtype=np.int64).reshape(-1), 0, info.num_frames - 1
  )
  window = even_window(crop, info.width, info.height)
  out_h, out_w = size if size is not None else (window[3], window[2])
  stats = stats if stats is not None else DecodeStats()
  frames: dict[int, np.ndarray] = {}
  starts = info.chunk_starts
  by_chunk: dict[int, list[int]] = {}
  for i in np.unique(ids).tolist():
    by_chunk.setdefault(bisect.bisect_right(starts, i) - 1, []).append(i)
  for k, global_ids in by_chunk.items():
    path = os.path.join(
      root, video_id, chunk_lib.chunk_name(k, info.chunk_seconds)
    )
    local = {i - starts[k]: i for i in global_ids}
    with reads.reading(path):  # Named if the pipeline stalls on it.
      for j, rgb in _decode_chunk(
        path, info.frame_rate, local, window, (out_w, out_h), stats, hflip
      ):
        frames[local[j]] = rgb
  clip = np.stack([frames[i] for i in ids.tolist()], out=out)
  stats.delivered += len(ids)
  return clip


def even_window(crop, width: int, height: int) -> tuple[int, int, int, int]:
  """The crop snapped to even numbers (4:2:0 chroma) and clipped to the frame."""
  if crop is None:
    return 0, 0, width, height
  x, y, w, h = (int(round(v)) for v in crop)
  if w <= 0 or h <= 0:
    raise ValueError(f"crop {crop} has no area")
  x, y = min(max(x // 2 * 2, 0), width - 2), min(max(y // 2 * 2, 0), height - 2)
  w = min(max(2, (w + 1) // 2 * 2), width - x)
  h = min(max(2, (h + 1) // 2 * 2), height - y)
  return x, y, w, h


def _is_reference(packet: av.Packet, length_size: int) -> bool:
  """Whether an H.264 (AVCC) packet may be referenced by other frames.

  A packet is disposable when its slice NAL units have nal_ref_idc == 0 (all
  slices of a picture share it, so the first one decides).
  """
  data = memoryview(packet)  # No copy: only NAL headers are read.
  pos = 0
  while pos + length_size < len(data):
    n = int.from_bytes(data[pos : pos + length_size], "big")
    header = data[pos + length_size]
    if header & 0x1F in (1, 5):  # Coded slice (non-IDR or IDR).
      return bool(header >> 5)
    pos += length_size + n
  return False


class _Converter:
  """Crop -> scale -> RGB for one thread; keeps its swscale contexts.

  swscale's scaled path to packed RGB runs in plain C, while scaling planar
  YUV and the unscaled YUV -> RGB conversion both have SIMD code: two passes
  (crop scaled as yuv420p, then converted) cost less than half of one direct
  pass and interpolate chroma at least as well (`benchmarks.reader_parts`).
  """

  def __init__(self):
    self.scaler = av.video.reformatter.VideoReformatter()
    self.to_rgb = av.video.reformatter.VideoReformatter()

  def __call__(
    self, frame: av.VideoFrame, window, out_wh, hflip: bool = False
  ) -> np.ndarray:
    x, y, w, h = window
    if frame.format.name not in ("yuv420p", "yuvj420p"):
      frame = frame.reformat(format="yuv420p")
    if (x, y, w, h) != (0, 0, frame.width, frame.height):
      # One copy of the window's planes; nothing outside it is touched again.
      cropped = av.VideoFrame(w, h, frame.format.name)
      for src, dst, sub in zip(
        chunk_lib.yuv_planes(frame), chunk_lib.yuv_planes(cropped), (1, 2, 2)
      ):
        dst[...] = src[y // sub : (y + h) // sub, x // sub : (x + w) // sub]
      frame = cropped
    if (frame.width, frame.height) != out_wh:
      frame = self.scaler.reformat(
        frame,
        width=out_wh[0],
        height=out_wh[1],
        interpolation=_BILINEAR,
        threads=1,
      )
    if not hflip:
      return self.to_rgb.reformat(frame, format="rgb24", threads=1).to_ndarray()
    bgr = self.to_rgb.reformat(frame, format="bgr24", threads=1).to_ndarray()
    rows = bgr.reshape(bgr.shape[0], -1)[:, ::-1]  # B G R ... -> ... R G B
    return np.ascontiguousarray(rows).reshape(bgr.shape)


_BILINEAR = av.video.reformatter.Interpolation.BILINEAR
_converters = threading.local()


def crop_to_rgb(
  frame: av.VideoFrame, window, out_wh, hflip: bool = False
) -> np.ndarray:
  """uint8[H, W, 3] RGB of the window of a decoded frame, scaled to out_wh
  (and mirrored left-right with `hflip`)."""
  if not hasattr(_converters, "value"):  # One per thread (reader threads).
    _converters.value = _Converter()
  return _converters.value(frame, window, out_wh, hflip)


# av.open runs FFmpeg's stream probing, which decodes the chunk's first frame
# with a decoder of its own: wasted work, as the clip's keyframe is decoded
# again by ours. The mp4 header already holds everything read_clip needs, and
# chunks are always mp4 (no format guessing either). `options` reach only the
# probe's decoders, not the stream's own.
OPEN_OPTIONS = {
  "format": "mp4",
  "container_options": {"probesize": "32"},
  "options": {"skip_frame": "all"},
}


def chunk_header(path: str) -> tuple[int | None, fractions.Fraction | None]:
  """(frames, frame rate) of a chunk file as its header says (None: not
  said, or the file does not open); nothing is decoded."""
  try:
    with av.open(path, **OPEN_OPTIONS) as container:
      stream = container.streams.video[0]
      rate = stream.average_rate or stream.guessed_rate
      return stream.frames or None, fractions.Fraction(rate) if rate else None
  except (av.error.FFmpegError, OSError, IndexError):
    return None, None


def check_chunk_files(
  root: str | os.PathLike, video_ids: Sequence[str], *, opened: int = 3
) -> None:
  """The manifest lines of `video_ids` against their chunk files.

  The last chunk that a line's frame count and rate imply must exist and
  the next must not; for the first `opened` videos the last chunk is opened
  and its frames and rate compared (from its header, nothing decoded). A
  video without a folder is left to the reader (skipped, counted).

  Raises:
    errors.DataError: naming the manifest line, what it says and what the
      files are.
  """
  videos = manifest(root)
  for n, video_id in enumerate(video_ids):
    info, folder = videos[video_id], os.path.join(root, video_id)
    if not os.path.isdir(folder):
      continue
    last = info.num_chunks - 1
    names = [
      chunk_lib.chunk_name(k, info.chunk_seconds) for k in (last, last + 1)
    ]
    paths = [os.path.join(folder, name) for name in names]
    says = (
      f"{info.where}: {video_id!r} has num_frames {info.num_frames} at "
      f"{float(info.frame_rate):g} fps ({info.num_chunks} chunks of "
      f"{info.chunk_seconds:g} s)"
    )
    hint = (
      "the manifest line does not describe the chunk files: chunk the "
      "video again (delete its line and folder, then run the chunker)"
    )
    if not os.path.exists(paths[0]) or os.path.exists(paths[1]):
      found = len([f for f in os.listdir(folder) if f.endswith(".mp4")])
      raise errors.DataError(
        f"{says}, but "
        + (
          f"{video_id}/{names[1]} follows its last chunk"
          if os.path.exists(paths[0])
          else f"its last chunk {video_id}/{names[0]} is missing"
        )
        + f" ({found} chunk files in {folder})",
        hint=hint,
      )
    if n < opened:  # An unreadable chunk is the reader's to skip.
      frames, rate = chunk_header(paths[0])
      expected = info.num_frames - info.chunk_start(last)
      if (frames and frames != expected) or (
        rate and abs(rate / info.frame_rate - 1) > 1e-3
      ):
        holds = f"{frames or 'unknown'} frames at " + (
          f"{float(rate):g} fps" if rate else "an unknown rate"
        )
        raise errors.DataError(
          f"{says}, so its last chunk {video_id}/{names[0]} should hold "
          f"{expected} frames at that rate, but it holds {holds}",
          hint=hint,
        )


def _decode_chunk(
  path: str,
  rate: fractions.Fraction,
  needed: dict[int, int],
  window,
  out_wh,
  stats: DecodeStats,
  hflip: bool = False,
):
  """Yields (local index, uint8[H, W, 3]) for each needed local frame."""
  first, todo = min(needed), set(needed)
  current = None
  try:
    with av.open(path, **OPEN_OPTIONS) as container:
      stream = container.streams.video[0]
      ctx = stream.codec_context
      ctx.thread_count = 1  # Parallelism comes from loader workers.
      tb, start = stream.time_base, stream.start_time or 0
      h264 = ctx.name == "h264" and ctx.extradata and ctx.extradata[0] == 1
      length_size = (ctx.extradata[4] & 3) + 1 if h264 else 0

      frames_per_tick = float(tb * rate)  # Floats: Fractions cost 10% here.

      def index(pts: int) -> int:
        return round((pts - start) * frames_per_tick)

      # References of the current GOP not yet sent: they go to the decoder
      # only when a needed frame follows them; a new keyframe (closed GOPs)
      # makes them useless. Unneeded non-reference packets are dropped.
      pending: list[av.Packet] = []
      unsent = set(needed)
      for packet in _packets_from(container, stream, first, rate):
        current = j = index(packet.pts)
        if packet.is_keyframe:
          stats.packets_skipped += len(pending)
          pending = []
        if j not in needed:
          if (
            packet.is_keyframe
            or not length_size
            or _is_reference(packet, length_size)
          ):
            pending.append(packet)
          else:
            stats.packets_skipped += 1
          continue
        pending.append(packet)
        for p in pending:
          stats.packets_sent += 1
          for frame in ctx.decode(p):
            yield from _deliver(
              frame, index, todo, window, out_wh, stats, hflip
            )
        pending = []
        unsent.discard(j)
        if not unsent:
          break
      for frame in ctx.decode(None):
        yield from _deliver(frame, index, todo, window, out_wh, stats, hflip)
  except FileNotFoundError:
    raise VideoReadError(
      f"{path}: missing chunk (needed for local frame {first})"
    ) from None
  except (av.error.FFmpegError, OSError, IndexError, ValueError) as e:
    raise VideoReadError(
      f"{path}: cannot decode near local frame "
      f"{current if current is not None else first}: "
      f"{type(e).__name__}: {e}"
    ) from e
  if todo:
    raise VideoReadError(
      f"{path}: local frames {sorted(todo)[:5]} not found "
      "(truncated or corrupt chunk)"
    )


def _packets_from(container, stream, first: int, rate: fractions.Fraction):
  """Packets in decode order from a keyframe at or before local frame `first`.

  The mp4 index is by decode time, so the seek aims a few frames early; if it
  still lands past `first`, the chunk is read from its start.
  """
  tb, start = stream.time_base, stream.start_time or 0
  target = int(start + (first - 4) / rate / tb)
  if target > start:
    container.seek(target, stream=stream, backward=True, any_frame=False)
    packets = container.demux(stream)
    head = next(packets, None)
    if (
      head is not None
      and head.pts is not None
      and (head.is_keyframe and round((head.pts - start) * tb * rate) <= first)
    ):
      yield head
      yield from (p for p in packets if p.pts is not None)
      return
    container.seek(start, stream=stream, backward=True, any_frame=False)
  yield from (p for p in container.demux(stream) if p.pts is not None)


def _deliver(
  frame,
  index,
  todo: set[int],
  window,
  out_wh,
  stats: DecodeStats,
  hflip: bool = False,
):
  stats.decoded += 1
  if frame.pts is None:  # No place on the timeline (a damaged stream): a
    return  # frame it leaves missing is reported as not found.
  j = index(frame.pts)
  if j in todo:
    todo.discard(j)
    yield j, crop_to_rgb(frame, window, out_wh, hflip)
