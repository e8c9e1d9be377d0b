"""Tests for vidjax.data.prefetch: order, exact resume state, errors."""

import grain
import jax.numpy as jnp
import numpy as np
import pytest

from test_sharding import _batches
from vidjax import sharding
from vidjax.data import prefetch


def _grain_iter():
  data = grain.MapDataset.source(_batches(1, b=64)[0]["label"])
  return iter(data.shuffle(seed=3).map(
      lambda x: {"label": np.int32(x),
                 "video": np.full((2, 4, 4, 3), x % 256, np.uint8)}
  ).batch(8).to_iter_dataset())


def test_prefetch_yields_same_batches_in_order():
  mesh = sharding.make_mesh()
  expected = _batches(5)
  it = prefetch.DevicePrefetcher(iter(expected), 2, mesh)
  got = list(it)
  it.close()
  for g, e in zip(got, expected, strict=True):
    assert g["video"].dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(g["video"]), e["video"])
    np.testing.assert_array_equal(np.asarray(g["label"]), e["label"])


@pytest.mark.parametrize("size", [0, 3])
def test_prefetch_state_resumes_at_first_unconsumed_batch(size):
  mesh = sharding.make_mesh()
  reference = [b["label"] for b in _grain_iter()]
  it = prefetch.DevicePrefetcher(_grain_iter(), size, mesh)
  initial_state = it.get_state()
  consumed = [np.asarray(next(it)["label"]) for _ in range(3)]
  state = it.get_state()  # the wrapped iterator itself is further ahead
  it.close()
  for c, r in zip(consumed, reference[:3], strict=True):
    np.testing.assert_array_equal(c, r)

  resumed = _grain_iter()
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["label"], reference[3])
  fresh = _grain_iter()
  fresh.set_state(initial_state)
  np.testing.assert_array_equal(next(fresh)["label"], reference[0])


def test_prefetch_propagates_errors_and_close_stops_thread():
  mesh = sharding.make_mesh()

  def broken():
    yield _batches(1)[0]
    raise RuntimeError("decode failed")

  it = prefetch.DevicePrefetcher(broken(), 2, mesh)
  next(it)
  with pytest.raises(RuntimeError, match="decode failed"):
    next(it)

  def endless():
    while True:
      yield _batches(1)[0]

  it = prefetch.DevicePrefetcher(endless(), 2, mesh)
  next(it)
  it.close()
  assert not it._thread.is_alive()
  with pytest.raises(StopIteration):
    next(it)
