"""A run's own steps compiled for a GPU target, on any machine.

    python -m vidjax.compile --config configs/NAME.py[:ARG] --gpu h100 \\
        --devices 8 [--json FILE] [--config.KEY=VALUE ...]

The training step (the unmasked tuning's too, where the run has one) and
the evaluation step, exactly as `vidjax.startup` builds them for the run
(`startup.build_abstract`: shardings, donation, remat, accumulation,
masking, dtypes), over a mesh of `devices` GPUs of the target
(`targets`), compiled without a GPU: JAX's CUDA plugin (the
`[gpu-compile]` extra) holds XLA's GPU compiler, and
`jax.experimental.topologies` describes GPUs that are not there. The
program is the one the GPU would run: SPMD partitioning, fusion, buffer
assignment, Triton and ptxas.

`compile_run` returns, per step: the compiler's memory per device beside
`vidjax.memory`'s analytic estimate (the training steps), the cuDNN
attention calls per tower forward and backward (`hlo`), the other custom
calls, fusions and collectives, and the compile time.

What it cannot show: speed (no autotuning: GEMMs get default tiles),
whether cuDNN accepts its graphs (they are built on the GPU, at the first
run: workspaces count 0 here), and running out of memory (a program larger
than the GPU compiles; the comparison is `fits`).

Sizes a run reads off its files (a vocabulary's, a label count) are taken
from the config where set, else stood in for (`STAND_INS`) and reported.
"""

from __future__ import annotations

import time

import jax
import ml_collections

from vidjax import config as config_lib, memory, startup, steps as steps_lib
from vidjax.base import internals
from vidjax.compile import hlo
from vidjax.compile.targets import Target
from vidjax.config import defaults
from vidjax.data import batches
from vidjax.models import attention

# Sizes that files settle at start-up, stood in for when the config leaves
# them 0: CLIP's vocabulary, and a label count (its head is a rounding
# error of the step's memory).
STAND_INS = {
  "model.text.vocab_size": defaults.VOCAB_SIZE,
  "model.num_classes": 100,
}
# How the step's work is ordered, which sets what is alive at once.
# 'memory': XLA's list scheduler, which orders for the least memory: the
# step's need, the figure the analytic estimate bounds. 'gpu': as the GPU
# compiles it by default. There, for GPUs in a mesh, XLA's latency-hiding
# scheduler (with its speed-of-light cost model on Hopper) moves work to
# overlap the collectives, and spends the device's free memory doing so, up
# to a limit it keeps under the device's memory: measured for 8 H100s,
# own_videos at 128 clips per GPU needs 15.5 GiB scheduled for memory and
# compiles to 60.8 GiB by default, at 256 clips 29.2 and 63.4 GiB: it
# stayed under 80% of the device's memory (BENCHMARKS.md).
SCHEDULES = {
  "memory": {
    "xla_gpu_enable_latency_hiding_scheduler": False,
    "xla_gpu_enable_analytical_sol_latency_estimator": False,
  },
  "gpu": {},
}
# What `model.dtype` 'auto' is on a GPU (`models.resolve_dtype`); the
# backend here is the CPU, so the config says it.
GPU_AUTO_DTYPE = "bfloat16"


def settle(config: ml_collections.ConfigDict) -> tuple:
  """A copy of `config` as a GPU run would settle it, and what was
  stood in for ([(key, value)]): 'auto' dtypes as on a GPU, and the sizes
  the run's files would give (`STAND_INS`) where the config leaves them 0.
  """
  config = config_lib.copy(config)
  model, stood_in = config.model, []
  for key in ("dtype", "residual_dtype", "norm_dtype"):
    if model.get(key) == "auto":
      model[key] = GPU_AUTO_DTYPE
  for dotted, value in STAND_INS.items():
    parent, name = dotted.rsplit(".", 1)
    node = config
    for part in parent.split("."):
      node = node.get(part) if node is not None else None
    if node is not None and name in node and not node[name]:
      node[name] = value
      stood_in.append((dotted, value))
  return config, stood_in


def topology(target: Target, devices: int):
  """`devices` GPUs of `target` on one host, as JAX describes GPUs it does
  not see (`jax.experimental.topologies`)."""
  from jax.experimental import topologies

  return topologies.get_topology_desc(
    platform="cuda", topology=f"1x1x{devices}", target_config=target.text
  )


def _compile(lowered, schedule: str) -> tuple:
  """(compiled, the options added to `schedule`'s, the schedule's options
  this XLA does not know: left out, it orders the work as by default)."""
  options, added, unknown = dict(SCHEDULES[schedule]), {}, []
  while True:
    try:
      return lowered.compile(compiler_options=options), added, unknown
    except jax.errors.JaxRuntimeError as e:
      name = internals.unknown_compile_option(e)
      if name in options:
        unknown.append(name)
        del options[name]
      elif internals.is_default_tiles_rejected(e) and not added:
        # Without autotuning a GEMM gets XLA's default Triton tiles, which
        # some shapes reject; on the GPU autotuning finds others. Compiled
        # with cuBLAS's GEMMs instead, and said.
        added = {"xla_gpu_enable_triton_gemm": False}
        options.update(added)
      else:
        raise


def _compiled(jitted, args, config, schedule) -> tuple[dict, str]:
  """(the step's figures, its optimised HLO) of `jitted` compiled for
  `args`, its work ordered by `schedule` (`SCHEDULES`)."""
  start = time.perf_counter()
  compiled, options, unknown = _compile(jitted.lower(*args), schedule)
  seconds = time.perf_counter() - start
  analysis = compiled.memory_analysis()
  text = compiled.as_text()
  figures = {
    "compile_seconds": round(seconds, 1),
    "memory": {
      "argument": analysis.argument_size_in_bytes,
      "output": analysis.output_size_in_bytes,
      "alias": analysis.alias_size_in_bytes,
      "temp": analysis.temp_size_in_bytes,
      "total": memory.compiled_bytes(compiled),
    },
    "compiler_options": options,
    "unknown_options": unknown,
    "attention": hlo.cudnn_attention(text, config.model),
    **hlo.other_calls(text),
  }
  return figures, text


def _estimate(config, built=None) -> int:
  """`vidjax.memory`'s estimate per device of the config's training step."""
  estimate = next(
    memory.step_memories(config, [config.model.remat], built=built)
  )
  return round(estimate.total_bytes(memory.clips_per_device(config)))


def compile_run(
  config: ml_collections.ConfigDict,
  target: Target,
  devices: int,
  *,
  eval_step: bool = True,
  schedule: str = "memory",
  hlo_texts: dict | None = None,
) -> dict:
  """The run's steps compiled for `devices` GPUs of `target`.

  Args:
    config: the run config (as loaded, with its overrides).
    target: from `targets.load`.
    devices: GPUs in the mesh; this process must have as many devices
      (`python -m vidjax.compile` makes the CPU's so), which size
      `vidjax.memory`'s estimate.
    eval_step: compile the evaluation step too.
    schedule: how XLA orders the steps' work (`SCHEDULES`): 'memory' for
      the steps' need, 'gpu' as a GPU compiles them by default.
    hlo_texts: if given, filled with each step's optimised HLO by name.

  Returns:
    A JSON-able dict: 'target', 'devices', 'batch_size',
    'clips_per_device', 'remat', 'schedule', 'stood_in' and 'steps' {name: {
    'compile_seconds', 'memory' (bytes per device: argument, output,
    alias, temp, total), 'estimate' (bytes, training steps), 'attention'
    {tower: {forward, backward}}, 'custom_calls', 'fusions',
    'collectives'}}.

  Raises:
    errors.ConfigError: a config that cannot run there (validation, or
      'cudnn' attention the target cannot take).
  """
  if jax.device_count() != devices:
    raise ValueError(
      f"{jax.device_count()} devices here for a mesh of {devices}: "
      "python -m vidjax.compile sets the CPU's device count"
    )
  config, stood_in = settle(config)
  capability = target.compute_capability
  report = {
    "target": {
      "name": target.name,
      "file": str(target.source),
      "memory_bytes": target.memory_bytes,
      "compute_capability": ".".join(map(str, capability)),
      "cudnn_version": target.cudnn_version,
    },
    "devices": devices,
    "batch_size": config.batch_size,
    "accum_steps": config.accum_steps,
    "clips_per_device": memory.clips_per_device(config),
    "remat": config.model.remat,
    "schedule": schedule,
    "stood_in": dict(stood_in),
    "jax": jax.__version__,
    "steps": {},
  }
  gpus = topology(target, devices).devices
  key = jax.eval_shape(lambda: jax.random.key(0))
  with (
    attention.assume_gpu(capability),
    internals.cudnn_checks_answered(capability, target.cudnn_version),
  ):
    config_lib.validate(config, devices)
    memory.check_attention(config)
    locked = config_lib.lock(config)
    _, _, built = startup.build_abstract(locked, devices=gpus)
    state, rest, steps = built
    train_batch = batches.batch_spec(locked, locked.batch_size)
    todo = {"train": (steps.train, (state, rest, train_batch, key))}
    if steps.unmasked_train is not None:
      todo["unmasked_train"] = (
        steps.unmasked_train,
        (state, rest, train_batch, key),
      )
    if eval_step:
      eval_batch = batches.batch_spec(
        locked, locked.eval.batch_size, train=False
      )
      todo["eval"] = (steps.eval, (state["params"], rest, eval_batch))
    for name, (jitted, args) in todo.items():
      figures, text = _compiled(jitted, args, locked, schedule)
      if hlo_texts is not None:
        hlo_texts[name] = text
      report["steps"][name] = figures
    # The analytic estimate, of the same abstract state (per device).
    report["steps"]["train"]["estimate"] = _estimate(config, built)
    if "unmasked_train" in report["steps"]:
      tuning = config_lib.copy(config)
      tuning.model.mask_ratio = 0.0
      tuning.accum_steps = steps_lib.unmask_accum(config)
      report["steps"]["unmasked_train"]["estimate"] = _estimate(tuning)
  for figures in report["steps"].values():
    if "estimate" in figures:
      figures["estimate_over_compiled"] = round(
        figures["estimate"] / figures["memory"]["total"], 3
      )
    figures["fits"] = figures["memory"]["total"] <= target.memory_bytes
  return report
