"""What a training step holds per device, known before anything compiles.

    estimate = step_memory(config)        # StepMemory: fixed + kept per clip
    check_step_fits(config)               # start-up: refuse what cannot fit
    check_attention(config)               # start-up: 'cudnn' that cannot run;
                                          # a warning for 'auto' without it

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
batch), and is checked as a second step.
At start-up `check_step_fits` compares that with the device's memory less
`HEADROOM` (cuDNN workspaces, the input batches, the allocator's
fragmentation): what a GPU reports, or `device_memory_gib`, or on a CPU the
host's available memory shared by its devices; it refuses a configuration
that will not fit, naming a remat policy and a batch per device that would
(on a CPU, the recipe's CPU variant first: a GPU recipe typed on a CPU).
On a GPU the step is compiled first and XLA's own figure is held against
the device (`compiled_bytes`; the estimate where it does not compile, and
for the hints); `python -m vidjax.compile` gives the same figure for a GPU
on any machine. A CPU run that plans for a GPU (`device_memory_gib`) gets
the plan's verdict, then its own memory checked: it would train there.
`python -m benchmarks.memory` prints the same estimate for every policy,
as on a GPU with cuDNN.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import dataclasses

from absl import logging
from flax import nnx
import jax
import ml_collections
import numpy as np
import psutil

from vidjax import (
  config as config_lib,
  models,
  optim,
  sharding,
  steps as steps_lib,
  tasks,
)
from vidjax.base import errors, internals
from vidjax.data import batches
from vidjax.models import attention, shapes, spec as spec_lib

GiB, MiB = 2**30, 2**20
HEADROOM = 0.10  # Of the device's memory, kept free for what is not counted.
# The policies under which the backward pass keeps XLA attention's weights
# (the logits are a matmul's output; 'save_attention' keeps only its output).
KEEP_ATTENTION_WEIGHTS = ("none", "save_dots_and_attention", "dots_saveable")
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
# From the policy that keeps the most to the one that keeps the least: the
# first that fits after the configured one is the fastest to suggest.
REMAT_ORDER = (
  "none",
  "save_dots_and_attention",
  "dots_with_no_batch_dims_saveable",
  "save_attention",
  "full",
)


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


def device_memory_bytes(config: ml_collections.ConfigDict) -> int | None:
  """The memory per device to plan with: `device_memory_gib` when stated
  (> 0), else what a GPU reports, else on a CPU the host's available
  memory over its devices (`on_host`); None: no check (-1, other devices)."""
  stated = config.device_memory_gib
  if stated:
    return int(stated * GiB) if stated > 0 else None
  if on_host(config):
    return psutil.virtual_memory().available // jax.local_device_count()
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("bytes_limit") if jax.default_backend() == "gpu" else None


def on_host(config: ml_collections.ConfigDict) -> bool:
  """Whether the step is held against the host's memory: a CPU run that
  states no `device_memory_gib`."""
  return not config.device_memory_gib and jax.default_backend() == "cpu"


class StepTooLarge(errors.ConfigError):
  """A training step that will not fit; `on_host`: in a CPU host's memory
  (`main` then names the recipe's CPU variant)."""

  def __init__(self, message: str, hint: str, *, on_host: bool):
    super().__init__(message, hint)
    self.on_host = on_host


def check_step_fits(
  config: ml_collections.ConfigDict, built: tuple | None = None
) -> StepMemory | None:
  """Refuses, before compiling, a training step that will not fit.

  `built`: the run's abstract (state, rest, steps), see `step_memories`.

  Returns:
    The estimate, or None where the memory is unknown (see
    `device_memory_bytes`).

  Raises:
    StepTooLarge: the estimate exceeds the usable memory; names the
      policy that keeps the most and still fits, and the most clips per
      device that fit under the configured policy (in a CPU host's memory:
      the recipe's CPU variant, the batch that fits, and
      `device_memory_gib` to check it for a GPU).
  """
  limit = device_memory_bytes(config)
  if limit is None:
    return None
  compiled = None
  if built is not None and compiles_first():
    compiled = compiled_step_bytes(config, built)
  estimate = _check_fits(
    config, "the training step", limit, "accum_steps", built, compiled
  )
  if planned_on_cpu(config):
    # The plan's verdict is given; this CPU would go on to train the step,
    # so its own memory is checked too.
    _check_fits(
      config,
      "the training step",
      _host_bytes(),
      "accum_steps",
      built,
      planned=limit,
    )
  if steps_lib.unmask_start(config) is not None:
    # The unmasked tuning keeps every token, in its own microbatches (the
    # same global batch): checked as a second step.
    tuning = config_lib.copy(config)
    tuning.model.mask_ratio = 0.0
    tuning.accum_steps = steps_lib.unmask_accum(config)
    _check_fits(
      tuning, "the unmasked tuning's training step", limit, "unmask_accum_steps"
    )
  return estimate


def compiles_first() -> bool:
  """Whether the start-up check holds the compiled step against the device:
  on a GPU, whose compiler's buffer assignment is the step's memory (the
  step compiled once, before its first run, as MaxText does)."""
  return jax.default_backend() == "gpu"


def compiled_step_bytes(config, built: tuple) -> int | None:
  """The training step's memory per device as XLA compiles it here
  (`compiled_bytes`); the step's first run reuses the compilation. None
  where it does not compile: the analytic estimate decides then.

  Args:
    config: the run config.
    built: the run's abstract (state, rest, steps).
  """
  state, rest, steps = built
  batch = batches.batch_spec(config, config.batch_size)
  key = jax.eval_shape(lambda: jax.random.key(0))
  try:
    compiled = steps.train.lower(state, rest, batch, key).compile()
  except Exception as e:  # noqa: BLE001  (the run itself will say why)
    logging.warning(
      "the training step did not compile for the memory check (%s); the "
      "analytic estimate decides",
      internals.error_reason(e),
    )
    return None
  return compiled_bytes(compiled)


def planned_on_cpu(config: ml_collections.ConfigDict) -> bool:
  """Whether a CPU run plans for a GPU (`device_memory_gib` stated): the
  plan's verdict, then the host's own memory, which the run would use."""
  return config.device_memory_gib > 0 and jax.default_backend() == "cpu"


def _host_bytes() -> int:
  """The host's available memory per local device."""
  return psutil.virtual_memory().available // jax.local_device_count()


def _check_fits(
  config,
  step_name: str,
  limit: int,
  accum_key: str,
  built=None,
  compiled: int | None = None,
  planned: int | None = None,
):
  """`check_step_fits` for one step, its microbatches `config.accum_steps`
  (the hint names `accum_key` to change them). `compiled`: the compiled
  step's bytes per device, held against `limit` instead of the estimate
  (the hints still come from the estimates). `planned`: the memory per
  device a CPU run planned for and passed; `limit` is then the host's."""
  usable = (1 - HEADROOM) * limit
  clips = clips_per_device(config)
  remat, order = config.model.remat, list(REMAT_ORDER)
  host = on_host(config) or planned is not None
  if host:  # XLA's CPU scheduler does not delay recomputation: on a CPU
    remat = "none"  # every policy keeps what 'none' keeps.
  # The configured policy, then (only if it does not fit) those keeping less.
  estimates = step_memories(
    config,
    [remat] + (order[order.index(remat) + 1 :] if remat in order else order),
    built,
  )
  estimate = next(estimates)
  need = estimate.total_bytes(clips) if compiled is None else compiled
  figure = "estimated" if compiled is None else "compiled"
  logging.info(
    "%s: about %.1f GiB per device (%s) of %.1f GiB usable (remat %r, "
    "%s attention, %d clips per device)",
    step_name,
    need / GiB,
    figure,
    usable / GiB,
    estimate.remat,
    estimate.attention,
    clips,
  )
  if need <= usable:
    return estimate
  if host:  # A GPU recipe typed on a CPU, most likely: say so first.
    verdict = (
      f"; it fits the {planned / GiB:.1f} GiB per device planned "
      "(device_memory_gib), but this CPU would train it"
      if planned is not None
      else ""
    )
    raise StepTooLarge(
      f"{step_name} will not fit in this host's memory: about "
      f"{need * jax.local_device_count() / GiB:.1f} GiB for "
      f"{clips * jax.local_device_count()} clips at a time (on a CPU every "
      "remat policy keeps what 'none' keeps) against "
      f"{usable * jax.local_device_count() / GiB:.1f} GiB usable of the "
      f"{limit * jax.local_device_count() / GiB:.1f} GiB available on this "
      f"CPU{verdict}",
      hint=_what_fits_on_host(config, estimate, usable, planned),
      on_host=True,
    )
  fitting = next((e for e in estimates if e.total_bytes(clips) <= usable), None)
  cached = estimate.cached_bytes(clips, config.accum_steps)
  cached = f" + {cached / MiB:.0f} MiB of cached embeddings" if cached else ""
  breakdown = (
    f"{estimate.fixed_bytes / GiB:.1f} GiB of parameters, optimizer state "
    f"and gradients + {estimate.kept_bytes_per_clip / MiB:.0f} MiB kept per "
    f"clip x {clips} clips per device{cached}"
    if compiled is None
    else "as XLA compiled the step"
  )
  hint = _what_fits(config, estimate, fitting, usable, accum_key)
  if compiled is not None:
    hint = f"by the analytic estimate: {hint}"
  raise StepTooLarge(
    f"{step_name} will not fit in the device's memory: about "
    f"{need / GiB:.1f} GiB per device ({breakdown}; remat "
    f"{estimate.remat!r}, {estimate.attention} attention) against "
    f"{usable / GiB:.1f} GiB usable of {limit / GiB:.1f} GiB",
    hint=hint,
    on_host=False,
  )


# The hint's words for the recipes' CPU variants; `main` names the exact
# one (`config.cpu_variant`) where it knows the recipe.
CPU_VARIANT = (
  "its CPU variant (configs/own_videos.py:...,cpu, or a recipe's :debug)"
)


def _what_fits_on_host(
  config, estimate: StepMemory, usable: float, planned: int | None = None
) -> str:
  """A GPU recipe on a CPU: the CPU variant, the batch that fits here, and
  how to check the configuration for a GPU instead (`planned`: it was)."""
  most = estimate.most_clips(usable)
  step = jax.device_count() * config.accum_steps  # What a batch divides by.
  ways = [f"train {CPU_VARIANT}"]
  if most >= 1:
    ways.append(
      f"--config.batch_size={most * step} (at most {most} clips per device "
      "fit here)"
    )
  if planned is not None:
    return (
      f"the plan's verdict is above; to train on this CPU, "
      f"{', or '.join(ways)}; python -m vidjax.compile --gpu NAME compiles "
      "the step for a GPU without training it"
    )
  return (
    f"this is a GPU-sized run: on a CPU, {', or '.join(ways)}; to check it "
    "for a GPU, --config.device_memory_gib=N plans for N GiB per device "
    "(-1: no check)"
  )


def _what_fits(
  config,
  estimate: StepMemory,
  fitting: StepMemory | None,
  usable: float,
  accum_key: str = "accum_steps",
) -> str:
  """The policy that fits at the configured batch (`fitting`), and the
  batch that fits under the configured policy."""
  clips, ways = clips_per_device(config), []
  if fitting:
    ways.append(
      f"--config.model.remat={fitting.remat} (about "
      f"{fitting.total_bytes(clips) / GiB:.1f} GiB)"
    )
  per_step = clips * config.accum_steps  # Clips per device and step.
  cached = estimate.cached_bytes(per_step, 2)  # The same for any accum > 1.
  most = estimate.most_clips(usable, cached)
  accum = next(
    (
      a
      for a in range(config.accum_steps + 1, per_step + 1)
      if per_step % a == 0 and per_step // a <= most
    ),
    None,
  )
  if most >= 1 and accum:
    cost = (
      f"; the loss stays the whole batch's, for one more forward pass "
      f"(4/3 the FLOPs) and {cached / MiB:.0f} MiB of cached embeddings"
      if estimate.cached_bytes_per_clip
      else ""
    )
    ways.append(
      f"--config.{accum_key}={accum} ({per_step // accum} clips per "
      f"device at a time, the same global batch{cost}; at most {most} "
      "clips per device fit)"
    )
  elif most >= 1:
    ways.append(f"a batch of at most {most} clips per device")
  if estimate.attention == "xla" and jax.default_backend() == "gpu":
    ways.append("cuDNN attention (see the warning above)")
  return ("; or ".join(ways) or "a smaller model") + (
    ". --config.device_memory_gib=N plans for N GiB per device instead "
    "(-1: no check)"
  )


def check_attention(config: ml_collections.ConfigDict) -> str | None:
  """Checks at start-up that the configured attention can run here.

  `model.attention='cudnn'` where a tower cannot use cuDNN (no NVIDIA GPU,
  no cuDNN library, a float32 model, a head size it does not take) is
  refused. On a GPU, `'auto'` that falls back to XLA is warned about
  loudly: XLA attention materialises each layer's softmax weights (heads x
  T x T per clip); the policies that keep matmul outputs for the backward
  pass keep them, which multiplies the memory per clip.

  Returns:
    The warning logged, or None.

  Raises:
    errors.ConfigError: 'cudnn' cannot run, with the reason.
  """
  model = config.model
  if model.attention == "xla" or (
    model.attention == "auto" and jax.default_backend() != "gpu"
  ):
    return None
  dtype = models.resolve_dtype(model.dtype)
  towers = shapes.attention_shapes(model)
  reasons = {
    name: attention.cudnn_unsupported_reason(s.head_dim, dtype)
    for name, s in towers.items()
  }
  fallen = [name for name, reason in reasons.items() if reason]
  if not fallen:
    return None
  if model.attention == "cudnn":
    raise errors.ConfigError(
      f"'model.attention' = 'cudnn' cannot run in the {fallen[0]} tower: "
      f"{reasons[fallen[0]]}; 'auto' uses cuDNN where it can, else XLA",
      hint="change it with --config.model.attention=auto",
    )
  weights = sum(
    s.layers * s.heads * s.tokens**2 * np.dtype(dtype).itemsize
    for name, s in towers.items()
    if name in fallen
  )
  consequence = (
    "keeps them for the backward pass: expect several times the memory "
    "per clip, and out-of-memory where cuDNN fits"
    if model.remat in KEEP_ATTENTION_WEIGHTS
    else "recomputes them: expect a slower step"
  )
  message = (
    f"attention='auto' runs XLA attention, not cuDNN flash attention, in "
    f"the {' and '.join(fallen)} tower{'s' * (len(fallen) > 1)}: "
    f"{reasons[fallen[0]]}. XLA materialises every layer's attention "
    f"weights (heads x tokens x tokens: {weights / MiB:.0f} MiB per clip "
    f"over all layers); remat {model.remat!r} {consequence}. Fix the "
    "cause, or set model.attention='xla' to choose XLA knowingly "
    "('cudnn' stops at start-up instead)"
  )
  logging.warning("%s", message)
  return message
