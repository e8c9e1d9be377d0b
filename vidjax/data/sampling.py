"""Which frames a clip uses: frame ids on a video's timeline.

Frame ids index the video's frames at the manifest fps (frame i is shown at
`i / fps` seconds), the same ids `vidjax.data.video.read_clip` takes. Clip
bounds are half-open frame ranges `[start_frame, end_frame)`; turn seconds
into a range with `clip_frame_range` (or `seconds_to_frame` for one time).

Samplers return `int64` numpy arrays and take an `np.random.Generator` for
training; `rng=None` gives the deterministic evaluation choice.

  * `segment_frame_ids`: N equal segments, one frame each (LaViLa/AVION).
  * `stride_frame_ids`: T frames at a fixed stride (VideoMAE/Kinetics).
  * `multi_view_frame_ids`: K evenly spread stride clips for testing.
"""

from __future__ import annotations

import math

import numpy as np


def seconds_to_frame(t: float, fps: float) -> int:
  """The frame shown nearest to time `t`: `floor(t * fps + 0.5)`.

  Halves round up (AVION's `np.round` rounds them to even; the two differ only
  at exact ties). Rounding to nearest, rather than truncating, keeps
  float error such as `0.1 * 30 = 3.0000000000000004` or `2.9999999999999996`
  from moving a boundary by a frame.

  Args:
    t: time in seconds, >= 0.
    fps: frame rate of the timeline, > 0.

  Returns:
    The frame id.
  """
  if fps <= 0:
    raise ValueError(f"fps must be positive, got {fps}")
  if t < 0:
    raise ValueError(f"time must be >= 0, got {t}")
  return int(math.floor(t * fps + 0.5))


def clip_frame_range(
  start: float, end: float, fps: float, num_frames: int | None = None
) -> tuple[int, int]:
  """Seconds `[start, end)` -> a non-empty half-open frame range.

  Both ends go through `seconds_to_frame`. The range is clamped to the video
  (`num_frames`, when given) and widened to at least one frame, so a
  zero-length or past-the-end annotation still yields a usable clip.

  Args:
    start: clip start in seconds.
    end: clip end in seconds.
    fps: frame rate of the timeline.
    num_frames: frames in the video, if known.

  Returns:
    `(start_frame, end_frame)` with `start_frame < end_frame`.
  """
  if end < start:
    raise ValueError(f"clip end {end} s is before its start {start} s")
  first, stop = seconds_to_frame(start, fps), seconds_to_frame(end, fps)
  if num_frames is not None:
    if num_frames < 1:
      raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    first = min(first, num_frames - 1)
    stop = min(stop, num_frames)
  return first, max(stop, first + 1)


def _check_range(start_frame: int, end_frame: int) -> None:
  if start_frame < 0 or end_frame <= start_frame:
    raise ValueError(
      f"need 0 <= start_frame < end_frame, got [{start_frame}, {end_frame})"
    )


def segment_frame_ids(
  start_frame: int,
  end_frame: int,
  num_segments: int,
  rng: np.random.Generator | None = None,
) -> np.ndarray:
  """One frame from each of N equal segments of `[start_frame, end_frame)`.

  Segment i covers `start + [i, i + 1) * L` with `L = (end - start) / N`.
  Evaluation (`rng=None`) takes its midpoint, `floor(start + (i + 0.5) L)`,
  as AVION does; training takes `floor(start + (i + u_i) L)` with u_i uniform
  in [0, 1), a uniform frame within the segment. (AVION jitters by
  `(u - 0.5) * (end - start - 1) / N` around the midpoint: the same up to
  one frame at the segment edges.) Clips shorter than N frames repeat frames,
  since several segments then floor to the same frame.

  Args:
    start_frame: first frame of the clip.
    end_frame: one past the last frame.
    num_segments: N, the number of frames returned.
    rng: random generator for training; None for evaluation.

  Returns:
    `int64[N]` non-decreasing frame ids in `[start_frame, end_frame)`.
  """
  _check_range(start_frame, end_frame)
  if num_segments < 1:
    raise ValueError(f"num_segments must be >= 1, got {num_segments}")
  length = (end_frame - start_frame) / num_segments
  if rng is None:
    offsets = np.full(num_segments, 0.5)
  else:
    offsets = rng.random(num_segments)
  ids = np.floor(start_frame + (np.arange(num_segments) + offsets) * length)
  # Float rounding could reach end_frame when u is within 1 ulp of 1.
  return np.minimum(ids.astype(np.int64), end_frame - 1)


def stride_frame_ids(
  start_frame: int,
  end_frame: int,
  num_frames: int,
  stride: int,
  rng: np.random.Generator | None = None,
) -> np.ndarray:
  """T frames at a fixed stride: `first + stride * [0, 1, ..., T - 1]`.

  When the clip holds the span (`end - start >= T * stride`), training draws
  `first - start` uniformly in `[0, end - start - T * stride]` (VideoMAE's
  pretraining sampler); evaluation (`rng=None`) centres the span. A shorter
  clip starts at `start_frame` and repeats its last reachable frame, as
  VideoMAE does (its loader stops stepping one frame earlier, a 1-based
  indexing artefact, which is not reproduced).

  Args:
    start_frame: first frame of the clip.
    end_frame: one past the last frame.
    num_frames: T, the number of frames returned.
    stride: frame step s >= 1.
    rng: random generator for training; None for evaluation.

  Returns:
    `int64[T]` non-decreasing frame ids in `[start_frame, end_frame)`.
  """
  _check_range(start_frame, end_frame)
  if num_frames < 1 or stride < 1:
    raise ValueError(
      f"need num_frames >= 1 and stride >= 1, got {num_frames} and {stride}"
    )
  available = end_frame - start_frame
  slack = available - num_frames * stride
  steps = np.arange(num_frames, dtype=np.int64)
  if slack < 0:
    last_step = (available - 1) // stride
    return start_frame + np.minimum(steps, last_step) * stride
  offset = slack // 2 if rng is None else int(rng.integers(0, slack + 1))
  return start_frame + offset + steps * stride


def multi_view_frame_ids(
  start_frame: int,
  end_frame: int,
  num_frames: int,
  stride: int,
  num_views: int,
) -> np.ndarray:
  """K stride clips with evenly spread starts, for multi-view testing.

  Follows VideoMAE's test loader: the candidate frames are
  `start + stride * [0, 1, ...]` inside the clip, padded by repeating the last
  one up to T; view k takes T consecutive candidates from position
  `int(k * (P - T) / (K - 1))`, where P is the number of candidates. So the
  first view starts at the clip start and the last ends at its end. A single
  view is centred (VideoMAE divides by zero there).

  Args:
    start_frame: first frame of the clip.
    end_frame: one past the last frame.
    num_frames: T, frames per view.
    stride: frame step s >= 1.
    num_views: K, the number of views.

  Returns:
    `int64[K, T]` frame ids in `[start_frame, end_frame)`.
  """
  _check_range(start_frame, end_frame)
  if num_frames < 1 or stride < 1 or num_views < 1:
    raise ValueError(
      f"need num_frames, stride and num_views >= 1, got "
      f"{num_frames}, {stride} and {num_views}"
    )
  candidates = np.arange(start_frame, end_frame, stride, dtype=np.int64)
  if len(candidates) < num_frames:
    pad = np.full(num_frames - len(candidates), candidates[-1])
    candidates = np.concatenate([candidates, pad])
  slack = len(candidates) - num_frames
  if num_views == 1:
    firsts = [slack // 2]
  else:
    step = slack / (num_views - 1)  # As VideoMAE: the step, then int(k * step).
    firsts = [int(k * step) for k in range(num_views)]
  return np.stack([candidates[f : f + num_frames] for f in firsts])
