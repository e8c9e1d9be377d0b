"""What a recipe's training step holds on one GPU, per remat policy.

    python -m benchmarks.memory --config configs/clip_vitb16_ego4d.py \
        [--batch-per-device 256] [--accum-steps 1] \
        [--remat none,save_dots_and_attention,full] \
        [--residual-dtype float32] [--compile-batch 0] [--smoke]

Everything comes from the train step `vidjax.steps` builds for the config
(compute dtype bfloat16, attention as on an NVIDIA GPU with cuDNN: traced
with `cuda_trace.forced_cudnn` on a machine without one), for each policy,
by the estimate a training run checks at start-up (`vidjax.memory`):

  kept MiB/clip  activations the backward pass keeps, per clip: JAX's saved
                 residuals of the training loss (`jax.ad_checkpoint`), an
                 upper bound, since XLA's fusion may recompute cheap
                 elementwise ones instead of keeping them;
  fixed GiB      what does not grow with the batch: parameters, optimizer
                 state and gradients (float32, per device under FSDP), and
                 the residuals every clip shares (bf16 weight copies);
  cached MiB     with `--accum-steps` > 1, a contrastive or MIR step's
                 cache: the whole step's embeddings and their gradients
                 (its loss stays the whole batch's: `vidjax.steps`);
  total GiB      fixed + kept x clips per microbatch + cached. Compare it with the GPU's
                 memory less ~10% (cuDNN workspaces, the input batch, the
                 allocator's fragmentation); `benchmarks.gpu_check`
                 compiles and runs the step for the real figure;
  most on GPU    the most clips per GPU (per microbatch) that fit in 90% of
                 an A5000 (24 GB, AVION's), an H100 (80 GB), an H200
                 (141 GB): the batch advice in the recipes' comments.

It prints the step's FLOPs too, with the extra forward pass that keeps a
contrastive loss over the whole batch under accumulation (4/3 the FLOPs).

`--compile-batch N` also compiles the step for this machine at global batch
N (in `--accum-steps` microbatches) and prints XLA's `memory_analysis()`
total; in microbatches, also that of one microbatch's step alone (the
accumulated step should need about that plus the cache). On CPU that step uses XLA
attention (T x T weights kept) and a scheduler that does not delay
recomputation, so only GPU figures are comparable with the above.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time

import jax

from benchmarks import SMOKE_HELP, cuda_trace
from vidjax import (
  config as config_lib,
  memory,
  sharding,
  steps as steps_lib,
  tasks,
)
from vidjax.compile import compiler, targets
from vidjax.data import batches
from vidjax.models import flops as flops_lib

DEFAULT_REMATS = ",".join(memory.REMAT_ORDER)
# The GPUs whose memory the table sizes batches for: AVION's A5000 (24 GB),
# an H100 (80 GB), an H200 (141 GB) (`vidjax.compile.targets`).
GPUS = ("a5000", "h100", "h200")
RECIPE_GPUS = 8  # The recipes' batch sizes are for one 8-GPU machine.


@functools.cache
def usable_bytes() -> dict[str, float]:
  """{gpu: its memory less `memory.HEADROOM`} for `GPUS`, read once."""
  return {
    gpu: memory.usable_bytes(targets.load(gpu).memory_bytes) for gpu in GPUS
  }


def policy_memory(config, remat: str, batch_per_device: int) -> dict:
  """Per-device memory of the config's step under one remat policy, in
  bfloat16 with attention as on a GPU with cuDNN (`vidjax.memory`).

  Args:
    config: the run config (its `accum_steps` splits the step).
    remat: the `model.remat` policy.
    batch_per_device: clips per device and step (all its microbatches).

  Returns:
    dict with 'kept_mib_per_clip', 'fixed_gib', 'cached_mib' and
    'total_gib' (see the module docstring).
  """
  config = config.copy_and_resolve_references()
  config.model.dtype = "bfloat16"
  on_gpu = jax.default_backend() == "gpu"
  with contextlib.nullcontext() if on_gpu else cuda_trace.forced_cudnn():
    estimate = memory.step_memory(config, remat=remat)
  micro = batch_per_device // config.accum_steps
  cached = estimate.cached_bytes(micro, config.accum_steps)
  return dict(
    remat=remat,
    kept_mib_per_clip=estimate.kept_bytes_per_clip / memory.MiB,
    fixed_gib=estimate.fixed_bytes / memory.GiB,
    cached_mib=cached / memory.MiB,
    total_gib=estimate.total_bytes(micro) / memory.GiB,
    most_clips={
      gpu: estimate.most_clips(usable, cached)
      for gpu, usable in usable_bytes().items()
    },
  )


def flops_line(config, batch_per_device: int) -> str:
  """The step's FLOPs per device, and the extra forward pass of
  accumulation by embedding cache (`steps.caches_embeddings`)."""
  flops = flops_lib.flops_per_example(config.model)
  train = flops["training"] * batch_per_device / 1e12
  if not steps_lib.caches_embeddings(config):
    return f"FLOPs per device and step: {train:.4g} TFLOP (3x the forward)"
  extra = flops["forward"] * batch_per_device / 1e12
  return (
    f"FLOPs per device and step: {train:.4g} TFLOP (3x the forward) + "
    f"{extra:.4g} TFLOP for the embedding cache's extra forward pass "
    f"(+{extra / train:.0%}): {config.accum_steps} microbatches of "
    f"{batch_per_device // config.accum_steps} clips, the loss over the "
    "whole batch"
  )


def compiled_memory(config, remat: str, global_batch: int) -> float:
  """GiB of XLA's memory analysis of the step compiled here (see docstring)."""
  config = config.copy_and_resolve_references()
  config.model.update(remat=remat, dtype="bfloat16")
  mesh = sharding.make_mesh(fsdp=config.fsdp)
  state, rest, steps = steps_lib.build_state_and_steps(
    config, tasks.get_task(config.task), mesh, abstract=True
  )
  batch = batches.batch_spec(config, global_batch)
  key = jax.eval_shape(lambda: jax.random.key(0))
  compiled = steps.train.lower(state, rest, batch, key).compile()
  return memory.compiled_bytes(compiled) / memory.GiB


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.memory", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument(
    "--config",
    default="configs/clip_vitb16_ego4d.py",
    help="a recipe, e.g. configs/ek100_mir_ft.py[:arg]",
  )
  parser.add_argument(
    "--batch-per-device",
    type=int,
    default=0,
    help="default: the recipe's batch over 8 GPUs",
  )
  parser.add_argument(
    "--accum-steps",
    type=int,
    default=0,
    help="microbatches per step (default: the recipe's)",
  )
  parser.add_argument("--remat", default=DEFAULT_REMATS)
  parser.add_argument(
    "--residual-dtype",
    default="",
    help="override model.residual_dtype (e.g. bfloat16)",
  )
  parser.add_argument(
    "--compile-batch",
    type=int,
    default=0,
    help="also compile the step at this global batch",
  )
  parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
  args = parser.parse_args(argv)
  if args.smoke:
    args.config, args.remat, args.batch_per_device = (
      "configs/demo.py:debug",
      "none",
      1,
    )

  # As a GPU run settles it: 'auto' dtypes, the sizes its files give.
  config, stood_in = compiler.settle(config_lib.load_config(args.config))
  if args.residual_dtype:
    config.model.residual_dtype = args.residual_dtype
  per_device = args.batch_per_device or config.batch_size // RECIPE_GPUS
  config.accum_steps = args.accum_steps or config.accum_steps
  if per_device % config.accum_steps:
    parser.error(
      f"{per_device} clips per device do not split into "
      f"{config.accum_steps} microbatches"
    )
  model = config.model
  micro = (
    f" in {config.accum_steps} microbatches of "
    f"{per_device // config.accum_steps}"
    if config.accum_steps > 1
    else ""
  )
  print(
    f"{args.config}: {model.name} {model.variant}, {model.num_frames} "
    f"frames of {model.image_size}px, bf16, residual stream "
    f"{model.residual_dtype}, {per_device} clips per "
    f"device{micro}; attention as on a GPU with cuDNN; jax "
    f"{jax.__version__}, backend {jax.default_backend()}"
  )
  if stood_in:
    print(
      "stood in for the run's files: "
      + ", ".join(f"{k}={v}" for k, v in stood_in)
    )
  print(flops_line(config, per_device))
  header = (
    f"{'remat':<34}{'kept MiB/clip':>14}{'fixed GiB':>11}"
    f"{'cached MiB':>12}{'total GiB':>11}"
    f"{'most on ' + '/'.join(GPUS):>24}"
    + (f"{'compiled GiB':>14}" if args.compile_batch else "")
    + (
      f"{'microbatch GiB':>16}"
      if args.compile_batch and config.accum_steps > 1
      else ""
    )
  )
  print(header)
  print("-" * len(header))
  rows = []
  for remat in args.remat.split(","):
    start = time.perf_counter()
    row = policy_memory(config, remat, per_device)
    line = (
      f"{remat:<34}{row['kept_mib_per_clip']:>14.1f}"
      f"{row['fixed_gib']:>11.2f}{row['cached_mib']:>12.1f}"
      f"{row['total_gib']:>11.1f}"
      f"{'/'.join(str(n) for n in row['most_clips'].values()):>24}"
    )
    if args.compile_batch:
      row["compiled_gib"] = compiled_memory(config, remat, args.compile_batch)
      line += f"{row['compiled_gib']:>14.2f}"
      if config.accum_steps > 1:  # The same step on one microbatch alone.
        alone = config.copy_and_resolve_references()
        alone.accum_steps = 1
        row["microbatch_gib"] = compiled_memory(
          alone, remat, args.compile_batch // config.accum_steps
        )
        line += f"{row['microbatch_gib']:>16.2f}"
    row["seconds"] = time.perf_counter() - start
    print(line, flush=True)
    rows.append(row)
  return rows


if __name__ == "__main__":
  main()
