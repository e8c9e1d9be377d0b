"""Accumulation that keeps a batch loss: the contrastive and MIR losses over
the whole global batch under `accum_steps` > 1 (GradCache, `vidjax.steps`),
SMS on every in-batch pair's relevancy too."""

import jax
import numpy as np

from benchmarks import random_batches
from debug_runs import load
from vidjax import sharding, steps as steps_lib, tasks


def test_accumulated_gradients_of_a_batch_loss_equal_the_whole_batchs():
  """The contrastive and MIR losses' gradients in 4 microbatches equal the
  unsplit batch's, on the 8 devices (one tiny CLIP for every loss)."""
  assert jax.device_count() == 8
  config = load(
    "demo",
    "--config.batch_size=32",
    "--config.data.num_frames=2",
    "--config.data.size=32",
    "--config.model.depth=1",
    "--config.model.text.layers=1",
  )
  mesh = sharding.make_mesh()
  state, rest, _ = steps_lib.build_state_and_steps(
    config, tasks.get_task(config.task), mesh
  )
  batch = random_batches.random_batch(config, 32, mesh, seed=1)
  valid = (
    np.arange(32) % 7 != 3
  )  # Unreadable clips: neither anchor nor negative.
  batch["valid"] = jax.device_put(valid, batch["valid"].sharding)
  # The pairs' classes: verbs and noun sets of 0, 0.5 and 1 relevancy.
  rng = np.random.default_rng(3)
  nouns = np.full((2, 32, 16), -1, np.int32)
  nouns[:, :, :2] = rng.integers(0, 3, (2, 32, 2))
  nouns[:, :, 1] = np.where(
    nouns[:, :, 1] == nouns[:, :, 0], -1, nouns[:, :, 1]
  )
  classes = dict(
    verb=rng.integers(0, 3, 32),
    caption_verb=rng.integers(0, 3, 32),
    nouns=nouns[0],
    caption_nouns=nouns[1],
  )
  for key, value in classes.items():
    batch[key] = jax.device_put(value.astype(np.int32), batch["valid"].sharding)
  mir = load("ek100_mir_ft")  # The same backbone, the max-margin loss.
  sms = load("ek100_mir_ft:sms")
  for task, loss_config in (
    ("contrastive", mir.loss),
    ("retrieval", mir.loss),
    ("retrieval", sms.loss),
  ):
    config.task, config.loss = task, loss_config
    out = {}
    for accum in (1, 4):
      config.accum_steps = accum
      assert steps_lib.caches_embeddings(config) == (accum > 1)
      steps = steps_lib.build_state_and_steps(
        config, tasks.get_task(task), mesh, abstract=True
      )[2]
      out[accum] = jax.tree.map(
        np.asarray,
        jax.jit(steps.gradients)(
          state["params"], rest, batch, jax.random.key(2)
        ),
      )
    ((loss, metrics), grads), ((loss4, metrics4), grads4) = out[1], out[4]
    np.testing.assert_allclose(loss4, loss, rtol=1e-5)
    for k in metrics:  # The accuracies are the whole batch's too.
      np.testing.assert_allclose(metrics4[k], metrics[k], rtol=1e-5)
    flat = jax.tree_util.tree_leaves_with_path(grads)
    scale = max(np.abs(g).max() for _, g in flat)
    for (path, g), g4 in zip(flat, jax.tree.leaves(grads4)):
      np.testing.assert_allclose(
        g4, g, rtol=1e-4, atol=1e-6 * scale, err_msg=f"{task} {path}"
      )


def test_accumulation_by_embedding_cache_traces_under_every_remat_policy():
  """The cached embeddings are computed in a loop that carries the
  parameters: a model merged from values closed over from outside the loop
  cannot run nnx.remat's blocks (it failed to trace for any policy but
  'none')."""
  from vidjax import config as config_lib, startup
  from vidjax.data import batches

  config = load("demo", "--config.accum_steps=2", "--config.model.remat=full")
  _, _, (state, rest, steps) = startup.build_abstract(config_lib.lock(config))
  key = jax.eval_shape(lambda: jax.random.key(0))
  batch = batches.batch_spec(config, config.batch_size)
  steps.train.trace(state, rest, batch, key)  # Raised TraceContextError.
