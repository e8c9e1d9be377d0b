"""The GPU check's offline section: the GPU's own program beside the one
`python -m vidjax.compile` builds for it without a GPU.

`python -m vidjax.compile` runs XLA's GPU compiler on a machine without a
GPU, for a shipped description of the GPU (`vidjax/compile/targets/*.txtpb`);
BENCHMARKS.md's compiled-memory table and the memory estimate's calibration
(`vidjax.memory`) rest on its figures, and nothing else checks them against
a GPU. So, once the check has measured a cuDNN training step on the GPU,
this section compiles the same step offline in a subprocess: the same
recipe config, remat policy, global batch, attention and dtype, over as
many devices as this machine has, its work ordered as the GPU's compiler
orders it by default (`--schedule gpu`), for the shipped target named as
this GPU is (`device_kind`), with the cuDNN version found here and the
check's environment (its XLA_FLAGS: the GPU's compile flags). It records
the offline memory per device (argument, output, alias and temp) over the
GPU's `compiled_gib` for that step, the cuDNN attention calls (forward,
backward) of both and whether they match, the offline fusions, collectives
and compile seconds.

In the CPU dry run the step is the dry run's, compiled for an H100: its
"GPU" figures are the CPU's stand-ins (the float32 XLA-attention step's
memory; the cuDNN calls of the bf16 step lowered for CUDA), so only the
path is exercised. Without JAX's CUDA plugin (the `[gpu-compile]` extra;
a GPU machine's `jax[cuda12]` has it) the section is skipped, saying so.
"""

from __future__ import annotations

import json
from pathlib import Path
import shlex
import subprocess
import sys

import jax

from benchmarks import gpu_measure
from benchmarks.gpu_measure import GiB
from vidjax.compile import __main__ as compile_command, targets

REPO = Path(__file__).resolve().parents[1]
MIN_S = 30.0  # Less time left than this: not started.
VERDICT_S = 5.0  # Kept after the compile for the verdict.
DRY_TARGET = "h100"  # A dry run has no GPU to name one.
STDERR_LINES = 15  # Of a failed compile's stderr, kept as its error.


def cudnn_step(training: dict) -> tuple[str, dict] | None:
  """(key, result) of the fastest measured cuDNN step, or None."""
  steps = {
    k: v
    for k, v in training.get("steps", {}).items()
    if v.get("attention") == "cudnn" and "clips_per_s" in v
  }
  if not steps:
    return None
  key = max(steps, key=lambda k: steps[k]["clips_per_s"])
  return key, steps[key]


def command(
  plan: gpu_measure.Plan,
  step: dict,
  target: targets.Target,
  cudnn_version: int | None,
  json_path: Path,
) -> list[str]:
  """`python -m vidjax.compile` for `step`, as the check measured it.

  Attention and dtype as `recipe_config` set them; in a dry run as the step
  its cuDNN calls were counted for (cuDNN, bf16: lowered for CUDA).
  """
  config = gpu_measure.recipe_config(
    plan, attention_impl=step["attention"], remat=step["remat"]
  )
  if plan.dry:
    config.model.update(attention="cudnn", dtype="bfloat16")
  spec = gpu_measure.CONFIG_FILE.relative_to(REPO).as_posix()
  argv = [
    sys.executable,
    "-m",
    "vidjax.compile",
    "--config",
    spec + (f":{plan.config_arg}" if plan.config_arg else ""),
    f"--config.model.remat={step['remat']}",
    f"--config.batch_size={step['global_batch']}",
    f"--config.model.attention={config.model.attention}",
    f"--config.model.dtype={config.model.dtype}",
    f"--devices={jax.device_count()}",
    "--no-eval",
    "--schedule=gpu",
    f"--gpu={target.source.stem}",
    f"--json={json_path}",
  ]
  if cudnn_version:
    argv.append(f"--cudnn-version={cudnn_version}")
  return argv


def compare(report: dict, step: dict) -> dict:
  """The offline training step's figures beside the GPU's `step`.

  Args:
    report: `python -m vidjax.compile --json`'s (`compiler.compile_run`).
    step: the GPU's measured step (`gpu_measure.measure_step`'s result).
  """
  offline = report["steps"]["train"]
  memory = offline["memory"]
  calls = offline["attention"]  # {tower: {'forward': n, 'backward': n}}
  gpu_calls = step["cudnn_calls"] or {}
  totals = {
    d: sum(tower[d] for tower in calls.values())
    for d in ("forward", "backward")
  }
  total_gib = memory["total"] / GiB
  return dict(
    offline_gib=total_gib,
    offline_split_gib={
      k: memory[k] / GiB for k in ("argument", "output", "alias", "temp")
    },
    gpu_gib=step["compiled_gib"],
    offline_over_gpu=total_gib / step["compiled_gib"],
    offline_cudnn_calls=calls,
    gpu_cudnn_calls={d: gpu_calls.get(d) for d in ("forward", "backward")},
    gpu_calls_source=gpu_calls.get("source"),
    cudnn_calls_match=all(totals[d] == gpu_calls.get(d) for d in totals),
    fusions=offline["fusions"],
    collectives=offline["collectives"],
    compile_s=offline["compile_seconds"],
  )


def _why_not(results: dict, deadline) -> str | None:
  """Why the section does not compile (skipped), or None."""
  if not compile_command.plugin_installed():
    return (
      "XLA's GPU compiler is not installed (the [gpu-compile] extra): "
      + compile_command.INSTALL
    )
  if cudnn_step(results.get("training", {})) is None:
    return "no cuDNN training step was measured (the training section)"
  if deadline.left() < MIN_S + VERDICT_S:
    return f"time limit: {deadline.left():.0f} s left (--time-limit-s)"
  return None


def _run(argv: list[str], timeout_s: float, deadline) -> tuple[int | None, str]:
  """(exit code, stderr) of `argv` in the repository; its report printed.

  Killed at `timeout_s` (exit code None), or at the check's time limit.
  """
  proc = subprocess.Popen(
    argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  with deadline.closing(proc.kill):
    try:
      out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      out, err = proc.communicate()
      return None, err
  for line in out.splitlines():
    gpu_measure.log(f"  {line}")
  return proc.returncode, err


def check_offline(
  plan: gpu_measure.Plan, results: dict, workdir: Path, deadline
) -> dict:
  """The module docstring's comparison of the fastest measured cuDNN step.

  Args:
    plan: the check's sizes (`gpu_measure.make_plan`).
    results: the check's sections so far ('environment', 'training').
    workdir: for the command's JSON report.
    deadline: the check's (`left()` seconds).

  Returns:
    {'skipped': why}, {'error': ..., 'command'} or the comparison
    (`compare`) with the step, target and command.
  """
  if why := _why_not(results, deadline):
    return {"skipped": why}
  key, step = cudnn_step(results["training"])
  device_kind = jax.devices()[0].device_kind
  if plan.dry:
    target = targets.load(DRY_TARGET)
  elif (target := targets.of_device(device_kind)) is None:
    return {
      "skipped": f"no shipped target is named {device_kind!r}, this GPU's "
      f"name (vidjax/compile/targets: {', '.join(targets.names())})",
      "device_kind": device_kind,
    }
  json_path = workdir / "offline.json"
  argv = command(
    plan, step, target, results["environment"].get("cudnn_version"), json_path
  )
  # As a person would rerun it (its JSON file goes with the check's).
  shown = shlex.join(
    ["python", *(a for a in argv[1:] if a != f"--json={json_path}")]
  )
  timeout_s = deadline.left() - VERDICT_S
  code, err = _run(argv, timeout_s, deadline)
  if code is None:
    return {
      "skipped": f"time limit: the compile did not end in {timeout_s:.0f} s",
      "command": shown,
    }
  if code:
    tail = "\n".join(err.strip().splitlines()[-STDERR_LINES:])
    return {"error": f"exit code {code}: {tail}"[-1500:], "command": shown}
  report = json.loads(json_path.read_text())
  return dict(
    step=key,
    target=f"vidjax/compile/targets/{target.source.name}",
    target_name=target.name,
    device_kind=device_kind,
    devices=report["devices"],
    global_batch=report["batch_size"],
    schedule=report["schedule"],
    cudnn_version=report["target"]["cudnn_version"],
    command=shown,
    **compare(report, step),
  )
