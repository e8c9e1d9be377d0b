"""Repeated sampling: R augmented views of every decoded clip, on the device.

With `data.repeats=R` > 1 the host decodes `batch_size / R` clips per step
and the device makes R views of each (MAE-ST's `repeat_aug`, VideoMAE V2's
`num_sample`: decoding is the cost, so a decoded clip is used R times). The
host decodes each training clip's whole "canvas", the largest centred window
of the frame with `data.repeat_canvas`'s aspect ratio, scaled to that size
and unflipped (`loader.ClipSpec.from_config(..., train=True)`). Here every
view draws its own crop box on the canvas with the configured sampler
(`data.crop`: 'random_resized' with `data.crop_scale`, 'multi_scale',
'center'), its own flip (`data.hflip`), and is resampled to `data.size`
(bilinear, antialiased when shrinking, rounded back to uint8 as a decoded
clip would be). The augmentations after it (RandAugment, erasing, mixing,
VideoMAE's tube masks) draw per element, so each view gets its own.

The views of clip c are rows c*R .. c*R+R-1 of the expanded batch; every
other key of the batch (labels, index, valid, ...) is repeated alike. The
box samplers follow `vidjax.data.crop` (the same distributions, drawn with
`jax.random`), in canvas pixels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vidjax.data import crop as crop_lib

Array = jax.Array

ATTEMPTS = 10  # torchvision's RandomResizedCrop tries, as crop_lib.


def repeat_rows(batch: dict[str, Array], repeats: int) -> dict[str, Array]:
  """Every leaf [N, ...] -> [N * repeats, ...], row c repeated `repeats`
  times in a row (each device's shard is repeated in place)."""
  return jax.tree.map(lambda x: jnp.repeat(x, repeats, axis=0), batch)


def _random_resized(key, n, height, width, scale, ratio=(3 / 4, 4 / 3)):
  """`crop_lib.random_resized_crop` for `n` views: float32[n, 4] x, y, w, h."""
  k_area, k_aspect, k_x, k_y = jax.random.split(key, 4)
  area = height * width
  target = area * jax.random.uniform(
    k_area, (n, ATTEMPTS), minval=scale[0], maxval=scale[1]
  )
  log_r = jnp.log(jnp.asarray(ratio, jnp.float32))
  aspect = jnp.exp(
    jax.random.uniform(
      k_aspect, (n, ATTEMPTS), minval=log_r[0], maxval=log_r[1]
    )
  )
  w = jnp.round(jnp.sqrt(target * aspect))
  h = jnp.round(jnp.sqrt(target / aspect))
  fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
  first = jnp.argmax(fits, axis=1)
  w = jnp.take_along_axis(w, first[:, None], 1)[:, 0]
  h = jnp.take_along_axis(h, first[:, None], 1)[:, 0]
  # The fallback when no attempt fits: the centred frame, aspect clamped.
  in_ratio = width / height
  fw, fh = float(width), float(height)
  if in_ratio < ratio[0]:
    fh = float(round(width / ratio[0]))
  elif in_ratio > ratio[1]:
    fw = float(round(height * ratio[1]))
  ok = fits.any(axis=1)
  w, h = jnp.where(ok, w, fw), jnp.where(ok, h, fh)
  x = jnp.floor(jax.random.uniform(k_x, (n,)) * (width - w + 1))
  y = jnp.floor(jax.random.uniform(k_y, (n,)) * (height - h + 1))
  x = jnp.where(ok, x, (width - fw) // 2)
  y = jnp.where(ok, y, (height - fh) // 2)
  return jnp.stack([x, y, w, h], axis=1)


def _multi_scale(key, n, height, width, size):
  """`crop_lib.multi_scale_crop` (VideoMAE's defaults) for `n` views."""
  out_h, out_w = size
  base = min(height, width)
  sides = [int(base * s) for s in crop_lib.MULTI_SCALE_SCALES]
  hs = [out_h if abs(s - out_h) < 3 else s for s in sides]
  ws = [out_w if abs(s - out_w) < 3 else s for s in sides]
  pairs = [
    (min(w, width), min(h, height))
    for i, h in enumerate(hs)
    for j, w in enumerate(ws)
    if abs(i - j) <= 1
  ]
  offsets = crop_lib.MORE_FIX_CROP_GRID
  k_pair, k_offset = jax.random.split(key)
  wh = jnp.asarray(pairs, jnp.float32)[
    jax.random.randint(k_pair, (n,), 0, len(pairs))
  ]
  grid = jnp.asarray(offsets, jnp.float32)[
    jax.random.randint(k_offset, (n,), 0, len(offsets))
  ]
  steps = jnp.floor((jnp.asarray([width, height], jnp.float32) - wh) / 4)
  return jnp.concatenate([grid * steps, wh], axis=1)


def _center(n, height, width, size):
  """`crop_lib.center_crop` for `n` views."""
  box = crop_lib.center_crop(None, height, width, size)
  return jnp.tile(jnp.asarray([box.box], jnp.float32), (n, 1))


def sample_boxes(
  key: Array, n: int, height: int, width: int, spec: dict
) -> tuple[Array, Array]:
  """Crop boxes and flips of `n` views of a height x width canvas.

  Args:
    key: PRNG key.
    n: views.
    height, width: the canvas.
    spec: `crop`, `crop_scale`, `hflip`, `size` (H, W), as `config.data`.

  Returns:
    (boxes float32[n, 4] as x, y, w, h in canvas pixels, flips bool[n]).
  """
  k_box, k_flip = jax.random.split(key)
  crop = spec["crop"]
  if crop == "random_resized":
    boxes = _random_resized(k_box, n, height, width, tuple(spec["crop_scale"]))
  elif crop == "multi_scale":
    boxes = _multi_scale(k_box, n, height, width, tuple(spec["size"]))
  else:
    boxes = _center(n, height, width, tuple(spec["size"]))
  flips = jax.random.uniform(k_flip, (n,)) < spec["hflip"]
  return boxes, flips


def crop_views(
  video: Array, boxes: Array, flips: Array, size: tuple[int, int]
) -> Array:
  """Each view's box of its clip, resampled to `size`, flipped where asked.

  Args:
    video: uint8[N, T, Hc, Wc, 3] canvases.
    boxes: float32[N, R, 4] x, y, w, h in canvas pixels (R views a clip).
    flips: bool[N, R].
    size: output (H, W).

  Returns:
    uint8[N * R, T, H, W, 3], the views of clip c in rows c*R .. c*R+R-1.
  """
  out_h, out_w = size

  def one(clip, box, flip):
    x, y, w, h = box[0], box[1], box[2], box[3]
    scale = jnp.stack([out_h / h, out_w / w])
    out = jax.image.scale_and_translate(
      clip,
      (clip.shape[0], out_h, out_w, clip.shape[3]),
      spatial_dims=(1, 2),
      scale=scale,
      translation=-jnp.stack([y, x]) * scale,
      method="linear",
      antialias=True,
    )
    out = jnp.where(flip, out[:, :, ::-1], out)
    return jnp.clip(jnp.round(out), 0, 255).astype(jnp.uint8)

  def views_of(clip, boxes, flips):  # The clip converted once for R views.
    return jax.vmap(one, (None, 0, 0))(clip.astype(jnp.float32), boxes, flips)

  out = jax.vmap(views_of)(video, boxes, flips)
  return out.reshape((-1,) + out.shape[2:])


def make_views(
  batch: dict[str, Array], key: Array, repeats: int, spec: dict
) -> dict[str, Array]:
  """The batch of `repeats` views per clip (see the module docstring).

  Args:
    batch: video uint8[N, T, Hc, Wc, 3] canvases, other keys [N, ...].
    key: PRNG key (the step's augment key).
    repeats: R.
    spec: `crop`, `crop_scale`, `hflip`, `size`, as `sample_boxes`.

  Returns:
    The batch with N * R rows; video uint8[N * R, T, H, W, 3].
  """
  video = batch["video"]
  n, _, height, width, _ = video.shape
  boxes, flips = sample_boxes(key, n * repeats, height, width, spec)
  out = repeat_rows({k: v for k, v in batch.items() if k != "video"}, repeats)
  out["video"] = crop_views(
    video,
    boxes.reshape(n, repeats, 4),
    flips.reshape(n, repeats),
    tuple(spec["size"]),
  )
  return out
