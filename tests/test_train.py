"""The training loop: preemption + resume, gradient accumulation, init_from."""

import dataclasses
import json
import os
from pathlib import Path
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import debug_runs
import limits
from vidjax import config as config_lib, main, steps, train
from vidjax.base import errors
from vidjax.checkpoints import checkpoint, checkpoint_reader, checksums
from vidjax.data import pipeline
from vidjax.report import monitor

REPO = Path(__file__).resolve().parents[1]


CONFIG = str(REPO / "configs/demo.py:debug")
STEPS = debug_runs.DEMO_REFERENCE_STEPS  # A resumed part sees the 10 steps
OVERRIDES = (
  *debug_runs.DEMO_REFERENCE,  # of its time estimate.
  f"--config.total_steps={STEPS}",
)


def cli(workdir, *overrides):
  return [
    sys.executable,
    "-m",
    "vidjax.main",
    "--config",
    CONFIG,
    "--workdir",
    str(workdir),
    *OVERRIDES,
    *overrides,
  ]


def losses(workdir):
  by_step = {}
  if not (Path(workdir) / "metrics.jsonl").exists():
    return by_step
  for row in monitor.read_metrics(workdir):
    if "train/loss" in row:
      by_step[row["step"]] = row["train/loss"]  # Resumed runs append.
  return by_step


@pytest.mark.slow
@pytest.mark.xdist_group("demo_reference")
def test_ctrl_c_with_a_dead_pipe_saves_then_resume_matches(
  tmp_path, tmp_path_factory
):
  """Ctrl-C under `2>&1 | tee log` after tee exited: the save is whole, and
  the resumed run's losses are the uninterrupted run's. The workdir is given
  relative; the same command started while the run trains is refused and
  leaves it alone; SIGTERM in the resumed run's final evaluation lets it
  finish."""
  # In this process first: it also fills the compilation cache.
  uninterrupted = debug_runs.demo_reference(tmp_path_factory)
  workdir = tmp_path / "run"  # Given relative, from tmp_path.
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    ),
  )
  proc = subprocess.Popen(
    cli("run"),
    cwd=tmp_path,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
  )
  proc.stdout.close()  # Nobody reads: every console write fails with EPIPE.
  deadline = time.monotonic() + limits.HANG_S
  while time.monotonic() < deadline and proc.poll() is None:
    # Metrics are written a step late: step 1 is logged once step 2 runs.
    if losses(workdir):
      # The same command again meanwhile: refused, and changes nothing.
      config_json = (workdir / "config.json").read_bytes()
      with pytest.raises(
        errors.WorkdirError,
        match=(
          rf"workdir {re.escape(str(workdir))} is in use by another run: PID "
          rf"{proc.pid} on "
          rf"host {re.escape(socket.gethostname())}, started "
        ),
      ) as refused:
        main.run(CONFIG, str(workdir), overrides=OVERRIDES)
      assert refused.value.exit_code == errors.EXIT_USAGE
      assert (workdir / "config.json").read_bytes() == config_json
      proc.send_signal(signal.SIGINT)
      break
    time.sleep(0.05)
  log_txt = workdir / "log.txt"
  log = lambda: log_txt.read_text() if log_txt.exists() else ""
  assert limits.wait(proc) == errors.EXIT_PREEMPTED, log()[-3000:]
  stopped_at = max(losses(workdir))
  assert 2 <= stopped_at <= STEPS - 10, f"SIGINT came too late ({stopped_at})"
  ckpts = workdir / "checkpoints"
  saved = checkpoint_reader.latest_complete_step(ckpts)
  assert saved is not None and saved >= stopped_at
  assert [p.name for p in ckpts.iterdir()] == [str(saved)]  # Nothing partial.
  assert "run the same command to resume" in log()
  # A save killed half-way (Orbax's temporary name) is removed at the restart.
  partial = ckpts / f"{saved + 1}{checkpoint.TMP_SUFFIX}"
  shutil.copytree(ckpts / str(saved), partial)
  # The same command resumes (a change that fits: named); SIGTERM once step
  # 16 is logged (in the final evaluation, the final save or the plots) lets
  # the run finish them.
  proc = subprocess.Popen(
    cli("run", "--config.checkpoint.keep=3"),
    cwd=tmp_path,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  while proc.poll() is None and STEPS not in losses(workdir):
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  assert limits.wait(proc) == errors.EXIT_FINISHED, log()[-3000:]
  assert (
    "received SIGTERM: the final evaluation and the checkpoint of step "
    f"{STEPS} finish first, then the run ends"
  ) in log()
  assert checkpoint_reader.latest_complete_step(ckpts) == STEPS
  assert not partial.exists()
  assert re.search(
    r"changed since the checkpoint of step \d+:\n  "
    r"checkpoint.keep: 2 -> 3\n",
    log(),
  )
  assert re.search(rf"resuming at step \d+\n.*\n  steps \d+ -> {STEPS}", log())
  assert re.search(rf"about .* to step {STEPS} \([\d.]+ s/step\)", log())
  resumed, expected = losses(workdir), losses(uninterrupted)
  steps_run = list(range(1, STEPS + 1))
  assert sorted(resumed) == sorted(expected) == steps_run
  np.testing.assert_allclose(
    [resumed[s] for s in steps_run], [expected[s] for s in steps_run], rtol=1e-5
  )
  final = [r for r in monitor.read_metrics(workdir) if "eval/t2v_r1" in r]
  assert final and final[-1]["step"] == STEPS
  # The finished run drew its curves (`log.plots`, on by default).
  assert sorted(p.name for p in (workdir / "plots").iterdir()) == [
    "eval.png",
    "loss.png",
    "lr.png",
    "throughput.png",
  ]
  config = json.loads((workdir / "config.json").read_text())
  assert config["total_steps"] == STEPS


@pytest.mark.xdist_group("debug_runs")  # Their corpus and compiled step.
def test_a_step_with_a_non_finite_loss_is_never_saved(
  tmp_path, tmp_path_factory, monkeypatch
):
  """Step 2's loss is NaN: step 1's checkpoint is the last one, and named."""
  setup = train.setup

  def nan_from_step_2(*args, **kwargs):
    run = setup(*args, **kwargs)
    train_step = run.steps.train

    def step(state, rest, batch, key):
      state, metrics = train_step(state, rest, batch, key)
      loss = jnp.where(state["step"] >= 2, jnp.nan, metrics["train/loss"])
      return state, dict(metrics, **{"train/loss": loss})

    run.steps = dataclasses.replace(run.steps, train=step)
    return run

  monkeypatch.setattr(train, "setup", nan_from_step_2)
  config = debug_runs.load(
    "clip_vitb16_ego4d", "--config.checkpoint.every_steps=1"
  )
  workdir = debug_runs.prepare(config, tmp_path, tmp_path_factory)
  with pytest.raises(
    monitor.NonFiniteError,
    match=r"non-finite train/loss .* "
    r"at step 2; last good checkpoint at step 1 is kept",
  ):
    train.train_and_evaluate(config, workdir)
  assert checkpoint_reader.latest_complete_step(workdir / "checkpoints") == 1


def test_gradient_accumulation_matches_one_big_batch():
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((3, 2)), jnp.float32)}
  batch = {
    "x": jnp.asarray(rng.standard_normal((16, 3)), jnp.float32),
    "y": jnp.asarray(rng.standard_normal((16, 2)), jnp.float32),
  }

  def loss_fn(params, rest, batch, key):
    del rest, key
    loss = jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
    return loss, {"abs": jnp.abs(loss)}

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  one = steps._accumulate(grad_fn, 1, params, None, batch, jax.random.key(0))
  four = steps._accumulate(grad_fn, 4, params, None, batch, jax.random.key(0))
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four)):
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_init_from_released_clip_weights(tmp_path, tmp_path_factory):
  from flax import nnx

  from test_models_weights import random_clip_state_dict
  from vidjax.weights import conversion

  rng = np.random.default_rng(1)
  sd = random_clip_state_dict(layers=2)  # Width 64, patch 8, 16x16 images.
  sd["positional_embedding"] = rng.standard_normal((77, 64)).astype(np.float32)
  sd["token_embedding.weight"] = rng.standard_normal((1024, 64)).astype(
    np.float32
  )
  np.savez(tmp_path / "clip.npz", **sd)
  config = config_lib.load_config(
    str(REPO / "configs/demo.py:debug"),
    [
      f"--config.init_from={tmp_path / 'clip.npz'}",
      *debug_runs.TINY_DEMO,
    ],
  )
  workdir = debug_runs.prepare(config, tmp_path / "run", tmp_path_factory)
  run = train.setup(config, workdir)
  expected = nnx.split(
    conversion.clip_from_state_dict(sd, num_frames=4), nnx.Param, ...
  )[1]
  for got, want in zip(
    jax.tree.leaves(run.state["params"]), jax.tree.leaves(expected)
  ):
    np.testing.assert_allclose(got, want, rtol=1e-6)
  # And the step-0 optimizer state is fresh: training starts from these.
  assert int(run.state["step"]) == 0


def test_init_from_starts_projections_of_another_size_fresh(tmp_path):
  """CLIP towers loaded; the weights' 16-d projections do not fit the
  model's 8-d ones: they start fresh (as AVION's from OpenAI's), said in
  init_from.json."""
  from test_models_weights import random_clip_state_dict

  rng = np.random.default_rng(1)
  sd = random_clip_state_dict(layers=2)  # Embedding 16-d.
  sd["positional_embedding"] = rng.standard_normal((77, 64)).astype(np.float32)
  sd["token_embedding.weight"] = rng.standard_normal((1024, 64)).astype(
    np.float32
  )
  np.savez(tmp_path / "clip.npz", **sd)
  overrides = [
    f"--config.init_from={tmp_path / 'clip.npz'}",
    "--config.data.size=16",
    "--config.model.variant=Ti/8",
    "--config.model.width=64",
    "--config.model.heads=1",
    "--config.model.depth=2",
    "--config.model.embed_dim=8",
    "--config.model.text.heads=1",
  ]
  config = config_lib.load_config(
    str(REPO / "configs/demo.py:debug"), overrides
  )
  params = train.setup(config, tmp_path / "run").state["params"]
  assert params["visual"]["proj"]["kernel"].shape == (64, 8)
  np.testing.assert_allclose(
    params["text"]["token_embed"]["embedding"][...],
    sd["token_embedding.weight"],
    rtol=1e-6,
  )
  report = json.loads((tmp_path / "run" / "init_from.json").read_text())
  assert report["dropped"]["text_projection"] == "(64, 16) does not fit (64, 8)"
  assert set(report["fresh"]) == {
    "visual.proj.kernel",
    "text.proj.kernel",
    "visual.temporal_pos",
  }  # An image CLIP's


class _Enough(Exception):
  """Stops a run once a test has seen what it needs."""


@pytest.mark.xdist_group("demo_reference")  # Its corpus and compiled step.
def test_a_data_bound_run_hears_it_again(
  tmp_path, tmp_path_factory, monkeypatch, caplog
):
  """Each batch takes 10 s more on the run's clock (an artificially slow
  loader; no time is spent sleeping): the data-bound warning comes after
  the first window of steps, and again after the next."""
  delay = [0.0]

  class SlowClockTimer(monitor.StepTimer):
    def __init__(self, **kwargs):
      super().__init__(clock=lambda: time.perf_counter() + delay[0], **kwargs)

  class SlowBatches:
    def __init__(self, batches):
      self.batches, self.count = batches, 0

    def next_batch(self, **kwargs):
      self.count += 1
      if self.count > 5:  # Step 1 compiles; then two windows of 2 steps.
        raise _Enough
      delay[0] += 10.0
      return self.batches.next_batch(**kwargs)

    def __getattr__(self, name):
      return getattr(self.batches, name)

  make_pipeline = pipeline.make_pipeline
  monkeypatch.setattr(
    pipeline,
    "make_pipeline",
    lambda *a, **k: (
      SlowBatches(make_pipeline(*a, **k))
      if k.get("train")
      else make_pipeline(*a, **k)
    ),
  )
  monkeypatch.setattr(monitor, "StepTimer", SlowClockTimer)
  monkeypatch.setattr(train, "DATA_BOUND_WINDOW", 2)
  monkeypatch.setattr(train, "DATA_BOUND_REPEAT_S", 0.0)
  config = debug_runs.load(
    "demo", *debug_runs.DEMO_REFERENCE, "--config.total_steps=100"
  )
  workdir = debug_runs.prepare(config, tmp_path, tmp_path_factory)
  with caplog.at_level("WARNING"), pytest.raises(_Enough):
    train.train_and_evaluate(config, workdir)
  said = [
    re.match(
      r"the run is data-bound: (\d+)% of the time is spent "
      r"waiting for batches\. To feed it faster: more reader "
      r"processes \(--config\.data\.workers, now 0\)",
      m,
    )
    for m in caplog.messages
    if "data-bound" in m
  ]
  assert len(said) == 2 and all(int(m.group(1)) > 80 for m in said), said


@pytest.mark.slow
@pytest.mark.xdist_group("demo_reference")
def test_a_full_disk_stops_at_the_failing_save_then_the_rerun_matches(
  tmp_path_factory, small_disk, caplog
):
  """The disk fills at the save of step 6: the run stops there in a few
  lines (exit 74), step 4 is whole. Space freed, step 4 then found damaged
  (a flipped byte) and metrics.jsonl with a torn last line: the rerun says
  so, resumes from step 2, and its losses are the uninterrupted run's."""
  uninterrupted = debug_runs.demo_reference(tmp_path_factory)
  steps = 8  # The reference's first 8 (a constant learning rate).
  overrides = (
    *OVERRIDES,
    f"--config.total_steps={steps}",
    "--config.checkpoint.every_steps=2",
    "--config.checkpoint.keep=2",
    "--config.eval.every_steps=0",
  )  # Only the final evaluation.
  config = debug_runs.load("demo", *overrides)
  workdir = debug_runs.prepare(
    config, small_disk.path / "run", tmp_path_factory
  )
  size = sum(
    p.stat().st_size
    for p in (uninterrupted / "checkpoints" / str(STEPS)).rglob("*")
  )
  # Room for 2.5 checkpoints: keeping 2, the third does not fit.
  small_disk.leave_free(int(2.5 * size) + (256 << 10))
  proc = subprocess.run(
    [*cli(workdir), *overrides],
    cwd=REPO,
    text=True,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    timeout=limits.HANG_S,
  )
  out = proc.stdout.replace("\r", "\n")
  assert proc.returncode == errors.EXIT_WRITE_FAILED, out[-3000:]
  assert "Traceback" not in out
  error = out[out.index("error: ") :].strip().splitlines()
  assert len(error) <= 10, out[-3000:]
  assert error[0] == (
    f"error: could not save the checkpoint of step 6 in "
    f"{workdir}/checkpoints: No space left on device; the "
    "last checkpoint saved whole is step 4"
  )
  ckpts = workdir / "checkpoints"
  assert sorted(p.name for p in ckpts.iterdir()) == ["2", "4"]
  assert checksums.verify(ckpts / "4") is None

  small_disk.free_up()
  data = next((ckpts / "4" / "state" / "d").iterdir())
  damaged = bytearray(data.read_bytes())
  damaged[len(damaged) // 2] ^= 1
  data.write_bytes(bytes(damaged))
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 7, "train/lo')  # As a run killed while writing.
  caplog.set_level("INFO")
  train.train_and_evaluate(config, workdir)
  assert (
    f"the checkpoint {ckpts}/4 is damaged: state/d/{data.name} has "
    "changed since it was saved"
  ) in caplog.text
  assert "using step 2 instead, the newest intact checkpoint" in caplog.text
  assert f"resumed from {ckpts} at step 2" in caplog.text
  assert "metrics.jsonl ended in a torn line" in caplog.text
  assert all(
    json.loads(line)
    for line in (workdir / "metrics.jsonl").read_text().splitlines()
  )
  resumed, expected = losses(workdir), losses(uninterrupted)
  assert sorted(resumed) == list(range(1, steps + 1))
  np.testing.assert_allclose(
    [resumed[s] for s in resumed], [expected[s] for s in resumed], rtol=1e-5
  )
  assert sorted(p.name for p in ckpts.iterdir()) == ["4.damaged", "6", "8"]
