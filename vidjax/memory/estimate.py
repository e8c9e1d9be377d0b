"""What a training step holds per device, estimated before anything compiles.

`step_memory` traces the run's own training loss (`vidjax.steps`) on
abstract arrays: nothing is allocated or compiled. What it counts:

  kept per clip  the activations the backward pass keeps for one clip: JAX's
                 saved residuals of the loss (`jax.ad_checkpoint`), scaled
                 by what XLA's GPU program keeps of them under the policy
                 (`XLA_KEEPS`: its fusion recomputes cheap elementwise
                 values; a recomputing policy's backward pass holds one
                 block's recomputed activations), measured for every recipe
                 with `python -m vidjax.compile` (BENCHMARKS.md): the
                 estimate is 1.0-1.3x the compiled step's need; and the
                 clip's share of the step's input batch;
  fixed          what does not grow with the batch: parameters, optimizer
                 state and gradients (float32, per device under FSDP, none
                 for `optim.frozen` parameters; a second gradient buffer
                 with `accum_steps` > 1), the
                 untrained state (a distilled student's frozen teacher),
                 the residuals every clip shares (bf16 copies of the
                 weights, which a cuDNN program casts inside its GEMMs
                 instead), and `SMALL_TEMPORARIES`.

The step then needs about fixed + kept x clips per device (per microbatch);
a contrastive or MIR step in several microbatches (`accum_steps` > 1) also
holds the whole step's embeddings and their gradients (GradCache, see
`vidjax.steps`), a few KiB per clip.
Under masked training (a CLIP's `model.mask_ratio`) the loss keeps what
the kept tokens need, so the run is sized by its masked step (FLIP spends
the memory masking saves on a larger batch); an unmasked tuning keeps every
token's, in its own microbatches (`unmask_accum_steps`, the same global
batch), and is checked as a second step (`check`).
`python -m benchmarks.memory` prints the same estimate for every policy,
as on a GPU with cuDNN.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import dataclasses

from flax import nnx
import jax
import ml_collections
import numpy as np

from vidjax import (
  config as config_lib,
  models,
  optim,
  sharding,
  steps as steps_lib,
  tasks,
)
from vidjax.base import internals
from vidjax.data import batches
from vidjax.models import attention, shapes, spec as spec_lib

GiB, MiB = 2**30, 2**20
# What XLA's GPU program keeps of the residuals JAX saves, by policy, for
# a program with cuDNN attention: measured by compiling every recipe for 8
# H100s, its work ordered for the least memory, at 1 clip per GPU up to 4x
# the recipe's batch, and egtea_ft under every policy (`python -m
# vidjax.compile`, BENCHMARKS.md), rounded up. Under 'none' XLA's fusion
# recomputes the LayerNorm and activation values JAX saves (0.49-0.78 of
# them kept: egtea_ft, k400_ft, videomae, umt); under the policies that
# recompute, the backward pass of each block holds that block's recomputed
# activations beside what the policy keeps (1.06x under
# save_dots_and_attention, 1.08x under dots_with_no_batch_dims_saveable,
# 1.35x under save_attention, 1.54x under full). XLA casts the weights to
# bf16 inside the GEMMs too, so the casts JAX saves once for every clip are
# not counted. A policy not measured takes the largest factor; programs
# with XLA's attention (no cuDNN) are estimated from JAX's residuals as
# they are.
XLA_KEEPS = {
  "none": 0.80,
  "save_dots_and_attention": 1.10,
  "dots_with_no_batch_dims_saveable": 1.12,
  "save_attention": 1.40,
  "full": 1.60,
}
# The loss's and the optimizer's small temporaries that no residual counts
# (logits and their gradients, the update's intermediates): a probe's whole
# step holds ~1 MiB of them.
SMALL_TEMPORARIES = 16 * MiB


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """A training step's memory per device (see the module docstring)."""

  remat: str
  attention: str  # The vision tower's implementation: 'cudnn' or 'xla'.
  kept_bytes_per_clip: float
  fixed_bytes: float
  # A task whose loss couples the batch (contrastive, MIR) accumulates by
  # caching the whole step's embeddings and their gradients: bytes per clip
  # of the step (not of the microbatch), held when accum_steps > 1.
  cached_bytes_per_clip: float = 0.0
  accum_steps: int = 1

  def cached_bytes(self, clips_per_device: int, accum_steps: int) -> float:
    """The cached embeddings' bytes at `clips_per_device` per microbatch."""
    if accum_steps == 1:
      return 0.0
    return self.cached_bytes_per_clip * clips_per_device * accum_steps

  def total_bytes(
    self, clips_per_device: int, accum_steps: int | None = None
  ) -> float:
    """Per device at `clips_per_device` per microbatch, in `accum_steps`
    microbatches (the config's when None)."""
    accum = self.accum_steps if accum_steps is None else accum_steps
    return (
      self.fixed_bytes
      + self.kept_bytes_per_clip * clips_per_device
      + self.cached_bytes(clips_per_device, accum)
    )

  def most_clips(self, usable_bytes: float, cached_bytes: float = 0.0) -> int:
    """The most clips per device (per microbatch) that fit in
    `usable_bytes`, beside `cached_bytes` of cached embeddings (0 if none
    fit)."""
    free = usable_bytes - self.fixed_bytes - cached_bytes
    return max(0, int(free // self.kept_bytes_per_clip))


def compiled_bytes(compiled) -> int:
  """A compiled program's memory per device, from XLA's buffer assignment:
  arguments + outputs - what the outputs alias (donated arguments) + the
  temporaries. (`peak_memory_in_bytes` means different sums across jaxlib
  0.10 releases.)

  Args:
    compiled: a `jax.stages.Compiled`.
  """
  a = compiled.memory_analysis()
  return (
    a.argument_size_in_bytes
    + a.output_size_in_bytes
    - a.alias_size_in_bytes
    + a.temp_size_in_bytes
  )


def clips_per_device(config: ml_collections.ConfigDict) -> int:
  """Clips each device processes at once: one microbatch's share."""
  return config.batch_size // config.accum_steps // jax.device_count()


def _per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
  return sum(
    int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
    for x in jax.tree.leaves(tree)
  )


# The loss is traced once, at `_TRACED_CLIPS` clips per device: a prime no
# size of a model is a multiple of, so a residual's dimension that is a
# multiple of it grows with the batch and the others do not (a [B, B]
# similarity grows with its square). What the backward pass keeps at any
# batch follows from that one trace.
_TRACED_CLIPS = 1009


def _kept_for_backward(config, steps, state, rest):
  """Bytes of the residuals the training loss keeps for its backward pass,
  as a function of the global batch size (residuals that are its inputs
  not counted)."""
  traced = jax.device_count() * config.data.get("repeats", 1) * _TRACED_CLIPS
  batch = batches.batch_spec(config, traced)
  key = jax.eval_shape(lambda: jax.random.key(0))

  def loss(params, rest, batch, key):
    return steps.loss(params, rest, batch, key)[0]

  residuals = [
    (aval.shape, aval.dtype.itemsize)
    for aval, where in internals.saved_residuals(
      loss, state["params"], rest, batch, key
    )
    if not where.startswith("from the argument")
  ]

  def kept(batch_size: int) -> int:
    scale = batch_size / traced
    return round(
      sum(
        itemsize
        * np.prod([d * scale if d % _TRACED_CLIPS == 0 else d for d in shape])
        for shape, itemsize in residuals
      )
    )

  return kept


def _batch_bytes(config, batch_size: int) -> int:
  """Bytes of the step's input batch at global `batch_size`."""
  spec = batches.batch_spec(config, batch_size)
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(spec))


def _trained_bytes(params, optim_config: ml_collections.ConfigDict) -> int:
  """Bytes per device of the parameters that get gradients: all but those
  under `optim.frozen` (a probe's encoder)."""
  frozen = tuple(optim_config.get("frozen") or ())
  if not frozen:
    return _per_device_bytes(params)
  labels = optim.frozen_labels(params, frozen)
  return _per_device_bytes(
    [
      x
      for x, label in zip(jax.tree.leaves(params), jax.tree.leaves(labels))
      if label == "train"
    ]
  )


def vision_attention(model: ml_collections.ConfigDict) -> str:
  """The attention implementation the model's vision tower will run."""
  shape = shapes.attention_shapes(model)["vision"]
  try:
    return attention.resolve_implementation(
      model.attention, shape.head_dim, models.resolve_dtype(model.dtype)
    )
  except ValueError:  # 'cudnn' where it cannot run: the model says so.
    return model.attention


def step_memories(
  config: ml_collections.ConfigDict,
  remats: Sequence[str],
  built: tuple | None = None,
) -> Iterator[StepMemory]:
  """The training step's memory per device under each policy, in turn.

  The policies change only what the blocks keep: each is the model of the
  spec with that policy (`spec.with_compute`), its construction traced
  abstractly (about a second for a ViT-B).

  Args:
    config: the run config (its task, model, optimizer, fsdp, accum_steps).
    remats: `model.remat` policies.
    built: the run's own abstract (state, rest, steps), from
      `steps.build_state_and_steps(abstract=True)`: used for the config's
      own policy instead of building them again.

  Yields:
    A `StepMemory` per policy; `total_bytes(clips_per_device(config))` is
    the step's.
  """
  config = config_lib.copy(config)
  mesh = sharding.make_mesh(fsdp=config.fsdp)
  task = tasks.get_task(config.task)
  spec = spec_lib.from_config(config.model)
  own = config.model.remat
  for remat in remats:
    config.model.remat = remat
    if built is not None and remat == own:
      state, rest, steps = built
    else:
      variant = spec_lib.with_compute(spec, remat=remat)
      model = nnx.eval_shape(
        lambda s=variant: models.build_model(s, rngs=nnx.Rngs(config.seed))
      )
      state, rest, steps = steps_lib.build_state_and_steps(
        config, task, mesh, abstract=True, model=model
      )
    # Two batch sizes split the residuals into per-clip and shared ones
    # (per view with `data.repeats`: the batches hold a clip per device).
    small = jax.device_count() * config.data.get("repeats", 1)
    large = 2 * small
    kept = _kept_for_backward(config, steps, state, rest)
    kept_small, kept_large = kept(small), kept(large)
    per_clip = (kept_large - kept_small) / (large - small)
    shared = kept_small - per_clip * small
    attention_kind = vision_attention(config.model)
    if attention_kind == "cudnn":  # XLA's GPU program, as measured.
      per_clip *= XLA_KEEPS.get(remat, max(XLA_KEEPS.values()))
      shared = 0.0  # The weights' bf16 casts: fused into the GEMMs.
    per_clip += (_batch_bytes(config, large) - _batch_bytes(config, small)) / (
      large - small
    )
    gradients = _trained_bytes(state["params"], config.optim)
    fixed = (
      _per_device_bytes(state)
      # The untrained state: a distilled student's frozen teacher.
      + _per_device_bytes(rest)
      + gradients * (1 + (config.accum_steps > 1))
      + shared
      + SMALL_TEMPORARIES
    )
    yield StepMemory(
      remat,
      attention_kind,
      per_clip,
      fixed,
      cached_bytes_per_clip=_cached_per_clip(config, steps, state, rest),
      accum_steps=config.accum_steps,
    )


def _cached_per_clip(config, steps, state, rest) -> float:
  """Bytes per clip that accumulation by embedding cache holds: the clip's
  embeddings and their gradients (0 for a task that does not cache)."""
  if steps.embed is None:
    return 0.0
  clips = jax.device_count()
  embeddings = jax.eval_shape(
    steps.embed,
    state["params"],
    rest,
    batches.batch_spec(config, clips),
    jax.eval_shape(lambda: jax.random.key(0)),
  )
  size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(embeddings))
  return 2 * size / clips


def step_memory(
  config: ml_collections.ConfigDict, *, remat: str | None = None
) -> StepMemory:
  """`step_memories` for one policy: `remat`, else the config's."""
  return next(step_memories(config, [remat or config.model.remat]))
