"""Two processes x 4 CPU devices train exactly like one process x 8 devices,
and stop together.

Runs `configs/demo.py:debug` through the real CLI (`python -m vidjax.main`)
as 2 processes of 4 devices joined through `jax.distributed` on localhost
(JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, as
`vidjax.main` reads them), against the 16-step run made in this process
with 8 devices (`debug_runs.demo_reference`, shared with the Ctrl-C test: a
constant learning rate, so the first steps of any run are the same). Each
process reads its own slice of every batch, the global batch is assembled
across processes, and the contrastive loss is over the global batch, so the
per-step loss and gradient norm must match the single-process run (the loss
does not depend on the order of examples in the batch), and so must the
evaluation of step 4. Then SIGTERM to one process stops both at the same
step, each saving its data-iterator state in the one checkpoint; only
process 0 writes metrics.jsonl.

Process 1 is made to lag at start-up (a `sitecustomize` hook delays its
`resume.resolve_start`), as a slow node would: a fresh workdir must
still start cleanly when process 0 gets ahead and creates the checkpoint
directory first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil
import signal
import socket
import subprocess
import sys

import pytest

import debug_runs
import limits
from vidjax.checkpoints import checksums

REPO = Path(__file__).resolve().parents[1]
CONFIG = "configs/demo.py:debug"
STEPS = 4  # The first evaluation's step.
# No warmup: later steps' losses depend on every earlier update, so a wrong
# gradient shows up in the comparison.
# Stopped by SIGTERM long before its end: with a constant learning rate its
# first steps are the 16-step run's.
OVERRIDES = (*debug_runs.DEMO_REFERENCE, "--config.total_steps=500")


# Imported by Python at start-up (PYTHONPATH): process 1 looks for a
# checkpoint to resume only after process 0 has had time to go ahead.
_LAG_HOOK = """
import os, time
if os.environ.get("JAX_PROCESS_ID") == "1":
  from vidjax.checkpoints import resume
  _resolve_start = resume.resolve_start
  def _late_resolve_start(*args, **kwargs):
    time.sleep(5)
    return _resolve_start(*args, **kwargs)
  resume.resolve_start = _late_resolve_start
"""


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int, **extra: str) -> dict[str, str]:
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(
      ("SLURM_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    )
  }
  flags = [
    f
    for f in env.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  env["XLA_FLAGS"] = " ".join(
    flags + [f"--xla_force_host_platform_device_count={devices}"]
  )
  env["JAX_PLATFORMS"] = "cpu"
  env.update(extra)
  return env


def _start(
  workdir: Path, env: dict[str, str], log: Path, overrides=OVERRIDES
) -> subprocess.Popen:
  cmd = [
    sys.executable,
    "-m",
    "vidjax.main",
    f"--config={CONFIG}",
    f"--workdir={workdir}",
    *overrides,
  ]
  with open(log, "wb") as out:  # the child keeps its own copy
    return subprocess.Popen(
      cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
    )


def _by_step(workdir: Path, prefix: str) -> dict[int, dict[str, float]]:
  rows = [
    json.loads(line)
    for line in (workdir / "metrics.jsonl").read_text().splitlines()
    if line
  ]
  out: dict[int, dict[str, float]] = {}
  for row in rows:
    metrics = {k: v for k, v in row.items() if k.startswith(prefix)}
    if metrics:
      assert not set(metrics) & set(out.get(row["step"], {})), (
        f"step {row['step']} logged twice: {row}"
      )
      out.setdefault(row["step"], {}).update(metrics)
  return out


# ---------------------------------------------------------------------------
# How vidjax.main calls jax.distributed.initialize (no processes started).
# ---------------------------------------------------------------------------
_LAUNCH_VARS = (
  "JAX_COORDINATOR_ADDRESS",
  "JAX_NUM_PROCESSES",
  "JAX_PROCESS_ID",
  "JAX_LOCAL_DEVICE_IDS",
  "CUDA_VISIBLE_DEVICES",
  "SLURM_NTASKS",
  "SLURM_NNODES",
  "SLURM_STEP_NUM_TASKS",
  "SLURM_STEP_NUM_NODES",
  "SLURM_GPUS_ON_NODE",
)


def _initialize_kwargs(monkeypatch, **env) -> dict | None:
  import jax

  from vidjax import main

  for name in _LAUNCH_VARS:
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  calls = []
  monkeypatch.setattr(
    jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs)
  )
  main._maybe_initialize_distributed()
  return calls[0] if calls else None


def test_slurm_one_task_per_node_drives_all_its_gpus(monkeypatch):
  # JAX alone would give each SLURM task one GPU (number SLURM_LOCALID).
  kwargs = _initialize_kwargs(
    monkeypatch,
    SLURM_NTASKS="2",
    SLURM_STEP_NUM_TASKS="2",
    SLURM_STEP_NUM_NODES="2",
    CUDA_VISIBLE_DEVICES="0,1,2,3",
  )
  assert kwargs == {"local_device_ids": [0, 1, 2, 3]}
  kwargs = _initialize_kwargs(
    monkeypatch, SLURM_NTASKS="2", SLURM_NNODES="2", SLURM_GPUS_ON_NODE="8"
  )
  assert kwargs == {"local_device_ids": list(range(8))}


def test_slurm_one_task_per_gpu_keeps_jax_defaults(monkeypatch):
  assert (
    _initialize_kwargs(
      monkeypatch,
      SLURM_NTASKS="16",
      SLURM_STEP_NUM_TASKS="16",
      SLURM_STEP_NUM_NODES="2",
      CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7",
    )
    == {}
  )
  assert (
    _initialize_kwargs(  # the user chose the devices
      monkeypatch,
      SLURM_NTASKS="2",
      SLURM_NNODES="2",
      SLURM_GPUS_ON_NODE="8",
      JAX_LOCAL_DEVICE_IDS="0,1",
    )
    == {}
  )


def test_explicit_coordinator_skips_cluster_detection(monkeypatch):
  kwargs = _initialize_kwargs(
    monkeypatch,
    JAX_COORDINATOR_ADDRESS="10.0.0.1:1234",
    JAX_NUM_PROCESSES="2",
    JAX_PROCESS_ID="1",
    SLURM_NTASKS="2",
  )
  assert kwargs == {
    "coordinator_address": "10.0.0.1:1234",
    "num_processes": 2,
    "process_id": 1,
    "cluster_detection_method": "deactivate",
  }


def test_single_process_does_not_initialize(monkeypatch):
  assert _initialize_kwargs(monkeypatch) is None


@pytest.mark.slow
@pytest.mark.xdist_group("demo_reference")
def test_two_processes_match_one_then_stop_together(tmp_path, tmp_path_factory):
  """Steps and evaluations match the one-process run's; then SIGTERM to
  process 1 of 2 (as a scheduler preempting one node): JAX's preemption
  sync tells process 0, both save one checkpoint of the same step (each its
  data position) and exit 75."""
  single = debug_runs.demo_reference(tmp_path_factory)
  multi = tmp_path / "multi"
  # The same videos and vocabulary, written before the processes start.
  shutil.copytree(single / "synthetic", multi / "synthetic")
  logs = {name: tmp_path / f"{name}.log" for name in ("p0", "p1")}
  hook = tmp_path / "hook"
  hook.mkdir()
  (hook / "sitecustomize.py").write_text(_LAG_HOOK)
  pythonpath = os.pathsep.join(
    [str(hook)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
  )
  address = f"127.0.0.1:{_free_port()}"
  procs = {}
  for i in range(2):
    env = _env(
      4,
      JAX_COORDINATOR_ADDRESS=address,
      JAX_NUM_PROCESSES="2",
      JAX_PROCESS_ID=str(i),
      PYTHONPATH=pythonpath,
    )
    procs[f"p{i}"] = _start(multi, env, logs[f"p{i}"])
  try:
    # Past the evaluation of step 4 (metrics are logged a step late).
    limits.wait_for(
      lambda: (
        any(p.poll() is not None for p in procs.values())
        or (
          (multi / "metrics.jsonl").exists()
          and max(_by_step(multi, "train/"), default=0) > STEPS
        )
      ),
      "step 5 of the two processes",
      poll_s=0.2,
    )
    procs["p1"].send_signal(signal.SIGTERM)
    codes = {n: limits.wait(p, f"{n}'s end") for n, p in procs.items()}
  finally:
    for proc in procs.values():  # Only ours, by handle.
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  text = {n: log.read_text(errors="replace") for n, log in logs.items()}
  assert codes == {"p0": 75, "p1": 75}, text["p0"][-3000:] + text["p1"][-3000:]
  assert "process 1 of 2" in text["p1"]

  want, got = _by_step(single, "train/"), _by_step(multi, "train/")
  stopped = max(got)
  assert sorted(got) == list(range(1, stopped + 1))
  for step in range(1, min(stopped, debug_runs.DEMO_REFERENCE_STEPS) + 1):
    for name in ("train/loss", "train/grad_norm", "train/lr"):
      assert got[step][name] == pytest.approx(want[step][name], rel=1e-4), (
        f"{name} at step {step}: 2 processes {got[step][name]}, "
        f"1 process {want[step][name]}"
      )
  # Training moved: the comparison is not between untouched models.
  assert want[STEPS]["train/loss"] != pytest.approx(
    want[1]["train/loss"], rel=1e-3
  )
  # The evaluation gathers every process's outputs.
  want_eval, got_eval = _by_step(single, "eval/"), _by_step(multi, "eval/")
  assert got_eval[STEPS] == pytest.approx(want_eval[STEPS], rel=1e-4)

  # One checkpoint of the step they stopped at, besides the evaluations'
  # best (`checkpoint.best_metric`).
  steps = [int(p.name) for p in (multi / "checkpoints").iterdir()]
  assert stopped in steps and all(s in got_eval for s in steps if s != stopped)
  step_dir = multi / "checkpoints" / str(stopped)
  assert sorted(p.name for p in (step_dir / "data").glob("*.json")) == [
    "process_0-of-2.json",
    "process_1-of-2.json",
  ]
  # Process 0 listed the checksums once both processes' files were written.
  listed = json.loads((step_dir / checksums.MANIFEST).read_text())["files"]
  assert {"data/process_0-of-2.json", "data/process_1-of-2.json"} <= set(listed)
  assert checksums.verify(step_dir) is None
  for name in ("p0", "p1"):
    assert (
      f"every process saves a checkpoint of step {stopped} and stops"
      in text[name]
    ), text[name][-3000:]
    assert f"stopped at step {stopped}; checkpoint saved" in text[name]
