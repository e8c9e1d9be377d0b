"""Tests for vidjax.startup: a resumed run reads its checkpoint once, builds
its model once, and its config is locked."""

import collections
import json
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import debug_runs
from vidjax import (
  config as config_lib,
  models,
  sharding,
  startup,
  steps,
  tasks,
  train,
)
from vidjax.base import errors
from vidjax.checkpoints import checkpoint, checksums

REPO = Path(__file__).resolve().parents[1]


def _counting(monkeypatch, owner, name: str, counts: collections.Counter):
  original = getattr(owner, name)

  def counted(*args, **kwargs):
    counts[name] += 1
    return original(*args, **kwargs)

  monkeypatch.setattr(owner, name, counted)


def test_a_resumed_run_reads_its_checkpoint_once_and_builds_its_model_once(
  tmp_path, tmp_path_factory, monkeypatch
):
  config = config_lib.load_config(
    str(REPO / "configs/demo.py:debug"), debug_runs.TINY_DEMO
  )
  workdir = debug_runs.prepare(config, tmp_path / "run", tmp_path_factory)
  plan = startup.resolve(config, workdir)  # A state of the run to save.
  plan.close()
  target = steps.build_state_and_steps(
    plan.config,
    tasks.get_task(plan.config.task),
    sharding.make_mesh(),
    abstract=True,
  )[0]
  state = jax.tree.map(
    lambda x: jax.device_put(np.full(x.shape, 0.5, x.dtype), x.sharding),
    target,
  )
  with checkpoint.Checkpointer.from_config(
    workdir, plan.config, metadata={"config": plan.config.to_dict()}
  ) as ckpt:
    ckpt.save(7, state, rng=jax.random.key(3), force=True)
  step_dir = workdir / "checkpoints" / "7"
  listed = json.loads((step_dir / checksums.MANIFEST).read_text())["files"]

  counts, crcs = collections.Counter(), collections.Counter()
  for name in ("__init__", "restore", "item_metadata"):
    _counting(monkeypatch, ocp.CheckpointManager, name, counts)
  _counting(monkeypatch, ocp.Checkpointer, "__init__", counts)
  _counting(monkeypatch, models, "build_model", counts)
  crc32 = checksums._crc32
  monkeypatch.setattr(
    checksums,
    "_crc32",
    lambda path: (
      crcs.update([Path(path).relative_to(step_dir).as_posix()]) or crc32(path)
    ),
  )
  resumed = train.setup(config, workdir, splits=("train",))
  resumed.train_batches.close()

  assert resumed.start.kind == "workdir" and resumed.start.step == 7
  jax.tree.map(np.testing.assert_array_equal, resumed.state, state)
  # The directory opened by one Orbax manager; its metadata read once (the
  # `meta` item, and the shapes); its bytes once: the restore, with every
  # file's checksum computed as it reads them, each file opened once.
  assert counts["__init__"] == 1, counts
  assert counts["item_metadata"] == 1 and counts["restore"] == 2, counts
  assert crcs == {n: 1 for n, (_, crc) in listed.items() if crc is not None}
  # One abstract model sizes the step, checks the checkpoint fits and is
  # the restore's target; one more builds the untrained buffers' values.
  # (Before: four, the first three abstract.)
  assert counts["build_model"] == 2, counts

  # The config the run reads is locked; the caller's is left as given.
  with pytest.raises(AttributeError, match="immutable"):
    resumed.config.total_steps = 5
  with pytest.raises(AttributeError, match="immutable"):
    resumed.config.model.remat = "full"
  assert resumed.config.to_dict() == plan.config.to_dict()
  assert not config.data.root  # (The synthetic corpus: the run's copy.)


def test_a_gpu_recipe_on_a_cpu_without_paths_says_everything_in_one_run(
  tmp_path,
):
  # clip_vitb16_ego4d.py as typed from the docs on a CPU: every unset path
  # (the set its best checkpoint is kept by too) and the memory verdict,
  # naming the CPU variants, in one refusal at start-up (nothing compiled).
  config = config_lib.load_config(str(REPO / "configs/clip_vitb16_ego4d.py"))
  with pytest.raises(errors.ConfigError) as refused:
    startup.resolve(config, tmp_path / "run", splits=("train", "eval"))
  said = refused.value.describe()
  assert said.startswith("2 things to fix before this run can start:"), said
  for unset in (
    "data.root = '' (unset)",
    "data.train_annotations = '' (unset)",
    "eval.sets.ek100_mir.data.eval_annotations = '' (unset)",
    "the training step will not fit in this host's memory",
    ",cpu, or a recipe's :debug",
  ):
    assert unset in said, said
  assert refused.value.exit_code == 2
  assert not (tmp_path / "run").exists()


def test_a_pickle_without_the_opt_in_is_said_with_the_paths(tmp_path):
  config = config_lib.load_config(
    str(REPO / "configs/clip_vitb16_ego4d.py:debug"),
    ["data.train_annotations=/data/ego4d_train.pkl", "data.root=/data/chunks"],
  )
  with pytest.raises(errors.ConfigError) as refused:
    startup.resolve(config, tmp_path / "run", splits=("train", "eval"))
  said = refused.value.describe()
  assert said.startswith("2 things to fix"), said
  assert "data.root = '/data/chunks' (not found)" in said
  assert "data.train_annotations name pickles" in said
  assert "--config.data.allow_pickle=True" in said
