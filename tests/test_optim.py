"""Tests for vidjax.optim: decay mask, schedules, layer decay, optimizers."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vidjax import optim
from vidjax.base import keypaths
from vidjax.config import defaults


def _params():
  """A ViT-shaped pytree: embeddings, two blocks, final norm and head."""
  block = lambda: {
    "attn": {"qkv": {"kernel": jnp.ones((4, 12)), "bias": jnp.ones(12)}},  # noqa: E731
    "norm1": {"scale": jnp.ones(4), "bias": jnp.ones(4)},
  }
  return {
    "patch_embed": {"kernel": jnp.ones((2, 2, 3, 4)), "bias": jnp.ones(4)},
    "pos_embed": jnp.ones((1, 5, 4)),
    "cls_token": jnp.ones((1, 1, 4)),
    "blocks": [block(), block()],
    "norm": {"scale": jnp.ones(4)},
    "head": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones(3)},
    "token_embedding": {"embedding": jnp.ones((10, 4))},
    "logit_scale": jnp.ones(()),
  }


def _by_path(tree):
  return {
    keypaths.name(p, "/"): v
    for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def test_default_config_has_documented_keys():
  config = defaults.optim_config()
  for key in (
    "name",
    "lr",
    "min_lr",
    "warmup_steps",
    "schedule",
    "weight_decay",
    "b1",
    "b2",
    "eps",
    "momentum",
    "nesterov",
    "clip_grad_norm",
    "layer_decay",
    "num_layers",
    "mu_dtype",
  ):
    assert key in config and key in optim.__doc__


def test_decay_mask_excludes_biases_norms_embeddings():
  mask = _by_path(
    optim.decay_mask(_params(), defaults.optim_config().no_decay_names)
  )
  decayed = {k for k, v in mask.items() if v}
  assert decayed == {
    "patch_embed/kernel",
    "blocks/0/attn/qkv/kernel",
    "blocks/1/attn/qkv/kernel",
    "head/kernel",
  }


def test_parameter_names_are_keystr_less_a_final_value():
  tree = {"value": {"a": [1, {"value": 2}]}, "b": nnx.Param(jnp.ones(()))}
  names = [
    keypaths.name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
  ]
  assert names == ["b", "value.a.0", "value.a.1"]


def test_mask_token_decays_as_in_avion():
  # A vector here, [1, 1, D] in AVION's VideoMAE, whose rule decays it.
  mask = optim.decay_mask(
    {"mask_token": jnp.zeros(8), "bias": jnp.zeros(8)}, ("pos_embed",)
  )
  assert mask == {"mask_token": True, "bias": False}


def test_decay_mask_on_nnx_state():
  model = nnx.Sequential(
    nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.LayerNorm(4, rngs=nnx.Rngs(0))
  )
  state = nnx.state(model, nnx.Param)
  mask = _by_path(optim.decay_mask(state, ()))
  assert mask == {
    "layers/0/kernel": True,
    "layers/0/bias": False,
    "layers/1/scale": False,
    "layers/1/bias": False,
  }
  # The whole optimizer steps an nnx.State (weight decay mask included).
  config = defaults.optim_config()
  config.layer_decay = 0.5
  tx, _ = optim.make_optimizer(config, 10)
  grads = jax.tree.map(jnp.ones_like, state)
  updates, _ = tx.update(grads, tx.init(state), state)
  assert set(_by_path(updates)) == set(mask)


def test_schedule_warmup_then_cosine_or_constant():
  config = defaults.optim_config()
  config.update(lr=1.0, min_lr=0.1, warmup_steps=10)
  sched = optim.make_schedule(config, total_steps=110)
  np.testing.assert_allclose(
    [sched(0), sched(5), sched(10)], [0.0, 0.5, 1.0], atol=1e-6
  )
  np.testing.assert_allclose(
    sched(60), 0.1 + 0.9 * 0.5, atol=1e-6
  )  # Halfway: cos = 0.
  np.testing.assert_allclose([sched(110), sched(500)], [0.1, 0.1], atol=1e-6)
  config.schedule = "constant"
  sched = optim.make_schedule(config, total_steps=110)
  np.testing.assert_allclose(
    [sched(5), sched(10), sched(100)], [0.5, 1.0, 1.0], atol=1e-6
  )
  config.schedule = "linear"
  with pytest.raises(ValueError, match="schedule"):
    optim.make_schedule(config, 110)


def _schedule_as_written(lr, min_lr, warmup, total, cosine, step):
  """vidjax's schedule as it was written before optax's replaced it."""
  step = np.float32(step)
  if step < warmup:
    return lr * step / max(warmup, 1)
  if not cosine:
    return lr
  progress = np.clip((step - warmup) / max(total - warmup, 1), 0.0, 1.0)
  return min_lr + 0.5 * (lr - min_lr) * (1 + np.cos(np.pi * progress))


def test_optax_schedules_equal_the_ones_written_before():
  config = defaults.optim_config()
  for warmup, total, schedule in [
    (0, 50, "cosine"),
    (10, 110, "cosine"),
    (7, 8, "cosine"),
    (20, 20, "cosine"),
    (30, 20, "cosine"),
    (0, 5, "constant"),
    (10, 110, "constant"),
  ]:
    config.update(lr=3e-4, min_lr=1e-6, warmup_steps=warmup, schedule=schedule)
    sched = optim.make_schedule(config, total_steps=total)
    steps = np.arange(total + 1)
    expected = [
      _schedule_as_written(3e-4, 1e-6, warmup, total, schedule == "cosine", s)
      for s in steps
    ]
    np.testing.assert_allclose(
      np.asarray(sched(steps)),
      expected,
      rtol=1e-5,
      atol=1e-12,
      err_msg=f"{warmup} {total} {schedule}",
    )


def test_layer_ids_and_scales():
  scales = _by_path(
    optim.layer_scales(_params(), 0.5)
  )  # L = 2 inferred from 'blocks/<i>'.
  assert (
    scales["patch_embed/kernel"]
    == scales["pos_embed"]
    == scales["cls_token"]
    == 0.5**3
  )
  assert (
    scales["blocks/0/attn/qkv/kernel"]
    == scales["blocks/0/norm1/bias"]
    == 0.5**2
  )
  assert scales["blocks/1/attn/qkv/kernel"] == 0.5
  assert scales["head/kernel"] == scales["norm/scale"] == 1.0
  layer_id = optim.regex_layer_id(defaults.optim_config().layer_regex, "embed")
  assert layer_id("encoder/layers_11/mlp/kernel", 12) == 12
  assert layer_id("visual.transformer.resblocks.3.attn.in_proj_weight", 12) == 4
  with pytest.raises(ValueError, match="layer_regex"):
    optim.layer_scales({"w": jnp.ones(2)}, 0.5)


def test_layer_decay_scales_updates_per_layer():
  """With SGD the update is -lr * scale * grad, so the ratios are the layer scales."""
  config = defaults.optim_config()
  config.update(
    name="sgd",
    momentum=0.0,
    weight_decay=0.0,
    lr=1.0,
    schedule="constant",
    layer_decay=0.75,
  )
  params = _params()
  grads = jax.tree.map(jnp.ones_like, params)
  tx, _ = optim.make_optimizer(config, 10)
  updates = _by_path(jax.jit(tx.update)(grads, tx.init(params), params)[0])
  for path, scale in _by_path(optim.layer_scales(params, 0.75)).items():
    np.testing.assert_allclose(
      updates[path], -scale * np.ones_like(updates[path]), rtol=1e-6
    )
  # A custom layer_id_fn: everything in layer 0 of L=2, so scale 0.75 ** 3.
  tx, _ = optim.make_optimizer(
    config, 10, layer_id_fn=lambda path, num_layers: 0
  )
  head = _by_path(tx.update(grads, tx.init(params), params)[0])["head/kernel"]
  np.testing.assert_allclose(head, -(0.75**3), rtol=1e-6)


def _loss(params, x, y):
  return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


@pytest.mark.parametrize("name", ["adamw", "sgd", "lion"])
def test_optimizers_step_a_tiny_pytree(name):
  config = defaults.optim_config()
  config.update(
    name=name, lr=0.05, warmup_steps=2, mu_dtype="bfloat16", weight_decay=0.1
  )
  tx, schedule = optim.make_optimizer(config, total_steps=50)
  assert float(schedule(1)) == pytest.approx(0.025)  # Halfway through warmup.
  params = {
    "w": jnp.array([[1.0, -2.0], [0.5, 3.0]]),
    "b": jnp.array([0.3, -0.3]),
  }
  target = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}
  loss = lambda p: sum(jnp.sum((p[k] - target[k]) ** 2) for k in p)  # noqa: E731
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  start = loss(params)
  for _ in range(30):
    params, state = step(params, state)
  assert loss(params) < 0.5 * start
  moments = [x for x in jax.tree.leaves(state) if getattr(x, "ndim", 0) >= 1]
  assert any(x.dtype == jnp.bfloat16 for x in moments)  # mu_dtype honoured.


def test_bad_optimizer_name():
  config = defaults.optim_config()
  config.name = "adam"
  with pytest.raises(ValueError, match="config.name"):
    optim.make_optimizer(config, 10)
