"""Tests for vidjax.report.monitor: JSONL rows, late fetching, timing/MFU, guard."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from vidjax.base import errors
from vidjax.report import monitor


def test_jsonl_rows_are_plain_json(tmp_path):
  with monitor.MetricWriter(tmp_path, tensorboard=False) as writer:
    writer.write(
      1,
      {
        "train/loss": jnp.float32(2.5),
        "data/skipped": np.int64(3),
        "eval/t2v_r1": np.float64(0.25),
        "perf/mfu": 0.4,
      },
    )
    writer.write(
      2, {"train/loss": jnp.array(float("nan")), "eval/name": "ek100"}
    )
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(line) for line in lines]  # strict JSON: no NaN tokens
  assert rows[0] == {
    "step": 1,
    "train/loss": 2.5,
    "data/skipped": 3,
    "eval/t2v_r1": 0.25,
    "perf/mfu": 0.4,
  }
  assert type(rows[0]["data/skipped"]) is int
  assert rows[1] == {"step": 2, "train/loss": None, "eval/name": "ek100"}
  assert "NaN" not in lines[1]
  assert monitor.read_metrics(tmp_path) == rows

  # A resumed run appends to the same file.
  with monitor.MetricWriter(tmp_path, tensorboard=False) as writer:
    writer.write(3, {"train/loss": 1.0})
  assert [r["step"] for r in monitor.read_metrics(tmp_path)] == [1, 2, 3]


def test_writer_rejects_arrays_and_other_processes_write_nothing(tmp_path):
  with monitor.MetricWriter(tmp_path, tensorboard=False) as writer:
    with pytest.raises(ValueError, match="'train/logits' has shape"):
      writer.write(1, {"train/logits": np.zeros(3)})
  with monitor.MetricWriter(tmp_path / "other", enabled=False) as writer:
    writer.write(1, {"train/loss": 1.0})
  assert not (tmp_path / "other").exists()


def test_late_metrics_returns_previous_step_as_floats():
  late = monitor.LateMetrics()
  assert late.push(1, {"train/loss": jnp.float32(3.0)}) is None
  # Step 2's values are not touched when step 1's are handed back: this
  # non-scalar would raise if they were converted now.
  step, metrics = late.push(2, {"train/loss": jnp.zeros(2)})
  assert step == 1 and metrics == {"train/loss": 3.0}
  assert type(metrics["train/loss"]) is float
  with pytest.raises(ValueError, match="shape"):
    late.flush()
  assert late.flush() is None


def test_step_timer_splits_data_wait_and_computes_mfu():
  now = [0.0]
  timer = monitor.StepTimer(
    global_batch=64,
    flops_per_step=8e12,
    num_devices=8,
    peak_flops_per_device=1e12,
    clock=lambda: now[0],
  )
  for _ in range(4):
    with timer.waiting_for_data():
      now[0] += 0.1
    now[0] += 0.4  # dispatch + device
    timer.step()
  perf = timer.summary()
  assert perf["perf/step_time_s"] == pytest.approx(0.5)
  assert perf["perf/data_wait_s"] == pytest.approx(0.1)
  assert perf["perf/data_wait_frac"] == pytest.approx(0.2)
  assert perf["perf/clips_per_s"] == pytest.approx(128.0)
  # 8 TFLOP per step over 8 devices in 0.5 s = 2 TFLOP/s each; peak 1.
  assert perf["perf/tflops_per_device"] == pytest.approx(2.0)
  assert perf["perf/mfu"] == pytest.approx(2.0)
  assert timer.summary() == {}  # the window was reset
  assert monitor.model_flops_utilization(
    989e12 * 8 * 0.5, 1.0, 8, 989e12
  ) == pytest.approx(0.5)


def test_data_bound_watch_keeps_watching_over_a_sliding_window():
  now = [0.0]
  timer = monitor.StepTimer(
    global_batch=8, num_devices=1, window_steps=4, clock=lambda: now[0]
  )
  watch = monitor.DataBoundWatch(
    timer, threshold=0.5, repeat_s=10.0, clock=lambda: now[0]
  )

  def steps(n, wait, compute=0.1):
    said = []
    for _ in range(n):
      with timer.waiting_for_data():
        now[0] += wait
      now[0] += compute
      timer.step()
      said.append(watch.check())
    return said

  # Fed at first; then slow batches: said as soon as the last 4 steps'
  # time is mostly waiting, not again within 10 s, then again (4 more slow
  # steps and 10 s later). The log windows (summary) leave it alone.
  assert steps(6, wait=0.01) == [None] * 6
  timer.summary()
  said = steps(12, wait=1.0)
  assert [i for i, s in enumerate(said) if s] == [0, 10]
  assert said[0] == pytest.approx((3 * 0.01 + 1.0) / (3 * 0.11 + 1.1))
  assert timer.recent_data_wait() == (4, pytest.approx(1.0 / 1.1))
  assert steps(8, wait=0.01) == [None] * 8  # Fed again: nothing said.
  now[0] += 10.0  # E.g. an evaluation.
  timer.reset()  # As after a compilation: a full window first.
  assert steps(4, wait=1.0) == [None] * 3 + [pytest.approx(1.0 / 1.1)]


def test_peak_flops_lookup():
  assert monitor.peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989e12
  assert monitor.peak_flops_per_device("NVIDIA H100 PCIe") == 756e12
  assert monitor.peak_flops_per_device("NVIDIA A100-SXM4-80GB") == 312e12
  # A name inside a longer one: the most specific entry wins.
  assert monitor.peak_flops_per_device("NVIDIA L40") == 181e12
  assert monitor.peak_flops_per_device("NVIDIA L40S") == 362e12
  assert monitor.peak_flops_per_device("NVIDIA L4") == 121e12
  assert monitor.peak_flops_per_device("NVIDIA A10G") == 125e12
  assert monitor.peak_flops_per_device("cpu") is None


def test_check_finite_names_metric_step_and_checkpoint():
  monitor.check_finite({"train/loss": 1.0, "eval/name": "x"}, step=3)
  with pytest.raises(
    monitor.NonFiniteError,
    match=r"non-finite train/loss \(nan\) at step 12; last good "
    r"checkpoint at step 10 is kept",
  ):
    monitor.check_finite(
      {"train/loss": float("nan")}, step=12, last_checkpoint_step=10
    )
  with pytest.raises(FloatingPointError, match="no checkpoint was saved yet"):
    monitor.check_finite({"train/grad_norm": jnp.inf}, step=1)
  with pytest.raises(
    monitor.NonFiniteError, match="train/loss"
  ):  # None = was NaN
    monitor.check_finite({"train/loss": None}, step=1)
  monitor.check_finite(
    {"train/loss": 1.0, "eval/x": None}, step=1, keys=["train/loss"]
  )


def test_a_torn_last_line_is_dropped_and_a_full_disk_leaves_whole_lines(
  small_disk, caplog
):
  workdir = small_disk.path
  (workdir / "metrics.jsonl").write_text(
    '{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/lo'
  )  # Killed here.
  with monitor.MetricWriter(workdir, tensorboard=False) as writer:
    writer.write(2, {"train/loss": 1.5})
    for name in ("2", "3.orbax-checkpoint-tmp-7"):  # Whole, and half-saved.
      (workdir / "checkpoints" / name).mkdir(parents=True)
    small_disk.leave_free(0)
    with pytest.raises(
      errors.WriteError,
      match=r"could not write the metrics "
      r"of step 3 to .*metrics.jsonl: No space left on device; the last "
      r"checkpoint saved whole is step 2$",
    ):
      writer.write(3, {"train/loss": 1.0, "name": "x" * 5000})  # > a page
  assert "ended in a torn line" in caplog.text and '{"step": 2, "train/lo' in (
    caplog.text
  )
  assert (workdir / "metrics.jsonl").read_text() == (
    '{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.5}\n'
  )
