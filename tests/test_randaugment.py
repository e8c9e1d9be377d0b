"""RandAugment and random erasing: torchvision parity of every op, one draw
per clip shared by its frames, ranges, determinism, and the k400 hook."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reference import make_reference
from vidjax import augment
from vidjax.augment import randaugment as ra
from vidjax.config import defaults

B, T, H, W = 6, 3, 24, 32
REPO = Path(__file__).resolve().parents[1]


_clip = make_reference.smooth_clip  # [T, H, W, 3] uint8


def test_every_op_matches_torchvision():
  """Each op against torchvision's (pytorchvideo's affine for the warps),
  as committed by make_reference.randaugment_ops."""
  want = make_reference.committed("randaugment_ops")
  clip = want["clip"]
  assert clip.shape == (T, H, W, 3)
  np.testing.assert_array_equal(clip, _clip())
  x = jnp.asarray(clip, jnp.float32)
  op = {
    name: jax.jit(fn) for name, fn in ra._COLOR.items()
  }  # Compiled: faster.
  got = {
    "brightness": op["brightness"](x, 1.6),
    "contrast": op["contrast"](x, 0.4),
    "saturation": op["saturation"](x, 1.7),
    "sharpness": op["sharpness"](x, 0.3),
    "autocontrast": op["autocontrast"](x, 0),
    "equalize": op["equalize"](x, 0),
    "invert": op["invert"](x, 0),
    "posterize": op["posterize"](x, 2),
    "solarize": op["solarize"](x, 255 * 0.4),
  }
  warp = jax.jit(
    lambda x, name, value: ra.affine(x, ra.geometric_matrix(name, value, H, W)),
    static_argnums=1,
  )
  got["rotate"] = warp(x, "rotate", 17.0)
  for name, scale in make_reference.WARPS:
    np.testing.assert_allclose(
      np.asarray(ra.geometric_matrix(name, scale, H, W)),
      want[f"matrix/{name}"],
      rtol=1e-6,
      err_msg=name,
    )
    got[name] = warp(x, name, scale)
  assert set(got) == set(ra.OPS)
  for name, value in got.items():
    assert value.shape == clip.shape and value.dtype == jnp.float32, name
    np.testing.assert_allclose(
      np.asarray(value), want[name], atol=0.05, err_msg=name
    )


@pytest.mark.parity
def test_the_committed_ops_are_torchvisions():
  make_reference.check_live("randaugment_ops", rtol=1e-6, atol=1e-4)


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
