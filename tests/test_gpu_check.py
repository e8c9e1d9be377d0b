"""The GPU check's CPU dry run, its batch search and its missing-package path."""
import json
import math
import subprocess
import sys

import pytest

from vidjax.bench import gpu_check

GiB = 2**30


def _numbers(tree, path=""):
  """(path, value) of every number in a JSON tree; strings such as 'nan' too."""
  if isinstance(tree, dict):
    for key, value in tree.items():
      yield from _numbers(value, f"{path}.{key}")
  elif isinstance(tree, list):
    for i, value in enumerate(tree):
      yield from _numbers(value, f"{path}[{i}]")
  elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
    yield path, tree
  elif tree in ("nan", "inf", "-inf"):
    yield path, float(tree)


@pytest.mark.slow
def test_dry_run_writes_every_section_with_finite_numbers(tmp_path):
  out = tmp_path / "check.json"
  # One remat policy runs; a budget of 0 s skips the second (as a slow GPU would).
  returned = gpu_check.main(["--dry", "--out", str(out), "--remat", "full,none",
                             "--budget-s", "0"])
  result = json.loads(out.read_text())
  assert result == json.loads(json.dumps(gpu_check._jsonable(returned)))
  assert gpu_check.summary(returned).startswith("{")

  sections = ("environment", "attention", "data", "training", "data_bound")
  assert result["mode"] == "dry"
  for name in sections:
    assert "error" not in result[name], (name, result[name])
  for path, value in _numbers(result):
    assert math.isfinite(value), path

  env = result["environment"]
  assert env["device_count"] >= 1 and env["memory_gib"] > 0
  assert env["versions"]["jax"] and env["missing"] == []

  att = result["attention"]
  assert att["passed"] is True
  assert "cudnn" in att["cudnn"]["skipped"] or "GPU" in att["cudnn"]["skipped"]
  xla = att["xla"]
  for name in ("out", "dq", "dk", "dv"):
    assert xla["vs_reference"][name]["rel"] < 1e-3  # float32 against float32
  assert xla["forward_ms"] > 0 and xla["forward_backward_ms"] > 0
  assert xla["forward_backward_temp_mib"] >= 0

  policy = result["training"]["policies"]["full"]
  assert result["training"]["policies"]["none"] == {
      "skipped": "time budget (--budget-s) spent"}
  assert policy["global_batch"] == 2 * 8  # Doubled from 8 (the cap).
  assert [s["batch_per_device"] for s in policy["search"]] == [
      policy["batch_per_device"] // 2, policy["batch_per_device"]]
  for key in ("clips_per_s", "tflops_per_device", "step_s_median", "loss",
              "compile_s"):
    assert policy[key] > 0, key
  assert policy["memory"]["total_gib"] > 0
  assert policy["mfu"] is None  # No known peak for a CPU.

  data = result["data"]
  assert data["clips_per_s"] > 0 and data["skipped_reads"] == 0
  assert data["timed_batches"] >= 2 * data["warmup_batches"]
  bound = result["data_bound"]
  assert bound["ratio"] == pytest.approx(
      data["clips_per_s"] / policy["clips_per_s"], rel=1e-6)
  assert bound["data_bound"] == (bound["ratio"] < 1)


def test_attention_check_reports_a_failing_implementation_and_goes_on(monkeypatch):
  # Pretend cuDNN is usable: on CPU asking for it raises inside JAX.
  monkeypatch.setattr(gpu_check.attention, "cudnn_unsupported_reason",
                      lambda head_dim, dtype: None)
  result = gpu_check.check_attention(gpu_check.make_plan(dry=True))
  assert "error" in result["cudnn"] and result["cudnn"]["passed"] is False
  assert result["xla"]["passed"] is True and result["xla"]["forward_ms"] > 0
  assert result["passed"] is False
  assert "cudnn_vs_xla" not in result


def _fake_step(fixed_gib, per_clip_gib, oom_above=None, curve=1.0):
  """A compile function whose memory is fixed + per_clip * batch**curve."""
  compiled = []

  def compile_fn(per_device):
    compiled.append(per_device)
    if oom_above is not None and per_device > oom_above:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while compiling")
    temp = per_clip_gib * per_device**curve
    return {"total_gib": fixed_gib + temp, "temp_gib": temp}, f"step{per_device}"
  return compile_fn, compiled


def test_batch_search_jumps_to_the_largest_predicted_fit():
  compile_fn, compiled = _fake_step(2.0, 0.3)
  search = gpu_check.BatchSearch(compile_fn, 100 * GiB)
  assert search.largest(64, 1024) == 256  # 2 + 0.3 * 512 = 155.6 GiB > 100
  assert compiled == [64, 256]
  assert search.fits[256] == "step256"


def test_batch_search_stops_at_the_cap_and_halves_a_first_size_too_big():
  compile_fn, compiled = _fake_step(2.0, 0.01)
  assert gpu_check.BatchSearch(compile_fn, 100 * GiB).largest(64, 1024) == 1024
  assert compiled == [64, 1024]
  compile_fn, compiled = _fake_step(2.0, 1.0)
  assert gpu_check.BatchSearch(compile_fn, 40 * GiB).largest(64, 1024) == 32
  assert compiled == [64, 32]


def test_batch_search_backs_off_when_the_prediction_was_optimistic():
  # Memory grows faster than linearly, and compiling past 300 runs out.
  compile_fn, compiled = _fake_step(1.0, 0.1, oom_above=300, curve=1.1)
  search = gpu_check.BatchSearch(compile_fn, 200 * GiB)
  size = search.largest(64, 1024)
  assert size == 256
  assert all(compiled.count(b) == 1 for b in compiled)  # Nothing compiled twice.
  assert [e["fits"] for e in search.trail if e["batch_per_device"] > 256] == [
      False] * len([b for b in compiled if b > 256])


def test_batch_search_raises_other_errors():
  def broken(per_device):
    raise ValueError("not a memory problem")
  with pytest.raises(ValueError, match="not a memory problem"):
    gpu_check.BatchSearch(broken, GiB).largest(8, 16)


def test_without_grain_and_av_the_step_still_builds_and_data_is_skipped(tmp_path):
  # A fresh interpreter in which grain and av cannot be imported.
  code = (
      "import sys; sys.modules['grain'] = None; sys.modules['av'] = None\n"
      "from pathlib import Path\n"
      "from vidjax.bench import gpu_check as g\n"
      "missing = g._missing(g.DATA_PACKAGES)\n"
      "assert missing == ['grain', 'av'], missing\n"
      "train = g.import_train(missing)\n"
      "assert callable(train.make_steps) and callable(train.setup)\n"
      "assert g._missing(g.DATA_PACKAGES) == ['grain', 'av']\n"
      "plan = g.make_plan(True)\n"
      f"out = g.check_data(plan, Path({str(tmp_path)!r}), missing)\n"
      "assert 'grain, av cannot be imported' in out['skipped'], out\n"
      "try:\n"
      "  import grain; grain.MapDataset\n"
      "except ModuleNotFoundError as e:\n"
      "  assert 'grain is not installed' in str(e)\n"
      "else:\n"
      "  raise AssertionError('the placeholder did not raise')\n")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
