"""Command line: `python -m vidjax.main --config configs/NAME.py[:ARG] --workdir DIR`.

    --config.a.b=value   override any config key (unknown keys are refused)
    --mode train|eval    train (resuming from the workdir's checkpoint), or
                         only evaluate the workdir's latest checkpoint

Multi-process runs (several hosts) call `jax.distributed.initialize()` when
the environment describes one (SLURM, or JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID).
"""
from __future__ import annotations

import os

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/NAME.py[:ARG]).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, "
                               "metrics.jsonl, config.json.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"],
                          "train (and evaluate), or evaluate only.")
flags.mark_flags_as_required(["config", "workdir"])


def _maybe_initialize_distributed():
  import jax  # pylint: disable=import-outside-toplevel
  env = os.environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    jax.distributed.initialize(
        coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(env["JAX_NUM_PROCESSES"]),
        process_id=int(env["JAX_PROCESS_ID"]))
  elif int(env.get("SLURM_NTASKS", "1")) > 1:
    jax.distributed.initialize()  # JAX reads SLURM's environment itself.
  else:
    return
  logging.info("process %d of %d", jax.process_index(), jax.process_count())


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  _maybe_initialize_distributed()
  from vidjax import train  # pylint: disable=import-outside-toplevel
  if _MODE.value == "eval":
    train.evaluate_only(_CONFIG.value, _WORKDIR.value)
  else:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
