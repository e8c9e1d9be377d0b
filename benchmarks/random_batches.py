"""Random device batches of the pipeline's shapes: steps timed without video."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections

from vidjax import sharding
from vidjax.data import batches


def random_batch(
  config: ml_collections.ConfigDict,
  batch_size: int,
  mesh: jax.sharding.Mesh,
  seed: int = 0,
) -> dict[str, jax.Array]:
  """A device-resident random batch of `batch_spec`, sharded as the pipeline's.

  Frames are uniform uint8, tokens uniform over the text tower's vocabulary,
  labels over the classifier's classes; every element is valid. Made on the
  devices, so that a benchmark times the step without the host in the way.
  """
  spec = batches.batch_spec(config, batch_size)
  high = {
    "tokens": config.model.text.vocab_size if "text" in config.model else 1,
    **{
      name: config.model.num_classes if "num_classes" in config.model else 1
      for name in ("label", "verb", "noun")
    },
  }

  @functools.partial(jax.jit, out_shardings=sharding.batch_sharding(mesh))
  def make(key):
    keys = dict(zip(spec, jax.random.split(key, len(spec))))
    out = {}
    for name, s in spec.items():
      if name == "video":
        out[name] = jax.random.bits(keys[name], s.shape, jnp.uint8)
      elif name in high:
        out[name] = jax.random.randint(
          keys[name], s.shape, 0, high[name], jnp.int32
        )
      elif name == "index":
        out[name] = jnp.arange(batch_size, dtype=jnp.int32)
      else:  # view, skipped: 0; valid: True.
        out[name] = jnp.full(s.shape, name == "valid", s.dtype)
    return out

  return make(jax.random.key(seed))
