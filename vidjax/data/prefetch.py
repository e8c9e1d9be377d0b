"""Device prefetch: the next global batches already on their way to the devices.

The last stage of the input pipeline (`vidjax.data.pipeline`): a thread
assembles the host's local batches into global `jax.Array`s, so that the
transfers overlap the training step, and keeps the iterator state of the
last batch handed out, for an exact resume. Waiting for a batch
(`next_batch`) warns every `stall_warn_s` seconds while none comes, saying
what it waits on (`waiting_on`), and gives up when asked to (a signal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
import queue
import threading
import time

from absl import logging
import jax
from jax.sharding import Mesh
import numpy as np

from vidjax import sharding

_END = object()
CLOSE_TIMEOUT_S = 30.0  # At most this long waiting for the thread to stop.
POLL_S = 0.25  # How often a wait for a batch looks up (stall, interrupt).


class DevicePrefetcher:
  """Keeps the next `size` batches on their way to the devices.

  A background thread pulls local batches from `iterator`, turns them into
  global arrays (`sharding.host_to_global_batch`, asynchronous device
  transfers) and queues them. Use it instead of the iterator it wraps;
  don't touch that iterator while the prefetcher runs. `size=0` transfers
  synchronously in `next()` (no thread, no stall warning), for debugging.

  Checkpointing: the wrapped iterator runs ahead by up to `size + 1`
  batches, so its own `get_state()` would skip them on resume. Save
  `prefetcher.get_state()` instead: the iterator's state captured right
  after it produced the last batch *returned by* `next()`, so restoring
  it makes the iterator yield exactly the first batch not yet consumed.
  """

  def __init__(
    self,
    iterator: Iterator[Mapping[str, np.ndarray]],
    size: int,
    mesh: Mesh,
    *,
    stall_warn_s: float = 60.0,
    name: str = "training",
  ):
    self._iterator = iterator
    self.stall_warn_s, self.name = stall_warn_s, name
    self.interrupted = False  # `next_batch` gave up on a batch.
    self._mesh = mesh
    self._has_state = hasattr(iterator, "get_state")
    self._state = self._capture_state()
    self._queue: queue.Queue = queue.Queue(maxsize=max(size, 1))
    self._stop = threading.Event()
    self._done = False
    self._thread = None
    if size > 0:
      self._thread = threading.Thread(
        target=self._produce, daemon=True, name="vidjax-device-prefetch"
      )
      self._thread.start()

  def _capture_state(self):
    return self._iterator.get_state() if self._has_state else None

  def _next_item(self):
    local = next(self._iterator)
    state = self._capture_state()  # right after producing, before the next
    return sharding.host_to_global_batch(local, self._mesh), state

  def _produce(self):
    while not self._stop.is_set():
      try:
        item = self._next_item()
      except StopIteration:
        item = _END
      except BaseException as e:  # surfaced to the consumer
        item = e
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if item is _END or isinstance(item, BaseException):
        return

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, jax.Array]:
    return self.next_batch()

  def next_batch(
    self,
    interrupt: Callable[[], bool] | None = None,
    *,
    patience_s: float = 0.0,
  ) -> dict[str, jax.Array] | None:
    """The next batch; None if `interrupt()` turned true while waiting.

    Every `stall_warn_s` seconds without a batch, a warning says what the
    wait is on (`waiting_on`).

    Args:
      interrupt: polled while no batch comes; true: give up the wait.
      patience_s: give up only once the wait has lasted this long (a wait
        that a batch ends sooner is not stuck).

    Raises:
      StopIteration: the end of the data.
    """
    started = time.monotonic()
    warn_at = started + self.stall_warn_s
    while (batch := self.next_within(POLL_S)) is None:
      if (
        interrupt is not None
        and time.monotonic() - started >= patience_s
        and interrupt()
      ):
        self.interrupted = True
        return None
      if time.monotonic() >= warn_at:
        logging.warning(
          "no %s batch for %.0f s: waiting on %s (warned every "
          "data.stall_warn_s=%g s)",
          self.name,
          time.monotonic() - started,
          self.waiting_on(),
          self.stall_warn_s,
        )
        warn_at += self.stall_warn_s
    return batch

  def waiting_on(self) -> str:
    """What a stalled wait is on, for the warning."""
    return f"{type(self._iterator).__name__}'s next()"

  def next_within(self, timeout: float | None) -> dict[str, jax.Array] | None:
    """The next batch, or None if none came within `timeout` seconds (None:
    waits for it; `size=0` always waits)."""
    if self._done:
      raise StopIteration
    if self._thread is None:
      try:
        item = self._next_item()
      except StopIteration:
        item = _END
    else:
      try:
        item = self._queue.get(timeout=timeout)
      except queue.Empty:
        return None
    if item is _END:
      self._done = True
      raise StopIteration
    if isinstance(item, BaseException):
      self._done = True
      raise item
    batch, self._state = item
    return batch

  def get_state(self):
    """Iterator state to checkpoint: resumes at the first unconsumed batch."""
    if not self._has_state:
      raise TypeError(f"{type(self._iterator).__name__} has no get_state()")
    return self._state

  def close(self, timeout: float = CLOSE_TIMEOUT_S):
    """Stops the thread and drops the batches still queued.

    Waits for the thread at most `timeout` seconds: one still inside the
    wrapped iterator's `next()` then is left to end on its own (a daemon).
    Where that `next()` can wait for long, stop its source after a first
    `wait_for_thread` (as `pipeline.Pipeline.close` does).
    """
    self._stop.set()
    if not self.wait_for_thread(timeout):
      logging.warning(
        "the device prefetch thread did not stop within %g s "
        "(waiting on %s); left to end on its own",
        timeout,
        self.waiting_on(),
      )
    self._done = True

  def wait_for_thread(self, timeout: float) -> bool:
    """After `_stop` is set: drops queued batches until the thread ends, for
    at most `timeout` seconds. Returns whether it ended."""
    if self._thread is None:
      return True
    deadline = time.monotonic() + timeout
    while self._thread.is_alive() and time.monotonic() < deadline:
      try:  # unblock a producer waiting on a full queue
        self._queue.get(timeout=0.05)
      except queue.Empty:
        pass
    return not self._thread.is_alive()
