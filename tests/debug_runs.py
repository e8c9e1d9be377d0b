"""The :debug recipes' training runs, each made once per test session.

Runs are deterministic, so tests that need "the :debug pretraining" or "the
same fine-tune from scratch" share one run (in-process, on one synthetic
corpus) instead of training their own.
"""

import collections
import contextlib
import os
from pathlib import Path
import shutil
import signal

from jax import monitoring

from vidjax import config as config_lib, train
from vidjax.base import errors
from vidjax.checkpoints import checkpoint_reader
from vidjax.data import synthetic

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# The demo's :debug (batch 16) at a constant learning rate without warmup,
# logged every step and evaluated every 4: its step program does not depend on
# total_steps, so a run of 4 steps is the first 4 steps of a run of 16. The
# 16-step run in this process (`demo_reference`) is what the Ctrl-C/resume
# test and the multi-process test compare with; both tests are in the
# "demo_reference" xdist group.
DEMO_REFERENCE = (
  "--config.optim.schedule=constant",
  "--config.optim.warmup_steps=0",
  "--config.log.every_steps=1",
  "--config.eval.every_steps=4",
  "--config.checkpoint.every_steps=1000",
)
DEMO_REFERENCE_STEPS = 16
# The demo's debug model at its smallest (a start-up that builds it for
# real, not abstractly, in a second).
TINY_DEMO = (
  "--config.data.size=16",
  "--config.model.variant=Ti/8",
  "--config.model.width=64",
  "--config.model.heads=1",
  "--config.model.depth=2",
  "--config.model.embed_dim=16",
  "--config.model.text.heads=1",
)
_corpora: dict[tuple, Path] = {}
_runs: dict[tuple, tuple[Path, dict]] = {}
_compiles: dict[tuple, collections.Counter] = {}


# The runs made in the test processes draw no plots at their end: the
# command-line runs do (tests/test_train.py, tests/test_cli.py), and
# tests/test_plot.py checks what they hold.
NO_PLOTS = "--config.log.plots=false"
# Nor do they check their step's memory against the host's, but for each
# recipe's shared run (`run`) and the command-line runs: tests/test_memory.py
# checks the estimates and the refusals.
UNCHECKED_MEMORY = "--config.device_memory_gib=-1"


def load(name: str, *overrides: str, check_memory: bool = False):
  """`configs/NAME.py:debug` (NAME:VARIANT: `configs/NAME.py:VARIANT,debug`)
  with `--config.KEY=VALUE` overrides (after `NO_PLOTS`, and
  `UNCHECKED_MEMORY` unless `check_memory`)."""
  quick = (NO_PLOTS,) if check_memory else (NO_PLOTS, UNCHECKED_MEMORY)
  recipe, _, variant = name.partition(":")
  return config_lib.load_config(
    f"{CONFIGS / recipe}.py:{variant + ',' if variant else ''}debug",
    (*quick, *overrides),
  )


def corpus(spec, tmp_path_factory) -> Path:
  """The synthetic corpus of `config.data.synthetic` SPEC, made once per
  test process for each spec."""
  settings = {
    key: spec[key]
    for key in (
      "num_videos",
      "segments_per_video",
      "segment_seconds",
      "height",
      "width",
      "seed",
    )
  }
  key = tuple(settings.values())
  if key not in _corpora:
    _corpora[key] = synthetic.make_corpus(
      tmp_path_factory.mktemp("corpus"), **settings, progress=False
    )
  return _corpora[key]


def prepare(config, workdir: Path, tmp_path_factory) -> Path:
  """Puts the config's synthetic corpus (`corpus`) into WORKDIR/synthetic."""
  workdir.mkdir(parents=True, exist_ok=True)
  shutil.copytree(
    corpus(config.data.synthetic, tmp_path_factory), workdir / "synthetic"
  )
  return workdir


def demo_reference(tmp_path_factory) -> Path:
  """The workdir of the 16-step `DEMO_REFERENCE` run of `demo.py:debug`."""
  return run(
    tmp_path_factory,
    "demo",
    *DEMO_REFERENCE,
    f"--config.total_steps={DEMO_REFERENCE_STEPS}",
  )[0]


@contextlib.contextmanager
def counting_compiles():
  """Counts XLA compilations (persistent-cache hits too) by function name,
  e.g. {'jit(train_step)': 1}, while the block runs."""
  counts = collections.Counter()

  def listen(event, duration, **kwargs):
    del duration
    if event == "/jax/core/compile/backend_compile_duration":
      counts[kwargs.get("fun_name")] += 1

  monitoring.register_event_duration_secs_listener(listen)
  try:
    yield counts
  finally:
    monitoring.unregister_event_duration_listener(listen)


def run(tmp_path_factory, name: str, *overrides: str) -> tuple[Path, dict]:
  """(workdir, final eval metrics) of `train_and_evaluate` on the recipe."""
  key = (name, overrides)
  if key not in _runs:
    config = load(name, *overrides, check_memory=True)
    workdir = prepare(
      config, tmp_path_factory.mktemp(name.replace(":", "_")), tmp_path_factory
    )
    with counting_compiles() as _compiles[key]:
      _runs[key] = workdir, train.train_and_evaluate(config, workdir)
  return _runs[key]


def teacher_override(tmp_path_factory) -> str:
  """`umt_vitb_k400_pretrain.py:debug`'s teacher: the :debug CLIP
  pretraining's run (`clip_vitb16_ego4d`, shared)."""
  teacher, _ = run(tmp_path_factory, "clip_vitb16_ego4d")
  return f"--config.model.teacher.source={teacher}"


def stand_in_teacher(monkeypatch) -> None:
  """A teacher's shapes without a trained one, for runs that stop before
  the weights are loaded (`vidjax.checkpoints.teacher.read` replaced): the
  :debug CLIP's vision tower (width 64, patch 16) with 12 blocks, all
  zeros."""
  import numpy as np

  from vidjax.checkpoints import teacher
  from vidjax.weights import init_from

  shapes = {
    "visual.patch_embed.kernel": (3 * 16 * 16, 64),
    "visual.proj.kernel": (64, 64),
    **{
      f"visual.blocks.layers.{i}.mlp.fc1.kernel": (64, 256) for i in range(12)
    },
  }
  tensors = {
    name: np.zeros(shape, np.float32) for name, shape in shapes.items()
  }
  source = init_from.Source("clip", tensors, {}, "a stand-in teacher")
  monkeypatch.setattr(teacher, "read", lambda config: source)


def umt(tmp_path_factory) -> tuple[Path, dict]:
  """(workdir, final eval metrics) of the :debug UMT pretraining."""
  return run(
    tmp_path_factory,
    "umt_vitb_k400_pretrain",
    teacher_override(tmp_path_factory),
  )


def compiles(
  tmp_path_factory, name: str, *overrides: str
) -> collections.Counter:
  """The compilations of `run(tmp_path_factory, name, *overrides)`, by name."""
  run(tmp_path_factory, name, *overrides)
  return _compiles[(name, overrides)]


def stop_in_first_step(monkeypatch) -> None:
  """The next `train.train_and_evaluate` gets SIGTERM as its first step
  starts (in this process: it saves the step's checkpoint and raises
  `errors.Preempted`)."""
  setup = train.setup

  def setup_then_signal(*args, **kwargs):
    run = setup(*args, **kwargs)
    step, calls = run.steps.train, []

    def sending(*a, **k):
      calls.append(1)
      if len(calls) == 1:
        os.kill(os.getpid(), signal.SIGTERM)
      return step(*a, **k)

    monkeypatch.setattr(run.steps, "train", sending)
    return run

  monkeypatch.setattr(train, "setup", setup_then_signal)


def preempted(monkeypatch, tmp_path_factory, workdir: Path, name, *overrides):
  """`load(name, *overrides)` trained in WORKDIR (its corpus prepared) until
  SIGTERM stops its first step: the run saved step 1 and raised
  `errors.Preempted`. The same call of `train.train_and_evaluate` resumes it.
  """
  config = load(name, *overrides)
  prepare(config, workdir, tmp_path_factory)
  with monkeypatch.context() as patch:
    stop_in_first_step(patch)
    try:
      train.train_and_evaluate(config, workdir)
    except errors.Preempted:
      pass
    else:
      raise AssertionError("the run was not preempted")
  assert checkpoint_reader.latest_complete_step(workdir / "checkpoints") == 1
  return workdir
