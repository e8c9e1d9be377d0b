"""Metrics out of the loop: JSONL/TensorBoard, late fetching, timing, MFU.

* `MetricWriter`: `WORKDIR/metrics.jsonl` (one JSON object per line: `step`
  plus names such as `train/loss`, `eval/t2v_r1`, `perf/mfu`,
  `data/skipped`) and the numbers as TensorBoard events in `WORKDIR`
  (`vidjax.report.tfevents`; view with `tensorboard --logdir WORKDIR`). Only
  process 0 writes; `read_metrics` reads the rows back.
* `LateMetrics`: hands back step N's metrics as Python floats once step
  N+1 is dispatched, so fetching them never stalls the device.
* `StepTimer`: wall time split into waiting-for-data and the rest (device
  compute, dispatch, logging); clips/s, TFLOP/s per device, MFU.
* `DataBoundWatch`: when the run waits for data, over a sliding window of
  steps during the whole run (said again while it lasts, rate-limited).
* `check_finite`: stops a run on NaN/inf with a message naming the metric.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
import contextlib
import json
import math
import numbers
import os
import time
from typing import Any

from absl import logging
import jax
import numpy as np

from vidjax.base import errors, rundir, whole_files
from vidjax.report import tfevents

# Dense bf16 peak FLOP/s per chip, for MFU when the config gives none.
# Keys are looked for in `device.device_kind` (lower case), longest first:
# "gh200" before "h200", "l40s" and "l40" before "l4", "a100" before "a10".
PEAK_FLOPS_BY_DEVICE_KIND = {
  "h100 pcie": 756e12,
  "h100": 989e12,
  "h200": 989e12,
  "gh200": 989e12,
  "b200": 2250e12,
  "a100": 312e12,
  "l40s": 362e12,
  "l40": 181e12,
  "l4": 121e12,
  "a10": 125e12,
  "tpu v4": 275e12,
  "tpu v5 lite": 197e12,
  "tpu v5e": 197e12,
  "tpu v5": 459e12,
  "tpu v6": 918e12,
}


def by_device_kind(
  table: dict[str, float], device_kind: str | None = None
) -> float | None:
  """`table`'s value for a device kind (default: the first device's): the
  longest key found in the kind, lower case; None if none is."""
  kind = (device_kind or jax.devices()[0].device_kind).lower()
  for name in sorted(table, key=len, reverse=True):
    if name in kind:
      return table[name]
  return None


def peak_flops_per_device(device_kind: str | None = None) -> float | None:
  """Known dense bf16 peak FLOP/s for a device kind; None if unknown (CPU)."""
  return by_device_kind(PEAK_FLOPS_BY_DEVICE_KIND, device_kind)


# ---------------------------------------------------------------------------
# Values.
# ---------------------------------------------------------------------------
def _scalar(name: str, value: Any):
  """Python scalar for JSON; non-finite floats become None (JSON null)."""
  if isinstance(value, (str, bool)) or value is None:
    return value
  if isinstance(value, (jax.Array, np.ndarray, np.generic)):
    if np.ndim(value) != 0:
      raise ValueError(
        f"metric '{name}' has shape {np.shape(value)}; "
        "log scalars (reduce it first)"
      )
    value = np.asarray(value).item()
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    value = float(value)
    return value if math.isfinite(value) else None
  raise TypeError(
    f"metric '{name}' has type {type(value).__name__}; log numbers or strings"
  )


def to_python(metrics: Mapping[str, Any]) -> dict[str, Any]:
  """Device/numpy scalars -> Python int/float (non-finite -> None).

  Fetches all device values in one `jax.device_get`.
  """
  fetched = jax.device_get(dict(metrics))
  return {name: _scalar(name, value) for name, value in fetched.items()}


# ---------------------------------------------------------------------------
# Writers.
# ---------------------------------------------------------------------------
class MetricWriter:
  """Appends metrics to `WORKDIR/metrics.jsonl` (+ TensorBoard events).

  `tensorboard=False` writes metrics.jsonl only; `enabled` defaults to
  process 0. A resumed run appends: steps after the last checkpoint appear
  twice, and readers should keep the last line for each (step, name).
  Lines are written whole: a torn last line (a run killed while writing it)
  is dropped, with a warning, when the file is opened again.
  """

  def __init__(
    self, workdir, *, tensorboard: bool = True, enabled: bool | None = None
  ):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.path = os.fspath(rundir.path(workdir, rundir.METRICS_FILE))
    self.workdir = workdir
    self._file = None
    self._tb = None
    if self.enabled:
      os.makedirs(os.fspath(workdir), exist_ok=True)
      self._file = whole_files.LineFile(self.path)
      if note := self._file.dropped_note():
        logging.warning("%s", note)
      if tensorboard:
        self._tb = tfevents.EventWriter(os.fspath(workdir))

  def write(self, step: int, metrics: Mapping[str, Any]):
    """Writes one line `{"step": step, **metrics}`; values become Python.

    Raises:
      errors.WriteError: the disk is full (or the file not writable); the
        file keeps only whole lines.
    """
    if not self.enabled:
      return
    row = {"step": int(step), **to_python(metrics)}
    try:
      self._file.write(json.dumps(row) + "\n")
      if self._tb is not None:  # Numbers only: no strings, flags or nulls.
        self._tb.scalars(
          row["step"],
          {
            name: value
            for name, value in row.items()
            if name != "step"
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
          },
        )
    except OSError as e:
      raise errors.WriteError(
        f"could not write the metrics of step {step} to {self.path}: "
        f"{e.strerror or e}; {rundir.last_checkpoint_note(self.workdir)}",
        hint=errors.WRITE_HINT,
      ) from None

  def close(self):
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      with contextlib.suppress(OSError):  # A full disk: reported already.
        self._tb.close()
      self._tb = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_metrics(workdir) -> list[dict]:
  """The rows of `WORKDIR/metrics.jsonl`, in order.

  A line that is not a JSON object with a `step` (the torn last line of a
  killed run) is skipped with a warning: the rest is still good.

  Raises:
    FileNotFoundError: no metrics.jsonl in `workdir`.
  """
  path = rundir.path(workdir, rundir.METRICS_FILE)
  if not path.exists():
    raise FileNotFoundError(
      f"{path} does not exist: is {workdir} a run's "
      "workdir (python -m vidjax.main --workdir ...)?"
    )
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        int(row["step"])
      except (ValueError, KeyError, TypeError):
        logging.warning(
          "%s:%d: skipped, not a JSON object with a 'step': %r",
          path,
          number,
          line[:120],
        )
        continue
      rows.append(row)
  return rows


# ---------------------------------------------------------------------------
# One step late.
# ---------------------------------------------------------------------------
class LateMetrics:
  """Returns the previous step's metrics once the next step is dispatched.

    late = LateMetrics()
    for step in ...:
      state, metrics = train_step(state, batch)   # asynchronous dispatch
      done = late.push(step, metrics)             # step-1's, as floats
      if done: log(*done)
    done = late.flush()                           # the last step's

  Converting step N's metrics waits only for step N, while step N+1 is
  already queued, so the device never idles on the host.
  """

  def __init__(self):
    self._pending: tuple[int, Mapping[str, Any]] | None = None

  def push(
    self, step: int, metrics: Mapping[str, Any]
  ) -> tuple[int, dict[str, Any]] | None:
    previous, self._pending = self._pending, (step, metrics)
    return None if previous is None else (previous[0], to_python(previous[1]))

  def flush(self) -> tuple[int, dict[str, Any]] | None:
    previous, self._pending = self._pending, None
    return None if previous is None else (previous[0], to_python(previous[1]))


# ---------------------------------------------------------------------------
# Timing and MFU.
# ---------------------------------------------------------------------------
def model_flops_utilization(
  flops_per_step: float,
  seconds_per_step: float,
  num_devices: int,
  peak_flops_per_device: float,
) -> float:
  """Achieved FLOP/s per device over the device's peak, in [0, 1].

  Args:
    flops_per_step: model FLOPs of one optimizer step over the global batch
      (forward + backward, all devices together).
    seconds_per_step: wall time of one step.
    num_devices: devices sharing the step.
    peak_flops_per_device: e.g. 989e12 for an H100 in bf16.
  """
  return flops_per_step / seconds_per_step / num_devices / peak_flops_per_device


class StepTimer:
  """Splits wall time into waiting for data and the rest, per log window.

    timer = StepTimer(global_batch=256, flops_per_step=..., num_devices=8,
                      peak_flops_per_device=989e12)
    for step in ...:
      with timer.waiting_for_data():
        batch = next(batches)
      ...dispatch the step...
      timer.step()
      if step % log_every == 0:
        writer.write(step, timer.summary())   # perf/* since last summary

  Call `reset()` after the first (compiling) step so it doesn't skew rates.
  Besides the log windows, the last `window_steps` steps are kept for
  `recent_data_wait` (a sliding window, whatever the log interval).
  """

  def __init__(
    self,
    *,
    global_batch: int,
    flops_per_step: float | None = None,
    num_devices: int | None = None,
    peak_flops_per_device: float | None = None,
    window_steps: int = 20,
    clock=time.perf_counter,
    repeats: int = 1,
  ):
    # The batch counts views; the clips decoded are a `repeats`-th of them.
    self.global_batch, self.repeats = global_batch, repeats
    self.flops_per_step = flops_per_step
    self.num_devices = num_devices or jax.device_count()
    self.peak_flops_per_device = peak_flops_per_device
    self._clock = clock
    self.window_steps = window_steps
    # (time, data wait so far, steps so far) at the last window_steps + 1 steps.
    self._recent = collections.deque(maxlen=window_steps + 1)
    self._total_wait, self.steps_done = 0.0, 0  # Never reset.
    self.reset()

  def reset(self):
    """Starts counting anew: the log window and the sliding one."""
    self._recent.clear()
    self._new_window()
    self._recent.append((self._start, self._total_wait, self.steps_done))

  def _new_window(self):
    self._start = self._clock()
    self._data_wait = 0.0
    self._steps = 0

  @contextlib.contextmanager
  def waiting_for_data(self):
    start = self._clock()
    try:
      yield
    finally:
      waited = self._clock() - start
      self._data_wait += waited
      self._total_wait += waited

  def step(self, n: int = 1):
    self._steps += n
    self.steps_done += n
    self._recent.append((self._clock(), self._total_wait, self.steps_done))

  def recent_data_wait(self) -> tuple[int, float]:
    """(steps, share of their wall time spent waiting for data) over the
    last `window_steps` steps (fewer just after a reset)."""
    (t0, wait0, steps0), (t1, wait1, steps1) = self._recent[0], self._recent[-1]
    return steps1 - steps0, (wait1 - wait0) / (t1 - t0) if t1 > t0 else 0.0

  def summary(self) -> dict[str, float]:
    """`perf/*` metrics over the window since the last summary; resets it."""
    wall, steps, wait = (
      self._clock() - self._start,
      self._steps,
      self._data_wait,
    )
    self._new_window()
    if steps == 0 or wall <= 0:
      return {}
    out = {
      "perf/step_time_s": wall / steps,
      "perf/data_wait_s": wait / steps,
      "perf/data_wait_frac": wait / wall,
      "perf/steps_per_s": steps / wall,
      "perf/clips_per_s": steps * self.global_batch / self.repeats / wall,
    }
    if self.repeats > 1:  # What the model trains on: views of those clips.
      out["perf/views_per_s"] = steps * self.global_batch / wall
    if self.flops_per_step:
      out["perf/tflops_per_device"] = (
        self.flops_per_step * steps / wall / self.num_devices / 1e12
      )
      if self.peak_flops_per_device:
        out["perf/mfu"] = model_flops_utilization(
          self.flops_per_step,
          wall / steps,
          self.num_devices,
          self.peak_flops_per_device,
        )
    return out


class DataBoundWatch:
  """Watches a whole run for waiting on data, over a sliding window.

    watch = DataBoundWatch(timer, threshold=0.5, repeat_s=600)
    ...after each step:
    fraction = watch.check()   # not None: time to say it (again)

  Due when more than `threshold` of the last `timer.window_steps` steps'
  wall time went to waiting for batches, and those steps all came after the
  last time it was said, at least `repeat_s` seconds ago: a run that stays
  data-bound hears it again, not at every step.
  """

  def __init__(
    self,
    timer: StepTimer,
    *,
    threshold: float,
    repeat_s: float,
    clock=time.monotonic,
  ):
    self.timer, self.threshold, self.repeat_s = timer, threshold, repeat_s
    self._clock = clock
    self._said_at_step, self._said_at = 0, -math.inf

  def check(self) -> float | None:
    steps, fraction = self.timer.recent_data_wait()
    fresh = self.timer.steps_done - steps >= self._said_at_step
    if (
      steps == self.timer.window_steps
      and fresh
      and fraction > self.threshold
      and self._clock() - self._said_at >= self.repeat_s
    ):
      self._said_at_step, self._said_at = self.timer.steps_done, self._clock()
      return fraction
    return None


# ---------------------------------------------------------------------------
# Non-finite guard.
# ---------------------------------------------------------------------------
class NonFiniteError(errors.UserError, FloatingPointError):
  """A logged metric became NaN or infinite."""


def check_finite(
  metrics: Mapping[str, Any],
  *,
  step: int,
  last_checkpoint_step: int | None = None,
  keys: Iterable[str] | None = None,
):
  """Raises `NonFiniteError` if a metric is NaN/inf (or None from to_python).

  Args:
    metrics: Python or device scalars, e.g. from `LateMetrics.push`.
    step: the step these metrics belong to.
    last_checkpoint_step: named in the message; the caller keeps it.
    keys: which metrics to check (default: all numeric ones).
  """
  names = list(metrics) if keys is None else list(keys)
  for name in names:
    value = metrics[name]
    if isinstance(value, str) or isinstance(value, bool):
      continue
    if value is None or not math.isfinite(float(np.asarray(value))):
      kept = (
        "no checkpoint was saved yet"
        if last_checkpoint_step is None
        else f"last good checkpoint at step {last_checkpoint_step} is kept"
      )
      raise NonFiniteError(
        f"non-finite {name} ({value}) at step {step}; {kept}",
        hint="try a lower learning rate (optim.lr), more warmup "
        "(optim.warmup_steps) or gradient clipping (optim.clip_grad_norm), "
        "then resume",
      )
