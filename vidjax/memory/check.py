"""The start-up checks: a training step that will not fit, attention that
cannot run.

`check_step_fits` compares the step's memory (`estimate`) with the device's
memory less `HEADROOM` (cuDNN workspaces, the input batches, the
allocator's fragmentation): what a GPU reports, or `device_memory_gib`, or
on a CPU the host's available memory shared by its devices; it refuses a
configuration that will not fit, naming a remat policy and a batch per
device that would (on a CPU, the recipe's CPU variant first: a GPU recipe
typed on a CPU).
On a GPU the step is compiled first and XLA's own figure is held against
the device (`compiled_bytes`; the estimate where it does not compile, and
for the hints); `python -m vidjax.compile` gives the same figure for a GPU
on any machine. A CPU run that plans for a GPU (`device_memory_gib`) gets
the plan's verdict, then its own memory checked: it would train there.
"""

from __future__ import annotations

from absl import logging
import jax
import ml_collections
import numpy as np
import psutil

from vidjax import config as config_lib, models, steps as steps_lib
from vidjax.base import errors, internals
from vidjax.data import batches
from vidjax.memory.estimate import (
  GiB,
  MiB,
  StepMemory,
  clips_per_device,
  compiled_bytes,
  step_memories,
)
from vidjax.models import attention, shapes

HEADROOM = 0.10  # Of the device's memory, kept free for what is not counted.
# The policies under which the backward pass keeps XLA attention's weights
# (the logits are a matmul's output; 'save_attention' keeps only its output).
KEEP_ATTENTION_WEIGHTS = ("none", "save_dots_and_attention", "dots_saveable")
# From the policy that keeps the most to the one that keeps the least: the
# first that fits after the configured one is the fastest to suggest.
REMAT_ORDER = (
  "none",
  "save_dots_and_attention",
  "dots_with_no_batch_dims_saveable",
  "save_attention",
  "full",
)


def usable_bytes(limit: float) -> float:
  """What a step may use of a device with `limit` bytes: less `HEADROOM`."""
  return (1 - HEADROOM) * limit


def device_memory_bytes(config: ml_collections.ConfigDict) -> int | None:
  """The memory per device to plan with: `device_memory_gib` when stated
  (> 0), else what a GPU reports, else on a CPU the host's available
  memory over its devices (`on_host`); None: no check (-1, other devices)."""
  stated = config.device_memory_gib
  if stated:
    return int(stated * GiB) if stated > 0 else None
  if on_host(config):
    return _host_bytes()
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
  usable = usable_bytes(limit)
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
