"""RandAugment and random erasing for video batches, jitted on the device.

AVION's Kinetics fine-tuning (scripts/main_videomae_finetune.py, after
VideoMAE) augments each training clip with RandAugment(magnitude=7,
num_layers=4), pytorchvideo's video version, then random erasing with
probability 0.25 in 'pixel' mode with one box for the whole clip ('cube').
Both are written here for the global uint8/float batch, one independent draw
per clip, the same draw for every frame of a clip:

RandAugment: each clip draws `num_layers` distinct ops of the 14 below (as
pytorchvideo; timm's `rand-m7-n4-mstd0.5-inc1`, VideoMAE's, has the same
family plus SolarizeAdd, drawn with replacement). Each op runs with
probability `prob` (0.5) at a level ~ N(magnitude, std=0.5) clipped to
[0, 10], negated half the time for the signed ops:

  brightness, contrast, saturation, sharpness   factor 1 +- 0.9 level/10
  autocontrast, equalize, invert
  rotate                                        +- 30 level/10 degrees
  posterize                                     4 - int(0.4 level) bits
  solarize                                      invert above 255 (1 - level/10)
  shear_x, shear_y                              +- 0.3 level/10
  translate_x, translate_y                      +- 0.45 level/10 of the side

Statistics are per frame, as torchvision computes them on a (T, C, H, W)
clip: contrast's mean grey level, and per channel autocontrast's range and
equalize's histogram. Geometric ops sample bilinearly and fill with grey
(127.5). Every op matches torchvision's (which pytorchvideo calls) to float
rounding (tests/test_randaugment.py).

Random erasing (timm's, AVION's `cube=True`): with probability `prob` a box
of area U(0.02, 1/3) of the frame and aspect exp(U(log 0.3, log 1/0.3)) (up
to 100 tries to fit) is filled, in every frame, with per-pixel N(0, 1) noise
in normalised units ('pixel'), one colour per frame ('rand') or the mean
('const').

Videos are on the 0-255 scale in and out (float32 out); erasing writes its
noise already on that scale, `(noise * std + mean) * 255`, so that the later
normalisation turns it into N(0, 1) exactly as AVION's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import math

import jax
import jax.numpy as jnp

from vidjax.config import defaults

Array = jax.Array

OPS = (
  "brightness",
  "contrast",
  "saturation",
  "sharpness",
  "autocontrast",
  "equalize",
  "invert",
  "rotate",
  "posterize",
  "solarize",
  "shear_x",
  "shear_y",
  "translate_x",
  "translate_y",
)
GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
FILL = 127.5  # pytorchvideo's fill 0.5 on the 0-1 scale.
_GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights.


# ------------------------------------------------- ops on one clip [T,H,W,C]


def _blend(a: Array, b: Array, factor) -> Array:
  return jnp.clip(factor * a + (1.0 - factor) * b, 0.0, 255.0)


def _gray(x: Array) -> Array:
  return jnp.tensordot(x, jnp.asarray(_GRAY, x.dtype), axes=1)[..., None]


def brightness(x: Array, factor) -> Array:
  return _blend(x, 0.0, factor)


def contrast(x: Array, factor) -> Array:
  return _blend(x, _gray(x).mean(axis=(1, 2, 3), keepdims=True), factor)


def saturation(x: Array, factor) -> Array:
  return _blend(x, _gray(x), factor)


def sharpness(x: Array, factor) -> Array:
  """Blend with a 3x3 smoothing of the interior (borders kept), as PIL."""
  weights = jnp.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], x.dtype) / 13.0
  h, w = x.shape[1:3]
  smooth = sum(
    weights[dy, dx] * x[:, dy : h - 2 + dy, dx : w - 2 + dx]
    for dy in range(3)
    for dx in range(3)
  )
  return _blend(x, x.at[:, 1:-1, 1:-1].set(smooth), factor)


def autocontrast(x: Array) -> Array:
  lo = x.min(axis=(1, 2), keepdims=True)
  hi = x.max(axis=(1, 2), keepdims=True)
  flat = hi <= lo
  scale = jnp.where(flat, 1.0, 255.0 / jnp.where(flat, 1.0, hi - lo))
  return jnp.clip((x - jnp.where(flat, 0.0, lo)) * scale, 0.0, 255.0)


def _equalize_channel(v: Array) -> Array:
  """torchvision's equalize of one uint8-valued channel (int32[H, W])."""
  hist = jnp.zeros(256, jnp.int32).at[v.reshape(-1)].add(1)
  last = 255 - jnp.argmax(hist[::-1] > 0)  # The brightest value present.
  step = (v.size - hist[last]) // 255
  safe = jnp.maximum(step, 1)
  lut = (jnp.cumsum(hist) + safe // 2) // safe
  lut = jnp.clip(jnp.concatenate([jnp.zeros(1, lut.dtype), lut[:-1]]), 0, 255)
  return jnp.where(step == 0, v, lut[v])


def equalize(x: Array) -> Array:
  v = jnp.clip(x, 0, 255).astype(jnp.int32)  # As uint8 (truncated).
  per_frame = jax.vmap(jax.vmap(_equalize_channel, in_axes=-1, out_axes=-1))
  return per_frame(v).astype(x.dtype)


def invert(x: Array) -> Array:
  return 255.0 - x


def posterize(x: Array, bits) -> Array:
  v = jnp.clip(x, 0, 255).astype(jnp.int32)
  mask = 256 - jnp.left_shift(1, 8 - jnp.asarray(bits, jnp.int32))
  return jnp.bitwise_and(v, mask).astype(x.dtype)


def solarize(x: Array, threshold) -> Array:
  """Inverts the pixels >= `threshold` (0-255 scale)."""
  return jnp.where(x >= threshold, 255.0 - x, x)


def affine(x: Array, matrix: Array, fill: float = FILL) -> Array:
  """Bilinear warp of every frame by a 2x3 inverse map, grey outside.

  `matrix` maps an output pixel's centre, in pixels from the frame's centre
  (x right, y down), to where it samples the input (pytorchvideo's and
  torchvision's convention).
  """
  h, w = x.shape[1:3]
  ys, xs = jnp.meshgrid(
    jnp.arange(h) + 0.5 - h / 2, jnp.arange(w) + 0.5 - w / 2, indexing="ij"
  )
  points = jnp.stack([xs, ys, jnp.ones_like(xs)], axis=-1) @ matrix.T
  u, v = points[..., 0] + w / 2 - 0.5, points[..., 1] + h / 2 - 0.5
  u0, v0 = jnp.floor(u), jnp.floor(v)
  out = jnp.zeros_like(x)
  coverage = jnp.zeros((h, w), x.dtype)
  for dv in (0, 1):
    for du in (0, 1):
      ui, vi = u0 + du, v0 + dv
      weight = (1 - jnp.abs(u - ui)) * (1 - jnp.abs(v - vi))
      weight = jnp.where(
        (ui >= 0) & (ui < w) & (vi >= 0) & (vi < h), weight, 0.0
      )
      pixels = x[
        :,
        jnp.clip(vi, 0, h - 1).astype(jnp.int32),
        jnp.clip(ui, 0, w - 1).astype(jnp.int32),
      ]
      out = out + weight[None, :, :, None] * pixels
      coverage = coverage + weight
  # torchvision (so pytorchvideo) weighs the zero-padded sample by the
  # coverage once more at the borders; kept so that the result is theirs.
  coverage = coverage[None, :, :, None]
  return out * coverage + (1.0 - coverage) * fill


def geometric_matrix(op: str, value, height: int, width: int) -> Array:
  """float32[2, 3] inverse map of a geometric op at `value` (see OPS)."""
  value = jnp.asarray(value, jnp.float32)
  one, zero = jnp.ones_like(value), jnp.zeros_like(value)
  if op == "rotate":  # Counter-clockwise by `value` degrees.
    c, s = jnp.cos(jnp.radians(value)), jnp.sin(jnp.radians(value))
    rows = ((c, -s, zero), (s, c, zero))
  elif op == "shear_x":  # Top row fixed, as PIL.
    rows = ((one, value, value * height / 2), (zero, one, zero))
  elif op == "shear_y":  # Left column fixed.
    rows = ((one, zero, zero), (value, one, value * width / 2))
  elif op == "translate_x":  # `value` of the width.
    rows = ((one, zero, value * width), (zero, one, zero))
  elif op == "translate_y":
    rows = ((one, zero, zero), (zero, one, value * height))
  else:
    raise ValueError(f"randaugment: {op!r} is not a geometric op")
  return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def op_value(op: str, level, sign):
  """pytorchvideo's level (0-10) -> argument of `op` (see the docstring)."""
  frac = level / 10.0
  return {
    "brightness": 1 + sign * 0.9 * frac,
    "contrast": 1 + sign * 0.9 * frac,
    "saturation": 1 + sign * 0.9 * frac,
    "sharpness": 1 + sign * 0.9 * frac,
    "rotate": sign * 30.0 * frac,
    "posterize": 4 - jnp.floor(4.0 * frac).astype(jnp.int32),
    "solarize": 255.0 * (1.0 - frac),
    "shear_x": sign * 0.3 * frac,
    "shear_y": sign * 0.3 * frac,
    "translate_x": sign * 0.45 * frac,
    "translate_y": sign * 0.45 * frac,
  }.get(op)


_COLOR = {
  "brightness": brightness,
  "contrast": contrast,
  "saturation": saturation,
  "sharpness": sharpness,
  "autocontrast": lambda x, _: autocontrast(x),
  "equalize": lambda x, _: equalize(x),
  "invert": lambda x, _: invert(x),
  "posterize": posterize,
  "solarize": solarize,
}


# ----------------------------------------------------------- on the batch


def rand_augment(
  video: Array,
  key: Array,
  *,
  magnitude: float = 7.0,
  num_layers: int = 4,
  prob: float = 0.5,
  std: float = 0.5,
) -> Array:
  """RandAugment with one op sequence per clip (see the module docstring).

  Args:
    video: [B, T, H, W, 3] uint8 or float on the 0-255 scale.
    key: PRNG key; clips draw independently.
    magnitude: mean level (0-10); AVION 7.
    num_layers: ops per clip, distinct; AVION 4.
    prob: probability that each drawn op runs.
    std: standard deviation of the level around `magnitude`.

  Returns:
    float32[B, T, H, W, 3] in [0, 255].
  """
  b, _, h, w, _ = video.shape
  if not 0 < num_layers <= len(OPS):
    raise ValueError(
      f"randaugment: num_layers={num_layers} must be in 1..{len(OPS)}"
    )
  k_ops, k_apply, k_level, k_sign = jax.random.split(key, 4)
  # Distinct ops per clip: the first num_layers of a random permutation.
  ops = jnp.argsort(jax.random.uniform(k_ops, (b, len(OPS))), axis=1)
  ops = ops[:, :num_layers]
  apply = jax.random.uniform(k_apply, (b, num_layers)) < prob
  level = jnp.clip(
    magnitude + std * jax.random.normal(k_level, (b, num_layers)), 0.0, 10.0
  )
  sign = jnp.where(
    jax.random.bernoulli(k_sign, 0.5, (b, num_layers)), 1.0, -1.0
  )
  warp = jax.vmap(affine)

  def layer(x, draws):  # One op per clip; a scan compiles it once.
    op, on, lv, sg = draws
    chosen = {name: on & (op == i) for i, name in enumerate(OPS)}
    # One warp per layer: the clip's geometric op as a matrix (or identity).
    matrix = jnp.broadcast_to(jnp.eye(2, 3), (b, 2, 3))
    for name in GEOMETRIC:
      m = geometric_matrix(name, op_value(name, lv, sg), h, w)
      matrix = jnp.where(chosen[name][:, None, None], m, matrix)
    is_geometric = sum(chosen[name] for name in GEOMETRIC) > 0
    out = jnp.where(is_geometric[:, None, None, None, None], warp(x, matrix), x)
    for name, fn in _COLOR.items():
      value = op_value(name, lv, sg)
      y = jax.vmap(fn)(x, jnp.zeros(b) if value is None else value)
      out = jnp.where(chosen[name][:, None, None, None, None], y, out)
    return out, None

  draws = tuple(a.T for a in (ops, apply, level, sign))  # [layers, B] each
  out = jax.lax.scan(layer, video.astype(jnp.float32), draws)[0]
  return jnp.clip(out, 0.0, 255.0)  # Bilinear rounding can step out by 1e-6.


def random_erase(
  video: Array,
  key: Array,
  *,
  prob: float = 0.25,
  mode: str = "pixel",
  mean: Sequence[float] = (0.5,) * 3,
  std: Sequence[float] = (0.5,) * 3,
  min_area: float = 0.02,
  max_area: float = 1 / 3,
  min_aspect: float = 0.3,
  attempts: int = 100,
) -> Array:
  """Random erasing with one box per clip for all its frames (timm, cube).

  Args:
    video: [B, T, H, W, C] on the 0-255 scale.
    key: PRNG key; clips draw independently.
    prob: probability that a clip is erased.
    mode: 'pixel' (per-pixel N(0, 1) noise in normalised units), 'rand' (one
      N(0, 1) colour per frame) or 'const' (0, i.e. the mean).
    mean, std: the normalisation that follows (0-1 scale), so that the noise
      lands as N(0, 1) after it.
    min_area, max_area: box area range, as fractions of the frame.
    min_aspect: aspect ratio range [min_aspect, 1 / min_aspect], log-uniform.
    attempts: draws of (area, aspect) until the box fits in the frame.

  Returns:
    float32[B, T, H, W, C]: erased boxes hold noise on the 0-255 scale.
  """
  if mode not in defaults.ERASE_MODES:
    raise ValueError(
      f"random erasing: mode must be one of {defaults.ERASE_MODES}, "
      f"got {mode!r}"
    )
  b, t, h, w, c = video.shape
  k_apply, k_area, k_aspect, k_top, k_left, k_fill = jax.random.split(key, 6)
  area = jax.random.uniform(
    k_area, (b, attempts), minval=min_area, maxval=max_area
  ) * (h * w)
  aspect = jnp.exp(
    jax.random.uniform(
      k_aspect,
      (b, attempts),
      minval=math.log(min_aspect),
      maxval=-math.log(min_aspect),
    )
  )
  box_h = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
  box_w = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
  fits = (box_h < h) & (box_w < w)
  first = jnp.argmax(fits, axis=1)[:, None]  # The first try that fits.
  box_h = jnp.take_along_axis(box_h, first, 1)[:, 0]
  box_w = jnp.take_along_axis(box_w, first, 1)[:, 0]
  top = jnp.floor(jax.random.uniform(k_top, (b,)) * (h - box_h + 1))
  left = jnp.floor(jax.random.uniform(k_left, (b,)) * (w - box_w + 1))
  erase = (jax.random.uniform(k_apply, (b,)) < prob) & fits.any(axis=1)
  ys, xs = jnp.arange(h)[None, :, None], jnp.arange(w)[None, None, :]
  in_box = (
    (ys >= top[:, None, None])
    & (ys < (top + box_h)[:, None, None])
    & (xs >= left[:, None, None])
    & (xs < (left + box_w)[:, None, None])
    & erase[:, None, None]
  )
  shape = {
    "pixel": video.shape,
    "rand": (b, t, 1, 1, c),
    "const": (1, 1, 1, 1, c),
  }[mode]
  noise = (
    jax.random.normal(k_fill, shape) if mode != "const" else jnp.zeros(shape)
  )
  fill = (noise * jnp.asarray(std) + jnp.asarray(mean)) * 255.0
  return jnp.where(in_box[:, None, :, :, None], fill, video.astype(jnp.float32))


def make_clip_augment(
  config, mean: Sequence[float], std: Sequence[float]
) -> Callable[[Array, Array], Array] | None:
  """`fn(video, key)` applying RandAugment then random erasing, or None.

  Config keys (a full `config.augment`, see
  `vidjax.config.defaults.augment_config`): randaugment_layers (0 = off;
  AVION 4), randaugment_magnitude (7), randaugment_prob (0.5),
  randaugment_std (0.5), erase_prob (0 = off; AVION 0.25), erase_mode
  ('pixel').
  """
  layers, erase_prob = (
    int(config["randaugment_layers"]),
    float(config["erase_prob"]),
  )
  if not layers and not erase_prob:
    return None
  magnitude = float(config["randaugment_magnitude"])
  prob, std_level = (
    float(config["randaugment_prob"]),
    float(config["randaugment_std"]),
  )
  mode = str(config["erase_mode"])
  if mode not in defaults.ERASE_MODES:
    raise ValueError(
      f"augment: erase_mode must be one of {defaults.ERASE_MODES}, got {mode!r}"
    )

  def clip_augment(video: Array, key: Array) -> Array:
    k_ra, k_erase = jax.random.split(key)
    if layers:
      video = rand_augment(
        video,
        k_ra,
        magnitude=magnitude,
        num_layers=layers,
        prob=prob,
        std=std_level,
      )
    if erase_prob:
      video = random_erase(
        video, k_erase, prob=erase_prob, mode=mode, mean=mean, std=std
      )
    return video

  return clip_augment
