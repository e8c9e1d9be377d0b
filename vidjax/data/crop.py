"""Crop geometry: where in a stored frame a clip is cropped, and the flip.

Every sampler is a pure function of `(rng, height, width, ...)` and returns a
`Crop` in stored pixels: integer `x, y, w, h` with `0 <= x`, `x + w <= width`
(likewise for y) and a horizontal-flip flag. One crop serves a whole clip. The
decoder (`vidjax.data.video.read_clip`) crops on YUV 4:2:0 planes and rounds
the box to even numbers itself, then scales it to the output size; nothing
here touches pixels.

Randomness comes only from the `np.random.Generator` passed in, so a sampler
called with the same generator state gives the same crop. Samplers draw the
box first and the flip last (one `rng.random()` draw, only when
`flip_prob > 0`).

Samplers:
  * `random_resized_crop`: torchvision's `RandomResizedCrop.get_params`
    (AVION trains with `scale=(0.5, 1.0)`).
  * `center_crop`: resize-short-side-then-centre-crop, as a box.
  * `multi_scale_crop`: VideoMAE's `GroupMultiScaleCrop` (pretraining).
  * `spatial_views`: the 3 crops along the long side for multi-view testing.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import math

import numpy as np

# VideoMAE's GroupMultiScaleCrop defaults.
MULTI_SCALE_SCALES = (1.0, 0.875, 0.75, 0.66)


@dataclasses.dataclass(frozen=True)
class Crop:
  """A crop box in stored pixels plus a horizontal-flip flag.

  Attributes:
    x: left column of the box.
    y: top row of the box.
    w: box width in pixels.
    h: box height in pixels.
    hflip: whether the clip is flipped left-right after cropping.
  """

  x: int
  y: int
  w: int
  h: int
  hflip: bool = False

  @property
  def box(self) -> tuple[int, int, int, int]:
    """`(x, y, w, h)`, the form `read_clip(crop=...)` takes."""
    return (self.x, self.y, self.w, self.h)


def _flip(rng: np.random.Generator | None, flip_prob: float) -> bool:
  if not 0.0 <= flip_prob <= 1.0:
    raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob}")
  if flip_prob == 0.0:
    return False
  if rng is None:
    raise ValueError("a random flip (flip_prob > 0) needs an rng")
  return bool(rng.random() < flip_prob)


def _check_frame(height: int, width: int) -> None:
  if height < 1 or width < 1:
    raise ValueError(f"frame size must be positive, got {height}x{width}")


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
  if isinstance(size, (int, np.integer)):
    return int(size), int(size)
  out_h, out_w = (int(s) for s in size)
  if out_h < 1 or out_w < 1:
    raise ValueError(f"output size must be positive, got {size}")
  return out_h, out_w


def random_resized_crop(
  rng: np.random.Generator,
  height: int,
  width: int,
  *,
  scale: tuple[float, float] = (0.08, 1.0),
  ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
  flip_prob: float = 0.0,
) -> Crop:
  """Samples a box as torchvision's `RandomResizedCrop.get_params` does.

  Same distribution, attempts and fallback; only the random stream differs.

  Up to 10 attempts draw an area fraction uniformly in `scale` and an aspect
  ratio (w / h) log-uniformly in `ratio`, round the box sides with Python's
  `round` and keep the first box that fits, at a uniform position. If none
  fits, it falls back to a centred box: the whole frame with its aspect ratio
  clamped into `ratio`.

  Args:
    rng: random generator.
    height: stored frame height.
    width: stored frame width.
    scale: range of the box area as a fraction of the frame area. torchvision
      defaults to (0.08, 1.0); AVION uses (0.5, 1.0).
    ratio: range of the box aspect ratio w / h.
    flip_prob: probability of a horizontal flip.

  Returns:
    The sampled `Crop`.
  """
  _check_frame(height, width)
  if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
    raise ValueError(f"need 0 < min <= max for scale {scale} and ratio {ratio}")
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target_area = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
    w = int(round(math.sqrt(target_area * aspect)))
    h = int(round(math.sqrt(target_area / aspect)))
    if 0 < w <= width and 0 < h <= height:
      y = int(rng.integers(0, height - h + 1))
      x = int(rng.integers(0, width - w + 1))
      return Crop(x, y, w, h, _flip(rng, flip_prob))
  # Fallback: centred box, the frame's aspect ratio clamped into `ratio`.
  in_ratio = width / height
  if in_ratio < min(ratio):
    w, h = width, int(round(width / min(ratio)))
  elif in_ratio > max(ratio):
    w, h = int(round(height * max(ratio))), height
  else:
    w, h = width, height
  return Crop((width - w) // 2, (height - h) // 2, w, h, _flip(rng, flip_prob))


def _aspect_window(
  height: int, width: int, out_h: int, out_w: int
) -> tuple[int, int]:
  """The largest (w, h) inside the frame with the output's aspect ratio."""
  if width * out_h > height * out_w:  # Frame wider than the output.
    h = height
    w = min(width, max(1, int(round(height * out_w / out_h))))
  else:
    w = width
    h = min(height, max(1, int(round(width * out_h / out_w))))
  return w, h


def center_crop(
  rng: np.random.Generator | None,
  height: int,
  width: int,
  size: int | Sequence[int],
  *,
  flip_prob: float = 0.0,
) -> Crop:
  """The largest centred box with the output's aspect ratio.

  Cropping this box and scaling it to `size` equals resizing the short side
  and centre-cropping (for a square output, the box is the centred square of
  side `min(height, width)`). Offsets are `(slack) // 2`.

  Args:
    rng: random generator; may be None when `flip_prob` is 0.
    height: stored frame height.
    width: stored frame width.
    size: output size `(H, W)` or an int for a square.
    flip_prob: probability of a horizontal flip.

  Returns:
    The `Crop`.
  """
  _check_frame(height, width)
  out_h, out_w = _pair(size)
  w, h = _aspect_window(height, width, out_h, out_w)
  return Crop((width - w) // 2, (height - h) // 2, w, h, _flip(rng, flip_prob))


def spatial_views(
  height: int,
  width: int,
  size: int | Sequence[int],
  num_views: int = 3,
  *,
  rng: np.random.Generator | None = None,
  flip_prob: float = 0.0,
) -> list[Crop]:
  """Evaluation crops spread along the long side (multi-view testing).

  Each view is the `center_crop` window (largest with the output's aspect
  ratio); views slide it along the axis with slack, evenly from one end to
  the other: left/centre/right for a landscape frame, top/middle/bottom for a
  portrait one. View k starts at `int(k * (slack / (num_views - 1)))`, as
  VideoMAE's test loader does; a single view is the centre crop.

  Args:
    height: stored frame height.
    width: stored frame width.
    size: output size `(H, W)` or an int for a square.
    num_views: number of crops.
    rng: random generator; only needed when `flip_prob` > 0.
    flip_prob: probability of flipping each view (drawn per view, in order).

  Returns:
    `num_views` crops, in order along the long side.
  """
  _check_frame(height, width)
  if num_views < 1:
    raise ValueError(f"num_views must be >= 1, got {num_views}")
  if num_views == 1:
    return [center_crop(rng, height, width, size, flip_prob=flip_prob)]
  out_h, out_w = _pair(size)
  w, h = _aspect_window(height, width, out_h, out_w)
  slack_x, slack_y = width - w, height - h
  # As VideoMAE: the step first, then int(k * step).
  step_x, step_y = slack_x / (num_views - 1), slack_y / (num_views - 1)
  views = []
  for k in range(num_views):
    if slack_x >= slack_y:  # Slide horizontally (the centred y is then 0).
      x, y = int(k * step_x), slack_y // 2
    else:
      x, y = slack_x // 2, int(k * step_y)
    views.append(Crop(x, y, w, h, _flip(rng, flip_prob)))
  return views


# GroupMultiScaleCrop's candidate offsets, in quarters of the slack: the
# corners and the centre, then (more_fix_crop) the edge middles and the
# quarter points.
FIX_CROP_GRID = ((0, 0), (4, 0), (0, 4), (4, 4), (2, 2))
MORE_FIX_CROP_GRID = FIX_CROP_GRID + (
  (0, 2),
  (4, 2),
  (2, 4),
  (2, 0),
  (1, 1),
  (3, 1),
  (1, 3),
  (3, 3),
)


def _fixed_offsets(
  width: int, height: int, crop_w: int, crop_h: int, more_fix_crop: bool
) -> list[tuple[int, int]]:
  """GroupMultiScaleCrop's candidate (x, y) offsets, on a grid of quarters."""
  step_x = (width - crop_w) // 4
  step_y = (height - crop_h) // 4
  grid = MORE_FIX_CROP_GRID if more_fix_crop else FIX_CROP_GRID
  return [(gx * step_x, gy * step_y) for gx, gy in grid]


def multi_scale_crop(
  rng: np.random.Generator,
  height: int,
  width: int,
  size: int | Sequence[int],
  *,
  scales: Sequence[float] = MULTI_SCALE_SCALES,
  max_distort: int = 1,
  fix_crop: bool = True,
  more_fix_crop: bool = True,
  flip_prob: float = 0.0,
) -> Crop:
  """VideoMAE's `GroupMultiScaleCrop` box (its pretraining augmentation).

  Candidate sides are `int(min(height, width) * s)` for s in `scales`, each
  snapped to the output side when within 3 pixels of it. A (w, h) pair is
  drawn uniformly among the pairs whose scale indices differ by at most
  `max_distort`. With `fix_crop` the offset is drawn uniformly from 5 fixed
  positions (4 corners and the centre), or 13 with `more_fix_crop` (adding
  the edge middles and quarter points), on a grid of quarter-slack steps;
  otherwise uniformly anywhere. VideoMAE pretrains with the defaults here
  (its class defaults to `more_fix_crop=True`).

  Args:
    rng: random generator.
    height: stored frame height.
    width: stored frame width.
    size: output size `(H, W)` or an int for a square; only used to snap
      near-equal candidate sides.
    scales: candidate side fractions of the short side.
    max_distort: largest allowed index gap between width and height scales.
    fix_crop: draw the offset from the fixed grid (True) or anywhere.
    more_fix_crop: 13 fixed positions instead of 5.
    flip_prob: probability of a horizontal flip.

  Returns:
    The sampled `Crop`.
  """
  _check_frame(height, width)
  out_h, out_w = _pair(size)
  base = min(height, width)
  sides = [int(base * s) for s in scales]
  if min(sides) < 1 or max(scales) > 1:
    raise ValueError(
      f"scales {tuple(scales)} give empty or oversized boxes "
      f"for a {height}x{width} frame"
    )
  crop_hs = [out_h if abs(s - out_h) < 3 else s for s in sides]
  crop_ws = [out_w if abs(s - out_w) < 3 else s for s in sides]
  pairs = [
    (w, h)
    for i, h in enumerate(crop_hs)
    for j, w in enumerate(crop_ws)
    if abs(i - j) <= max_distort
  ]
  # Snapping can push a side past the frame (a frame barely larger than the
  # output); VideoMAE would then crop out of bounds. Clamp instead.
  w, h = pairs[int(rng.integers(len(pairs)))]
  w, h = min(w, width), min(h, height)
  if fix_crop:
    offsets = _fixed_offsets(width, height, w, h, more_fix_crop)
    x, y = offsets[int(rng.integers(len(offsets)))]
  else:
    x = int(rng.integers(0, width - w + 1))
    y = int(rng.integers(0, height - h + 1))
  return Crop(x, y, w, h, _flip(rng, flip_prob))
