"""bf16 options of the model (compute, residual stream, LayerNorms): the
training loss and its gradients stay within tolerance of float32."""

from pathlib import Path

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from vidjax import config as config_lib, models, tasks

RECIPE = Path(__file__).parents[1] / "configs/clip_vitb16_ego4d.py"
BF16 = dict(dtype="bfloat16", residual_dtype="bfloat16", norm_dtype="bfloat16")


def _ops(jaxpr) -> set[tuple[str, str]]:
  """(primitive, output dtype) of every equation, nested jaxprs included."""
  ops = set()
  for eqn in jaxpr.eqns:
    ops.update(
      (eqn.primitive.name, str(v.aval.dtype))
      for v in eqn.outvars
      if hasattr(v.aval, "dtype")
    )
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          ops |= _ops(inner)
  return ops


def test_bf16_stream_norms_and_activation_keep_loss_and_gradients_close():
  config = config_lib.load_config(f"{RECIPE}:debug")
  task = tasks.get_task(config.task)
  # float32 parameters, as every variant trains them; one device.
  _, params, rest = nnx.split(
    models.build_model(config.model, rngs=nnx.Rngs(0)), nnx.Param, ...
  )
  keys = jax.random.split(jax.random.key(0), 3)
  batch = {
    "video": jax.random.normal(keys[0], (8, 4, 64, 64, 3)),
    "tokens": jax.random.randint(keys[1], (8, 77), 1, 1024),
    "valid": jnp.ones(8, bool),
  }
  results = {}
  for name, model in (("float32", {}), ("bfloat16", BF16)):
    variant = config.copy_and_resolve_references()
    variant.model.update(model)
    graphdef = nnx.split(
      nnx.eval_shape(
        lambda c=variant: models.build_model(c.model, rngs=nnx.Rngs(0))
      ),
      nnx.Param,
      ...,
    )[0]

    def loss(p, graphdef=graphdef, variant=variant):
      return task.loss(nnx.merge(graphdef, p, rest), batch, keys[2], variant)[0]

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    flat = np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)])
    results[name] = float(value), flat, _ops(jax.make_jaxpr(loss)(params).jaxpr)
  (loss32, grads32, ops32), (loss16, grads16, ops16) = results.values()
  assert abs(loss16 - loss32) < 0.01 * loss32, (loss16, loss32)
  error = np.linalg.norm(grads16 - grads32) / np.linalg.norm(grads32)
  assert error < 0.1, error
  # The options do what they say: QuickGELU's sigmoid, the LayerNorms'
  # normalisation and the residual adds run in bfloat16.
  for op in ("logistic", "rsqrt", "add"):
    assert (op, "bfloat16") in ops16 and (op, "bfloat16") not in ops32, op
