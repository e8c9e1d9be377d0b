"""Masked against unmasked training steps of a CLIP recipe, in one run.

    python -m benchmarks.masking [--config configs/clip_vitb16_ego4d.py:flip]
        [--mask-ratio R] [--mask-kind random|tube] [--batch 2] [--repeats 3]
        [--peak-tflops 989] [--mfu 0.4] [--cores-per-gpu 12]
        [--loader-clips-per-core 161] [--smoke]

The config's CLIP with its `model.mask_ratio` (the masked step) and with
every token (its unmasked tuning's step), both as `vidjax.steps` builds
them, side by side:

  vision tokens    what the video tower's blocks see per clip
  GFLOP/clip       training FLOPs per clip, by `vidjax.models.flops` and by
                   XLA's cost analysis of the training step lowered at 64
                   clips (nothing compiled; optimizer and augmentation
                   included)
  kept MiB/clip    what the backward pass keeps per clip under the config's
                   remat policy (`vidjax.memory`: bf16, cuDNN attention as
                   on a GPU): the clips a GPU's memory holds
  CPU s/step       both training steps compiled and run here on `--batch`
                   random clips, the median of `--repeats` (float32 on a
                   CPU: the ratio, not the time, is the figure)

Then the data rate both steps need: a GPU at `--mfu` of `--peak-tflops`
trains mfu x peak / (training FLOPs per clip) clips per second, the same
share of the peak assumed masked or not; over `--cores-per-gpu` loader
cores (AVION's machine: 96 threads for 8 GPUs) that is the rate each core
must deliver, against what one core decodes (`--loader-clips-per-core`:
read_clip's 161 4-frame 224px clips/s per core, `python -m
benchmarks.loader` in BENCHMARKS.md; the whole pipeline costs a little
more per clip).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from benchmarks import (
  SMOKE_HELP,
  SMOKE_NOTE,
  device_batch,
  memory as memory_bench,
  random_batches,
)
from vidjax import config as config_lib, sharding, steps as steps_lib, tasks
from vidjax.base import errors
from vidjax.data import batches
from vidjax.models import flops as flops_lib, shapes

XLA_CLIPS = 64  # The lowered step's batch: the optimizer's share is ~1%.
RECIPE_GPUS = 8  # The recipes' batch sizes are for one 8-GPU machine.


def xla_gflop_per_clip(config) -> dict[str, float]:
  """XLA's FLOPs per clip of the masked and unmasked training steps."""
  mesh = sharding.make_mesh(fsdp=config.fsdp)
  state, rest, steps = steps_lib.build_state_and_steps(
    config, tasks.get_task(config.task), mesh, abstract=True
  )
  batch = batches.batch_spec(config, XLA_CLIPS)
  key = jax.eval_shape(lambda: jax.random.key(0))
  out = {}
  for name, step in (
    ("masked", steps.train),
    ("unmasked", steps.unmasked_train),
  ):
    analysis = step.trace(state, rest, batch, key).lower().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    out[name] = analysis["flops"] / XLA_CLIPS / 1e9
  return out


def cpu_seconds_per_step(
  config, batch_size: int, repeats: int
) -> dict[str, float]:
  """Median wall seconds of the masked and unmasked steps, run here."""
  mesh = sharding.make_mesh(fsdp=config.fsdp)
  state, rest, steps = steps_lib.build_state_and_steps(
    config, tasks.get_task(config.task), mesh
  )
  batch = random_batches.random_batch(config, batch_size, mesh)
  key = jax.random.key(0)
  out = {}
  for name, step in (
    ("masked", steps.train),
    ("unmasked", steps.unmasked_train),
  ):
    state = jax.block_until_ready(step(state, rest, batch, key)[0])  # Compiles.
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      state = jax.block_until_ready(step(state, rest, batch, key)[0])
      times.append(time.perf_counter() - start)
    out[name] = statistics.median(times)
  return out


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.masking", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--config", default="configs/clip_vitb16_ego4d.py:flip")
  parser.add_argument(
    "--mask-ratio",
    type=float,
    default=0.0,
    help="override model.mask_ratio (0: the config's)",
  )
  parser.add_argument("--mask-kind", default="", help="random or tube")
  parser.add_argument(
    "--batch", type=int, default=2, help="clips per timed CPU step"
  )
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument(
    "--peak-tflops",
    type=float,
    default=989.0,
    help="per GPU, dense bf16 (H100/H200: 989)",
  )
  parser.add_argument("--mfu", type=float, default=0.4)
  parser.add_argument("--cores-per-gpu", type=float, default=12.0)
  parser.add_argument("--loader-clips-per-core", type=float, default=161.2)
  parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
  args = parser.parse_args(argv)
  if args.smoke:
    vars(args).update(config="configs/demo.py:debug", mask_ratio=0.5, repeats=1)

  config = config_lib.load_config(args.config)
  model = config.model
  if args.mask_ratio:
    model.mask_ratio = args.mask_ratio
  if args.mask_kind:
    model.mask_kind = args.mask_kind
  if model.name != "clip" or not model.mask_ratio > 0:
    raise errors.ConfigError(
      f"{args.config}: needs a CLIP with model.mask_ratio > 0",
      hint="e.g. configs/clip_vitb16_ego4d.py:flip, or --mask-ratio 0.5",
    )
  config.unmask_fraction = config.unmask_fraction or 0.5  # Both steps built.
  args.batch = device_batch(args.batch)  # Whole per device.
  config_lib.validate(config, jax.device_count())
  both = {"masked": model, "unmasked": shapes.unmasked(model)}
  print(
    f"{args.config}: {model.variant} CLIP, {model.num_frames} frames of "
    f"{model.image_size}px, mask_ratio {model.mask_ratio:g} "
    f"({model.mask_kind}) against every token; jax {jax.__version__}, "
    f"backend {jax.default_backend()}, {jax.device_count()} device(s)",
    flush=True,
  )
  rows = {
    "vision tokens": {
      k: shapes.attention_shapes(m)["vision"].tokens for k, m in both.items()
    },
    "GFLOP/clip (flops.py)": {
      k: flops_lib.flops_per_example(m)["training"] / 1e9
      for k, m in both.items()
    },
    "GFLOP/clip (XLA)": xla_gflop_per_clip(config),
  }
  per_device = config.batch_size // RECIPE_GPUS
  rows["kept MiB/clip"] = {}
  for name, m in both.items():
    phase = config.copy_and_resolve_references()
    phase.model.mask_ratio = m.mask_ratio
    rows["kept MiB/clip"][name] = memory_bench.policy_memory(
      phase, model.remat, per_device
    )["kept_mib_per_clip"]
  rows[f"CPU s/step ({args.batch} clips)"] = cpu_seconds_per_step(
    config, args.batch, args.repeats
  )
  print(f"{'':<28}{'unmasked':>10}{'masked':>10}{'masked/unmasked':>17}")
  for label, row in rows.items():
    cells = "".join(
      f"{row[k]:>10d}" if isinstance(row[k], int) else f"{row[k]:>10.1f}"
      for k in ("unmasked", "masked")
    )
    print(f"{label:<28}{cells}{row['masked'] / row['unmasked']:>17.3f}")
  if args.smoke:  # The demo's tiny model: no data rate a GPU would need.
    print(f"--smoke ({SMOKE_NOTE}); the data rate is left out")
    return dict(rows)
  gflop = rows["GFLOP/clip (flops.py)"]
  per_gpu = {k: args.mfu * args.peak_tflops * 1e3 / v for k, v in gflop.items()}
  print(
    f"\ndata rate at {args.mfu:.0%} MFU of {args.peak_tflops:g} TFLOP/s "
    f"per GPU, {args.cores_per_gpu:g} loader cores per GPU:"
  )
  print(
    f"{'clips/s per GPU':<28}{per_gpu['unmasked']:>10.0f}"
    f"{per_gpu['masked']:>10.0f}"
    f"{per_gpu['masked'] / per_gpu['unmasked']:>17.3f}"
  )
  per_core = {k: v / args.cores_per_gpu for k, v in per_gpu.items()}
  print(
    f"{'clips/s per loader core':<28}{per_core['unmasked']:>10.0f}"
    f"{per_core['masked']:>10.0f}"
  )
  print(
    f"{'share of one core':<28}"
    f"{per_core['unmasked'] / args.loader_clips_per_core:>10.0%}"
    f"{per_core['masked'] / args.loader_clips_per_core:>10.0%}"
    f"   (read_clip: {args.loader_clips_per_core:g} clips/s per core)"
  )
  return dict(rows, data_clips_per_s_per_core=per_core)


if __name__ == "__main__":
  main()
