"""The jitted train step: compiled once, whatever the FSDP split."""

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from benchmarks import random_batches
from vidjax import config as config_lib, sharding, steps as steps_lib, tasks
from vidjax.data import batches


def _config(fsdp):
  """The K400 recipe's :debug, widened so that FSDP splits some weights."""
  config = config_lib.load_config(
    str(Path(__file__).parents[1] / "configs/k400_ft.py:debug")
  )
  config.fsdp = fsdp
  # 256 x 1024 MLP kernels reach sharding.DEFAULT_FSDP_MIN_SIZE; the biases
  # and norms stay replicated: the mix that made step 2 compile again.
  config.model.update(width=256, depth=1, heads=4)
  # The clip augmentations add compile time and no state: off.
  config.augment.update(
    randaugment_layers=0, erase_prob=0.0, mixup_alpha=0.0, cutmix_alpha=0.0
  )
  return config


@pytest.mark.parametrize("fsdp", [1, 8])
def test_train_step_compiles_once_over_three_steps(fsdp):
  config = _config(fsdp)
  mesh = sharding.make_mesh(fsdp=fsdp)
  state, rest, steps = steps_lib.build_state_and_steps(
    config, tasks.get_task(config.task), mesh
  )
  first_shardings = jax.tree.map(lambda x: x.sharding, state)
  if fsdp > 1:
    specs = {s.spec for s in jax.tree.leaves(first_shardings)}
    assert sharding.P() in specs and len(specs) > 1  # Split and replicated.
  batch = random_batches.random_batch(config, 16, mesh)
  key = jax.random.key(config.seed)
  for _ in range(3):
    state, metrics = steps.train(state, rest, batch, key)
    jax.block_until_ready(metrics)  # CPU collectives: never queue many steps.
  assert steps.train._cache_size() == 1
  assert int(state["step"]) == 3
  assert jax.tree.map(lambda x: x.sharding, state) == first_shardings


def test_frames_reach_the_model_in_the_compute_dtype(monkeypatch):
  """The augment hands the model bf16 frames when it computes in bf16."""
  config = _config(fsdp=1)
  config.model.dtype = "bfloat16"
  task = tasks.get_task(config.task)
  seen = []

  def loss(model, batch, key, config):
    seen.append(batch["video"].dtype)
    return jnp.zeros(()), {}

  monkeypatch.setattr(task, "loss", loss)
  state, rest, steps = steps_lib.build_state_and_steps(
    config, task, sharding.make_mesh(), abstract=True
  )
  jax.eval_shape(
    steps.loss,
    state["params"],
    rest,
    batches.batch_spec(config, 8),
    jax.random.key(0),
  )
  assert seen == [jnp.bfloat16]
