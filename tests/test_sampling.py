"""Tests for vidjax.data.sampling: frame ids for segments, strides and views."""

import numpy as np
import pytest

from vidjax.data import sampling


def test_seconds_to_frame_rounds_to_nearest_and_survives_float_error():
  assert sampling.seconds_to_frame(0.0, 30) == 0
  assert (
    sampling.seconds_to_frame(0.1, 30) == 3
  )  # 0.1 * 30 = 3.0000000000000004
  assert sampling.seconds_to_frame(2.9999999999999996 / 30, 30) == 3
  assert sampling.seconds_to_frame(1.0166, 30) == 30  # 30.498
  assert sampling.seconds_to_frame(1.0 + 0.5 / 30, 30) == 31  # halves round up
  assert sampling.seconds_to_frame(14.24, 29.97) == 427  # 426.77
  with pytest.raises(ValueError, match="fps"):
    sampling.seconds_to_frame(1.0, 0)


def test_clip_frame_range_clamps_and_is_never_empty():
  assert sampling.clip_frame_range(1.0, 2.0, 30) == (30, 60)
  assert sampling.clip_frame_range(1.0, 1.0, 30) == (30, 31)
  assert sampling.clip_frame_range(1.0, 9.0, 30, num_frames=100) == (30, 100)
  assert sampling.clip_frame_range(5.0, 9.0, 30, num_frames=100) == (99, 100)
  with pytest.raises(ValueError, match="before its start"):
    sampling.clip_frame_range(2.0, 1.0, 30)


def test_segment_eval_takes_midpoints():
  ids = sampling.segment_frame_ids(100, 132, 8)
  np.testing.assert_array_equal(ids, 100 + np.arange(8) * 4 + 2)
  assert ids.dtype == np.int64
  # Matches AVION's get_frame_ids without jitter (midpoints of linspace, truncated).
  start, end, n = 37, 250, 16
  avion = np.convolve(
    np.linspace(start, end, n + 1), [0.5, 0.5], mode="valid"
  ).astype(int)
  np.testing.assert_array_equal(
    sampling.segment_frame_ids(start, end, n), avion
  )


def test_segment_train_draws_one_frame_per_segment_uniformly():
  rng = np.random.default_rng(0)
  start, end, n = 10, 90, 4  # 20-frame segments
  draws = np.stack(
    [sampling.segment_frame_ids(start, end, n, rng) for _ in range(4000)]
  )
  for i in range(n):
    lo = start + 20 * i
    assert draws[:, i].min() == lo and draws[:, i].max() == lo + 19
    counts = np.bincount(draws[:, i] - lo, minlength=20)
    assert counts.min() > 130  # ~200 each
  assert np.all(np.diff(draws, axis=1) > 0)


def test_segment_short_clip_repeats_frames():
  ids = sampling.segment_frame_ids(5, 8, 8)
  np.testing.assert_array_equal(ids, [5, 5, 5, 6, 6, 7, 7, 7])
  rng = np.random.default_rng(0)
  for _ in range(100):
    ids = sampling.segment_frame_ids(5, 8, 8, rng)
    assert ids.min() >= 5 and ids.max() <= 7 and np.all(np.diff(ids) >= 0)
  np.testing.assert_array_equal(sampling.segment_frame_ids(4, 5, 3), [4, 4, 4])


def test_stride_train_random_start_within_clip():
  rng = np.random.default_rng(0)
  starts = set()
  for _ in range(2000):
    ids = sampling.stride_frame_ids(100, 200, 16, 4, rng)
    np.testing.assert_array_equal(np.diff(ids), 4)
    assert ids[0] >= 100 and ids[-1] + 4 <= 200
    starts.add(int(ids[0]))
  assert starts == set(range(100, 137))  # offsets 0..100-64


def test_stride_eval_is_centred():
  np.testing.assert_array_equal(
    sampling.stride_frame_ids(0, 100, 4, 10), [30, 40, 50, 60]
  )


def test_stride_short_clip_starts_at_zero_and_repeats_last_reachable_frame():
  # 10 frames, 8 x stride 2 = 16 needed: 0 2 4 6 8 then 8 repeated.
  expected = [20, 22, 24, 26, 28, 28, 28, 28]
  np.testing.assert_array_equal(
    sampling.stride_frame_ids(20, 30, 8, 2), expected
  )
  rng = np.random.default_rng(0)
  np.testing.assert_array_equal(
    sampling.stride_frame_ids(20, 30, 8, 2, rng), expected
  )
  np.testing.assert_array_equal(
    sampling.stride_frame_ids(0, 1, 4, 3), [0, 0, 0, 0]
  )


def test_multi_view_spreads_clips_from_start_to_end():
  views = sampling.multi_view_frame_ids(0, 300, 16, 4, 5)
  assert views.shape == (5, 16) and views.dtype == np.int64
  np.testing.assert_array_equal(
    views[:, 0], [0, 56, 116, 176, 236]
  )  # 75 candidates
  assert views[-1, -1] == 296
  np.testing.assert_array_equal(np.diff(views, axis=1), 4)
  # VideoMAE test loader, written out: candidate grid, int(k * step) starts.
  all_index = list(range(0, 300, 4))
  step = max((len(all_index) - 16) / (5 - 1), 0)
  for k in range(5):
    first = int(k * step)
    np.testing.assert_array_equal(views[k], all_index[first : first + 16])


def test_multi_view_short_clip_and_single_view():
  views = sampling.multi_view_frame_ids(10, 20, 8, 2, 3)
  np.testing.assert_array_equal(views, [[10, 12, 14, 16, 18, 18, 18, 18]] * 3)
  one = sampling.multi_view_frame_ids(0, 100, 4, 10, 1)
  np.testing.assert_array_equal(one, [[30, 40, 50, 60]])


@pytest.mark.parametrize(
  "fn,args",
  [
    (sampling.segment_frame_ids, (5, 5, 4)),
    (sampling.stride_frame_ids, (5, 4, 4, 2)),
    (sampling.multi_view_frame_ids, (-1, 4, 4, 2, 2)),
  ],
)
def test_empty_or_negative_ranges_raise(fn, args):
  with pytest.raises(ValueError, match="start_frame < end_frame"):
    fn(*args)
