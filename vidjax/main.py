"""Command line: `python -m vidjax.main --config configs/NAME.py[:ARG] --workdir DIR`.

    --config.a.b=value   override any config key (unknown keys are refused)
    --mode train|eval    train (resuming from the workdir's checkpoint), or
                         only evaluate the workdir's latest checkpoint

Multi-process runs (several hosts) call `jax.distributed.initialize()` when
the environment describes one (SLURM, or JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID).
"""
from __future__ import annotations

import logging as py_logging
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
  """Joins the other processes of a multi-process run, before any JAX work.

  Cross-process collectives on CPU use Gloo, JAX's default (0.10-0.12), so
  CPU runs need no extra setting.
  """
  import jax  # pylint: disable=import-outside-toplevel
  env = os.environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    # Everything is given: no cluster auto-detection, which inside a SLURM
    # allocation would restrict each process to GPU number SLURM_LOCALID.
    jax.distributed.initialize(
        coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(env["JAX_NUM_PROCESSES"]),
        process_id=int(env["JAX_PROCESS_ID"]),
        cluster_detection_method="deactivate")
  elif int(env.get("SLURM_NTASKS", "1")) > 1:
    # JAX reads SLURM's environment itself, but gives every task ONE GPU
    # (number SLURM_LOCALID), for one task per GPU. With one task per node
    # (launch/slurm.sh) the task should drive all of the node's GPUs.
    kwargs = {}
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", env["SLURM_NTASKS"]))
    nodes = int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "0")))
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if d and d != "NoDevFiles"]  # SLURM's value for "no GPUs"
    gpus = len(visible) or int(env.get("SLURM_GPUS_ON_NODE", "0") or 0)
    if tasks == nodes and not env.get("JAX_LOCAL_DEVICE_IDS"):
      if gpus:
        kwargs["local_device_ids"] = list(range(gpus))
      else:
        logging.warning(
            "one SLURM task per node, but neither CUDA_VISIBLE_DEVICES nor "
            "SLURM_GPUS_ON_NODE says how many GPUs it has: JAX will use one "
            "GPU per task. Request GPUs with --gpus-per-node, or set "
            "JAX_LOCAL_DEVICE_IDS=0,1,...")
    jax.distributed.initialize(**kwargs)
  else:
    return
  logging.info("process %d of %d", jax.process_index(), jax.process_count())


class _OnlyOurInfo(py_logging.Filter):
  """Keeps vidjax's INFO lines; other libraries' (Orbax, Grain) from WARNING."""

  def filter(self, record):
    return record.levelno >= py_logging.WARNING or (
        f"{os.sep}vidjax{os.sep}" in record.pathname)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.get_absl_handler().addFilter(_OnlyOurInfo())
  _maybe_initialize_distributed()
  from vidjax import train  # pylint: disable=import-outside-toplevel
  if _MODE.value == "eval":
    train.evaluate_only(_CONFIG.value, _WORKDIR.value)
  else:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
