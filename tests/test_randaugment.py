"""RandAugment and random erasing: torchvision parity of every op, one draw
per clip shared by its frames, ranges, determinism, and the k400 hook."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidjax import augment, defaults, randaugment as ra

B, T, H, W = 6, 3, 24, 32
REPO = Path(__file__).resolve().parents[1]


def _clip(seed=0, t=T, h=H, w=W):
  """A smooth uint8 clip (gradients + blobs): realistic histograms."""
  rng = np.random.default_rng(seed)
  ys, xs = np.mgrid[0:h, 0:w]
  frames = []
  for _ in range(t):
    base = (
      rng.uniform(30, 200, 3) + 40 * np.sin(xs / rng.uniform(3, 8))[..., None]
    )
    frames.append(base + 30 * np.cos(ys / rng.uniform(2, 6))[..., None])
  return np.clip(np.stack(frames), 0, 255).astype(np.uint8)


def _torchvision():
  """(torch, torchvision.transforms.functional), imported by the parity test
  only: at collection they would cost seconds in every test process."""
  return (
    pytest.importorskip("torch"),
    pytest.importorskip("torchvision.transforms.functional"),
  )


def _torch(
  clip,
):  # [T, H, W, C] 0-255 -> torchvision's float [T, C, H, W] in [0, 1]
  torch, _ = _torchvision()
  return torch.from_numpy(np.asarray(clip, np.float32) / 255).permute(
    0, 3, 1, 2
  )


def _back(t):
  return t.permute(0, 2, 3, 1).numpy() * 255


def _reference_affine(x, matrix, fill=0.5):
  """pytorchvideo's affine: grid_sample of a centred pixel map, grey fill."""
  torch, _ = _torchvision()
  _, _, h, w = x.shape
  (a, b, c), (d, e, f) = matrix
  # The same map in grid_sample's normalised coordinates (align_corners=False).
  theta = torch.tensor(
    [[a, b * h / w, c / (w / 2)], [d * w / h, e, f / (h / 2)]],
    dtype=torch.float32,
  )[None]
  grid = torch.nn.functional.affine_grid(
    theta, (1, 1, h, w), align_corners=False
  )
  grid = grid.expand(x.shape[0], h, w, 2)
  warped = torch.nn.functional.grid_sample(
    torch.cat([x, torch.ones_like(x[:, :1])], 1), grid, align_corners=False
  )
  mask = warped[:, -1:]
  return warped[:, :-1] * mask + (1 - mask) * fill


def test_every_op_matches_torchvision():
  torch, tvf = _torchvision()
  clip = _clip()
  x, ref = jnp.asarray(clip, jnp.float32), _torch(clip)
  as_uint8 = torch.from_numpy(clip).permute(0, 3, 1, 2)
  op = {
    name: jax.jit(fn) for name, fn in ra._COLOR.items()
  }  # Compiled: faster.
  checks = {
    "brightness": (op["brightness"](x, 1.6), tvf.adjust_brightness(ref, 1.6)),
    "contrast": (op["contrast"](x, 0.4), tvf.adjust_contrast(ref, 0.4)),
    "saturation": (op["saturation"](x, 1.7), tvf.adjust_saturation(ref, 1.7)),
    "sharpness": (op["sharpness"](x, 0.3), tvf.adjust_sharpness(ref, 0.3)),
    "autocontrast": (op["autocontrast"](x, 0), tvf.autocontrast(ref)),
    "equalize": (op["equalize"](x, 0), tvf.equalize(as_uint8).float() / 255),
    "invert": (op["invert"](x, 0), tvf.invert(ref)),
    "posterize": (
      op["posterize"](x, 2),
      tvf.posterize(as_uint8, 2).float() / 255,
    ),
    "solarize": (op["solarize"](x, 255 * 0.4), tvf.solarize(ref, 0.4)),
  }
  warp = jax.jit(
    lambda x, name, value: ra.affine(x, ra.geometric_matrix(name, value, H, W)),
    static_argnums=1,
  )
  checks["rotate"] = (
    warp(x, "rotate", 17.0),
    tvf.rotate(ref, 17.0, tvf.InterpolationMode.BILINEAR, fill=[0.5] * 3),
  )
  for name, scale in (
    ("shear_x", 0.21),
    ("shear_y", -0.21),
    ("translate_x", 0.3),
    ("translate_y", -0.2),
  ):
    matrix = np.asarray(ra.geometric_matrix(name, scale, H, W))
    checks[name] = (warp(x, name, scale), _reference_affine(ref, matrix))
  assert set(checks) == set(ra.OPS)
  for name, (got, want) in checks.items():
    assert got.shape == clip.shape and got.dtype == jnp.float32, name
    np.testing.assert_allclose(
      np.asarray(got), _back(want), atol=0.05, err_msg=name
    )


def test_op_levels_follow_pytorchvideo():
  level, sign = jnp.float32(7.0), jnp.float32(-1.0)
  assert float(ra.op_value("contrast", level, sign)) == pytest.approx(1 - 0.63)
  assert float(ra.op_value("rotate", level, sign)) == pytest.approx(-21.0)
  assert int(ra.op_value("posterize", level, sign)) == 2  # 4 - int(2.8)
  assert float(ra.op_value("solarize", level, sign)) == pytest.approx(255 * 0.3)
  assert float(ra.op_value("translate_y", level, 1.0)) == pytest.approx(0.315)
  assert ra.op_value("equalize", level, sign) is None


@pytest.fixture(scope="module")
def jitted():
  return (
    jax.jit(lambda v, k: ra.rand_augment(v, k)),
    jax.jit(
      lambda v, k: ra.random_erase(
        v, k, prob=0.5, mean=defaults.IMAGENET_MEAN, std=defaults.IMAGENET_STD
      )
    ),
  )


def test_rand_augment_one_draw_per_clip(jitted):
  rand_augment, _ = jitted
  still = np.stack([np.repeat(_clip(seed=i, t=1), T, axis=0) for i in range(B)])
  video = jnp.asarray(still)  # Every frame of a clip alike.
  out = np.asarray(rand_augment(video, jax.random.key(0)))
  assert out.shape == video.shape and out.dtype == np.float32
  assert out.min() >= 0 and out.max() <= 255
  # The same ops, levels and geometry for all frames: they stay alike.
  np.testing.assert_array_equal(out, np.repeat(out[:, :1], T, axis=1))
  np.testing.assert_array_equal(out, rand_augment(video, jax.random.key(0)))
  # Clips draw independently: the same clip repeated comes out differently.
  same = jnp.asarray(np.repeat(still[:1], B, axis=0))
  many = np.asarray(rand_augment(same, jax.random.key(1)))
  assert len({m.tobytes() for m in many}) > B // 2
  assert not np.array_equal(many, rand_augment(same, jax.random.key(2)))


def test_random_erase_one_box_per_clip(jitted):
  _, erase = jitted
  video = jnp.asarray(np.stack([_clip(seed=i) for i in range(64)]))
  out = np.asarray(erase(video, jax.random.key(0)))
  np.testing.assert_array_equal(out, erase(video, jax.random.key(0)))
  changed = np.any(
    out != np.asarray(video, np.float32), axis=-1
  )  # [B, T, H, W]
  erased = changed.any(axis=(1, 2, 3))
  assert 16 < erased.sum() < 48  # p = 0.5.
  noise = []
  for i in np.flatnonzero(erased):
    box = changed[i].any(axis=0)
    ys, xs = np.nonzero(box)
    # A rectangle, the same in every frame, of 2%-33% of the frame.
    assert box[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1].all()
    assert 0.02 * H * W - W <= box.sum() <= H * W / 3 + W
    inside = out[i][:, box]  # [T, pixels, C]
    noise.append(
      (inside / 255 - np.array(defaults.IMAGENET_MEAN))
      / np.array(defaults.IMAGENET_STD)
    )
    assert not np.array_equal(
      inside[0], inside[1]
    )  # Per-pixel, per-frame noise.
  noise = np.concatenate([n.reshape(-1) for n in noise])
  assert (
    abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05
  )  # N(0, 1) once normalised.


def test_config_keys_turn_them_on():
  assert (
    ra.make_clip_augment(
      defaults.augment_config(), defaults.CLIP_MEAN, defaults.CLIP_STD
    )
    is None
  )
  with pytest.raises(ValueError, match="erase_mode"):
    augment.make_augment({"erase_prob": 0.5, "erase_mode": "blur"})
  # The recipe's values; `k400_ft.py:debug` trains with them (test_configs).
  from vidjax import config as config_lib

  k400 = config_lib.load_config(str(REPO / "configs/k400_ft.py")).augment
  assert (
    k400.randaugment_layers,
    k400.randaugment_magnitude,
    k400.erase_prob,
    k400.erase_mode,
  ) == (4, 7, 0.25, "pixel")
  assert ra.make_clip_augment(k400, k400.mean, k400.std) is not None
