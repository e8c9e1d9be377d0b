"""Tests for vidjax.data.crop: boxes stay in the frame and follow each recipe."""

import numpy as np
import pytest

from reference import make_reference
from vidjax.data import crop as crop_lib
from vidjax.data.crop import Crop


def _inside(c: Crop, height: int, width: int) -> bool:
  return (
    c.x >= 0
    and c.y >= 0
    and c.w >= 1
    and c.h >= 1
    and c.x + c.w <= width
    and c.y + c.h <= height
  )


@pytest.mark.parametrize(
  "height,width", [(320, 568), (568, 320), (256, 256), (31, 47)]
)
def test_random_resized_crop_boxes_follow_scale_and_ratio(height, width):
  rng = np.random.default_rng(0)
  scale, ratio = (0.5, 1.0), (3 / 4, 4 / 3)
  for _ in range(500):
    c = crop_lib.random_resized_crop(
      rng, height, width, scale=scale, ratio=ratio
    )
    assert _inside(c, height, width)
    assert all(isinstance(v, int) for v in c.box)
    if (c.x, c.y) != (
      (width - c.w) // 2,
      (height - c.h) // 2,
    ):  # not the fallback
      # Rounding each side moves area and ratio by up to about one pixel.
      tol = 2.5 / min(c.w, c.h)
      assert (
        scale[0] * (1 - tol) ** 2
        <= c.w * c.h / (height * width)
        <= scale[1] * (1 + tol) ** 2
      )
      assert ratio[0] * (1 - tol) <= c.w / c.h <= ratio[1] * (1 + tol)


def test_random_resized_crop_covers_positions_and_is_reproducible():
  boxes = [
    crop_lib.random_resized_crop(
      np.random.default_rng(s), 320, 568, scale=(0.5, 1.0)
    )
    for s in range(200)
  ]
  assert len({b.x for b in boxes}) > 50 and len({b.y for b in boxes}) > 20
  again = [
    crop_lib.random_resized_crop(
      np.random.default_rng(s), 320, 568, scale=(0.5, 1.0)
    )
    for s in range(200)
  ]
  assert boxes == again


def test_random_resized_crop_fallback_is_centred_with_clamped_ratio():
  # A 10:1 strip never fits a box of ratio <= 4/3 with >= 90% of its area.
  rng = np.random.default_rng(0)
  c = crop_lib.random_resized_crop(rng, 40, 400, scale=(0.9, 1.0))
  assert (c.w, c.h) == (round(40 * 4 / 3), 40)
  assert (c.x, c.y) == ((400 - c.w) // 2, 0)
  tall = crop_lib.random_resized_crop(rng, 400, 40, scale=(0.9, 1.0))
  assert (tall.w, tall.h) == (40, round(40 / (3 / 4)))
  assert (tall.x, tall.y) == (0, (400 - tall.h) // 2)


def test_random_resized_crop_fallback_matches_torchvision():
  """As torchvision's get_params falls back (make_reference.crop_fallback)."""
  want = make_reference.committed("crop_fallback")["boxes"]
  for (height, width), box in zip(make_reference.CROP_FRAMES, want):
    c = crop_lib.random_resized_crop(
      np.random.default_rng(0), height, width, scale=(0.95, 1.0)
    )
    assert (c.y, c.x, c.h, c.w) == tuple(box)


@pytest.mark.parity
def test_the_committed_fallbacks_are_torchvisions():
  make_reference.check_live("crop_fallback")


def test_flip_probability():
  rng = np.random.default_rng(1)
  flips = [
    crop_lib.random_resized_crop(rng, 100, 100, flip_prob=0.5).hflip
    for _ in range(2000)
  ]
  assert 0.45 < np.mean(flips) < 0.55
  assert not any(
    crop_lib.center_crop(None, 100, 100, 64).hflip for _ in range(3)
  )
  assert crop_lib.center_crop(rng, 100, 100, 64, flip_prob=1.0).hflip
  with pytest.raises(ValueError, match="needs an rng"):
    crop_lib.center_crop(None, 100, 100, 64, flip_prob=0.5)


def test_center_crop_is_largest_centred_window_with_output_aspect():
  assert crop_lib.center_crop(None, 320, 568, 224) == Crop(124, 0, 320, 320)
  assert crop_lib.center_crop(None, 568, 320, (224, 224)) == Crop(
    0, 124, 320, 320
  )
  # Output 9:16 (H, W) from a 4:3 frame: full width, trimmed height.
  c = crop_lib.center_crop(None, 480, 640, (180, 320))
  assert (c.w, c.h, c.x, c.y) == (640, 360, 0, 60)
  # Output wider than the frame's aspect: full height.
  c = crop_lib.center_crop(None, 480, 640, (100, 400))
  assert (c.w, c.h) == (640, 160) and c.y == 160
  c = crop_lib.center_crop(None, 480, 640, (400, 100))
  assert (c.w, c.h, c.x, c.y) == (120, 480, 260, 0)


def test_spatial_views_left_centre_right_and_top_middle_bottom():
  views = crop_lib.spatial_views(320, 568, 224)
  assert [v.box for v in views] == [
    (0, 0, 320, 320),
    (124, 0, 320, 320),
    (248, 0, 320, 320),
  ]
  views = crop_lib.spatial_views(568, 320, 224)
  assert [v.box for v in views] == [
    (0, 0, 320, 320),
    (0, 124, 320, 320),
    (0, 248, 320, 320),
  ]
  assert crop_lib.spatial_views(320, 568, 224, 1) == [
    crop_lib.center_crop(None, 320, 568, 224)
  ]
  # Five views on a 100-pixel slack: VideoMAE's int(k * step).
  assert [v.x for v in crop_lib.spatial_views(200, 300, 200, 5)] == [
    0,
    25,
    50,
    75,
    100,
  ]


def test_multi_scale_crop_sizes_and_offsets_follow_videomae():
  height, width, size = 320, 568, 224
  sides = [
    int(320 * s) for s in crop_lib.MULTI_SCALE_SCALES
  ]  # 320, 280, 240, 211
  allowed_pairs = {
    (sides[j], sides[i]) for i in range(4) for j in range(4) if abs(i - j) <= 1
  }
  seen_pairs, seen_offsets = set(), set()
  rng = np.random.default_rng(0)
  for _ in range(3000):
    c = crop_lib.multi_scale_crop(rng, height, width, size)
    assert _inside(c, height, width)
    seen_pairs.add((c.w, c.h))
    step_x, step_y = (width - c.w) // 4, (height - c.h) // 4
    gx, gy = c.x / step_x, (c.y / step_y if step_y else 0)
    assert gx in range(5) and gy in range(5)
    seen_offsets.add((int(gx), int(gy)))
  assert seen_pairs == allowed_pairs  # 10 pairs with max_distort=1
  # 13 grid positions with more_fix_crop (only 5 rows/cols exist, y may be 0).
  assert {(0, 0), (4, 0), (2, 2), (1, 1), (3, 3), (2, 4)} <= seen_offsets
  five = {
    (c.x, c.y, c.w, c.h)
    for c in (
      crop_lib.multi_scale_crop(rng, height, width, size, more_fix_crop=False)
      for _ in range(2000)
    )
  }
  for x, y, w, h in five:
    sx, sy = (width - w) // 4, (height - h) // 4
    assert (x, y) in {
      (0, 0),
      (4 * sx, 0),
      (0, 4 * sy),
      (4 * sx, 4 * sy),
      (2 * sx, 2 * sy),
    }


def test_multi_scale_crop_snaps_near_output_size():
  # Short side 258 gives sides 258, 225, 193, 170; 225 is within 3 pixels of
  # the output side 224, so it snaps to 224.
  assert int(258 * 0.875) == 225
  rng = np.random.default_rng(0)
  sides = {crop_lib.multi_scale_crop(rng, 258, 400, 224).h for _ in range(500)}
  assert sides == {258, 224, 193, 170}


def test_multi_scale_crop_random_offsets_without_fix_crop():
  rng = np.random.default_rng(0)
  xs = {
    crop_lib.multi_scale_crop(rng, 320, 568, 224, fix_crop=False).x
    for _ in range(500)
  }
  assert len(xs) > 100
