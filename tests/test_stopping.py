"""SIGTERM and Ctrl-C at the stages of a run: the exit and what is kept.

Start-up and the first step run in-process (this process sends itself the
signal from the function named, as a cluster or a user would send it at
that moment); Ctrl-C pressed twice, which ends the process at once, as a
command on a copy of the reference run's workdir. The final evaluation:
tests/test_train.py's resumed run; the loop: its Ctrl-C.
"""

import json
import os
from pathlib import Path
import re
import shutil
import signal
import subprocess
import sys

import pytest

import debug_runs
import limits
from vidjax import train
from vidjax.base import errors, rundir, stopping
from vidjax.checkpoints import checkpoint_reader
from vidjax.data import workers

REPO = Path(__file__).resolve().parents[1]


def test_a_signal_is_a_flag_that_start_up_checks(caplog):
  before = signal.getsignal(signal.SIGTERM)
  with stopping.handling("before the first step") as signals:
    assert not stopping.requested()
    os.kill(os.getpid(), signal.SIGTERM)  # Nothing raised here.
    assert signals.requested and stopping.requested()
    with stopping.handling("during the inner part"):  # Nested: still seen.
      with pytest.raises(
        errors.Stopped, match="^stopped by SIGTERM during the inner part$"
      ):
        stopping.check()
    with pytest.raises(errors.Stopped, match="before the first step"):
      signals.check()
    signals.defer("will save a checkpoint and stop")
    signals.check()  # Deferred: the loop asks instead.
    assert signals.should_stop(3)
    os.kill(os.getpid(), signal.SIGTERM)
  assert signal.getsignal(signal.SIGTERM) is before
  assert "received SIGTERM again: still stopping" in caplog.text


def _signal_in(monkeypatch, module, name: str, signum: int, calls=(1,)):
  """Sends `signum` to this process at the given calls of module.name."""
  original, count = getattr(module, name), [0]

  def sending(*args, **kwargs):
    count[0] += 1
    if count[0] in calls:
      os.kill(os.getpid(), signum)
    return original(*args, **kwargs)

  monkeypatch.setattr(module, name, sending)


# The runs share the demo reference run's corpus and compiled steps (a
# constant learning rate: the same steps for any total_steps).
REFERENCE = pytest.mark.xdist_group("demo_reference")


def _config(*overrides):
  return debug_runs.load("demo", *debug_runs.DEMO_REFERENCE, *overrides)


def _workdir(tmp_path, tmp_path_factory, *overrides):
  debug_runs.demo_reference(tmp_path_factory)
  config = _config(*overrides)
  return config, debug_runs.prepare(config, tmp_path / "run", tmp_path_factory)


@REFERENCE
def test_sigterm_during_start_up_stops_before_writing(
  tmp_path, tmp_path_factory, monkeypatch
):
  config, workdir = _workdir(tmp_path, tmp_path_factory)
  _signal_in(monkeypatch, train.checks, "check_annotations", signal.SIGTERM)
  with pytest.raises(errors.Stopped) as e:
    train.train_and_evaluate(config, workdir)
  assert e.value.exit_code == errors.EXIT_PREEMPTED
  assert str(e.value) == (
    "stopped by SIGTERM before the first step; no "
    "checkpoint was saved: run the same command to start "
    "again"
  )
  assert os.listdir(workdir) == ["synthetic"]  # No lock, no config.json.


@REFERENCE
def test_sigterm_late_in_eval_start_up_stops_before_evaluating(
  tmp_path, tmp_path_factory, monkeypatch
):
  """`--mode eval` on a run's weights, SIGTERM in setup's last part (the
  pipeline being made): exit 75, nothing evaluated or written."""
  reference = debug_runs.demo_reference(tmp_path_factory)
  config, workdir = _workdir(
    tmp_path, tmp_path_factory, f"--config.init_from={reference}"
  )
  setup = train.setup

  def setup_then_signal(*args, **kwargs):
    run = setup(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return run

  monkeypatch.setattr(train, "setup", setup_then_signal)
  evaluated = []
  monkeypatch.setattr(
    train.eval_sets, "evaluate", lambda *a, **k: evaluated.append(a)
  )
  with pytest.raises(errors.Stopped) as e:
    train.evaluate_only(config, workdir)
  assert e.value.exit_code == errors.EXIT_PREEMPTED
  assert str(e.value) == (
    "stopped by SIGTERM before the evaluation; nothing was written: run "
    "the same command to evaluate"
  )
  assert not evaluated and not (workdir / "metrics.jsonl").exists()
  assert not (workdir / rundir.LOCK_FILE).exists()


@REFERENCE
def test_ctrl_c_in_the_first_step_saves_it(
  tmp_path, tmp_path_factory, monkeypatch
):
  """The first step (its compilation) finishes, then is saved."""
  config, workdir = _workdir(tmp_path, tmp_path_factory)
  setup = train.setup

  def setup_then_signal_in_the_first_step(*args, **kwargs):
    run = setup(*args, **kwargs)
    _signal_in(monkeypatch, run.steps, "train", signal.SIGINT)
    return run

  monkeypatch.setattr(train, "setup", setup_then_signal_in_the_first_step)
  with pytest.raises(errors.Preempted, match="stopped at step 1; checkpoint"):
    train.train_and_evaluate(config, workdir)
  assert checkpoint_reader.latest_complete_step(workdir / "checkpoints") == 1
  assert not (workdir / rundir.LOCK_FILE).exists()


# Makes the command below wait at start-up (in `resume.resolve_start`) until
# it is stopped.
_WAIT_HOOK = """
import sys, time
from vidjax.checkpoints import resume
def _waiting(*args, **kwargs):
  print("waiting in start-up", file=sys.stderr, flush=True)
  time.sleep(120)
resume.resolve_start = _waiting
"""


@pytest.mark.slow
@REFERENCE
def test_ctrl_c_twice_stops_at_once_naming_the_checkpoint(
  tmp_path, tmp_path_factory
):
  reference = debug_runs.demo_reference(tmp_path_factory)
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  (tmp_path / "hook").mkdir()
  (tmp_path / "hook" / "sitecustomize.py").write_text(_WAIT_HOOK)
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      [str(tmp_path / "hook"), str(REPO)]
      + [p for p in [os.environ.get("PYTHONPATH")] if p]
    ),
  )
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "vidjax.main",
      "--config",
      str(REPO / "configs/demo.py:debug"),
      "--workdir",
      str(workdir),
      *debug_runs.DEMO_REFERENCE,
      "--config.total_steps=32",
    ],
    cwd=tmp_path,
    env=env,
    stderr=subprocess.PIPE,
    text=True,
  )
  lines = []
  try:
    for expected, then in (
      ("waiting in start-up", signal.SIGINT),
      ("received SIGINT", signal.SIGINT),
    ):
      while expected not in (line := proc.stderr.readline()):
        assert line, "".join(lines)
        lines.append(line)
      proc.send_signal(then)
    lines += proc.stderr.readlines()
    assert limits.wait(proc) == errors.EXIT_INTERRUPTED, "".join(lines)
  finally:
    if proc.poll() is None:  # Only ours, by handle.
      proc.kill()
      proc.wait()
  assert (
    "error: stopped at once by Ctrl-C (pressed again); the newest "
    f"checkpoint is step 16 (in {workdir / 'checkpoints'}): run the same "
    "command to resume from it\n"
  ) in "".join(lines)
  assert not (workdir / rundir.LOCK_FILE).exists()


@REFERENCE
def test_sigterm_while_an_evaluation_waits_on_stuck_data_saves_and_stops(
  tmp_path, tmp_path_factory, monkeypatch, caplog
):
  """The evaluation's chunks are FIFOs nobody writes (a stuck mount), read by
  a data worker: SIGTERM as the evaluation of step 4 starts gives it up once
  no batch came for data.stall_warn_s; the step is saved, the worker and
  its /dev/shm blocks go, exit 75."""
  blocks = lambda: {  # This process's pipelines' blocks only.
    n
    for n in os.listdir(workers.SHM_DIR)
    if n.startswith(f"{workers.PREFIX}{os.getpid()}_")
  }
  before = blocks()
  config, workdir = _workdir(
    tmp_path,
    tmp_path_factory,
    "--config.total_steps=8",
    "--config.data.workers=1",
    "--config.data.stall_warn_s=1",
  )
  corpus = workdir / "synthetic"
  val = {json.loads(line)["video_id"] for line in open(corpus / "val.jsonl")}
  for chunk in (corpus / "chunks").glob("*/*.mp4"):
    if chunk.parent.name in val:  # Training never reads them.
      chunk.unlink()
      os.mkfifo(chunk)
  _signal_in(monkeypatch, train.eval_sets, "evaluate", signal.SIGTERM)
  with pytest.raises(errors.Preempted, match="stopped at step 4; checkpoint"):
    train.train_and_evaluate(config, workdir)
  assert checkpoint_reader.latest_complete_step(workdir / "checkpoints") == 4
  log = caplog.text
  assert re.search(
    r"the evaluation of \S+val.jsonl was given up: SIGTERM came while it "
    r"waited for data, and no batch came for 1 s .*; saving the checkpoint "
    r"of step 4",
    log,
  ), log[-3000:]
  assert not (workdir / rundir.LOCK_FILE).exists()
  assert blocks() <= before
