"""What a recipe's training step holds on one GPU, per remat policy.

    python -m vidjax.bench.memory --config configs/clip_vitb16_ego4d.py \
        [--batch-per-device 256] [--remat none,save_dots_and_attention,full] \
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
  total GiB      fixed + kept x batch-per-device. Compare it with the GPU's
                 memory less ~10% (cuDNN workspaces, the input batch, the
                 allocator's fragmentation); `vidjax.bench.gpu_check`
                 compiles and runs the step for the real figure.

`--compile-batch N` also compiles the step for this machine at global batch
N and prints XLA's `memory_analysis()` total. On CPU that step uses XLA
attention (T x T weights kept) and a scheduler that does not delay
recomputation, so only GPU figures are comparable with the above.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import jax

from vidjax import (
  bench,
  config as config_lib,
  memory,
  sharding,
  steps as steps_lib,
  tasks,
)
from vidjax.bench import cuda_trace
from vidjax.data import batches

DEFAULT_REMATS = "none,save_dots_and_attention,save_attention,full"
RECIPE_GPUS = 8  # The recipes' batch sizes are for one 8-GPU machine.


def policy_memory(config, remat: str, batch_per_device: int) -> dict:
  """Per-device memory of the config's step under one remat policy, in
  bfloat16 with attention as on a GPU with cuDNN (`vidjax.memory`).

  Returns:
    dict with 'kept_mib_per_clip', 'fixed_gib' and 'total_gib' (see the
    module docstring).
  """
  config = config.copy_and_resolve_references()
  config.model.dtype = "bfloat16"
  on_gpu = jax.default_backend() == "gpu"
  with contextlib.nullcontext() if on_gpu else cuda_trace.forced_cudnn():
    estimate = memory.step_memory(config, remat=remat)
  return dict(
    remat=remat,
    kept_mib_per_clip=estimate.kept_bytes_per_clip / memory.MiB,
    fixed_gib=estimate.fixed_bytes / memory.GiB,
    total_gib=estimate.total_bytes(batch_per_device) / memory.GiB,
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
  a = steps.train.lower(state, rest, batch, key).compile().memory_analysis()
  return (
    a.argument_size_in_bytes
    + a.output_size_in_bytes
    - a.alias_size_in_bytes
    + a.temp_size_in_bytes
  ) / memory.GiB


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.bench.memory", description=__doc__.split("\n\n")[0]
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
  parser.add_argument("--smoke", action="store_true", help=bench.SMOKE_HELP)
  args = parser.parse_args(argv)
  if args.smoke:
    args.config, args.remat, args.batch_per_device = (
      "configs/demo.py:debug",
      "none",
      1,
    )

  config = config_lib.load_config(args.config)
  if args.residual_dtype:
    config.model.residual_dtype = args.residual_dtype
  per_device = args.batch_per_device or config.batch_size // RECIPE_GPUS
  model = config.model
  print(
    f"{args.config}: {model.name} {model.variant}, {model.num_frames} "
    f"frames of {model.image_size}px, bf16, residual stream "
    f"{model.residual_dtype}, {per_device} clips per "
    f"device; attention as on a GPU with cuDNN; jax {jax.__version__}, "
    f"backend {jax.default_backend()}"
  )
  header = (
    f"{'remat':<26}{'kept MiB/clip':>14}{'fixed GiB':>11}"
    f"{'total GiB':>11}"
    + (f"{'compiled GiB':>14}" if args.compile_batch else "")
  )
  print(header)
  print("-" * len(header))
  rows = []
  for remat in args.remat.split(","):
    start = time.perf_counter()
    row = policy_memory(config, remat, per_device)
    line = (
      f"{remat:<26}{row['kept_mib_per_clip']:>14.1f}"
      f"{row['fixed_gib']:>11.2f}{row['total_gib']:>11.1f}"
    )
    if args.compile_batch:
      row["compiled_gib"] = compiled_memory(config, remat, args.compile_batch)
      line += f"{row['compiled_gib']:>14.2f}"
    row["seconds"] = time.perf_counter() - start
    print(line, flush=True)
    rows.append(row)
  return rows


if __name__ == "__main__":
  main()
