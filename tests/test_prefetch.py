"""Tests for vidjax.data.prefetch: order, exact resume state, errors."""

import threading

import grain
import jax.numpy as jnp
import numpy as np
import pytest

from test_sharding import _batches
from vidjax import sharding
from vidjax.data import pipeline, prefetch


def _grain_iter():
  data = grain.MapDataset.source(_batches(1, b=64)[0]["label"])
  return iter(
    data.shuffle(seed=3)
    .map(
      lambda x: {
        "label": np.int32(x),
        "video": np.full((2, 4, 4, 3), x % 256, np.uint8),
      }
    )
    .batch(8)
    .to_iter_dataset()
  )


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


def test_pipeline_close_stops_grain_when_the_thread_waits_on_it(monkeypatch):
  """The thread may be waiting in Grain's next() for a stuck worker: closing
  Grain ends that wait, so close() neither hangs nor gives up."""
  monkeypatch.setattr(pipeline.Pipeline, "FIRST_WAIT_S", 0.1)
  warnings = []
  monkeypatch.setattr(
    prefetch.logging, "warning", lambda fmt, *args: warnings.append(fmt % args)
  )

  class WaitingHost:  # Its next() returns only once closed, as Grain's.
    def __init__(self):
      self.closed = threading.Event()

    def __next__(self):
      self.closed.wait()
      raise ValueError("Attempting to use a closed iterator.")

    def get_state(self):
      return {}

    def close(self):
      self.closed.set()

  host = WaitingHost()
  pipe = pipeline.Pipeline(host, 2, sharding.make_mesh())
  closer = threading.Thread(target=pipe.close, daemon=True)
  closer.start()
  closer.join(2 * prefetch.CLOSE_TIMEOUT_S)  # Only if close() hangs.
  assert not closer.is_alive() and not pipe._thread.is_alive()
  assert host.closed.is_set() and not warnings
