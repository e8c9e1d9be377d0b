"""Command line: `python -m vidjax.main --config configs/NAME.py[:ARG] --workdir DIR`.

    --config.a.b=value   override any config key (unknown keys are refused,
                         with the known ones and close matches)
    --mode train|eval    train (resuming from the workdir's checkpoint), or
                         only evaluate the workdir's latest checkpoint (or
                         `--config.init_from`)

Mistakes in the command, the config or the data are printed as one message
and a hint, without a traceback. The exit codes are `vidjax.base.errors`'s
(`EXIT_*`, listed in its docstring and in docs/training.md).

Multi-process runs (several hosts) call `jax.distributed.initialize()` when
the environment describes one (SLURM, or JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID).
"""

from __future__ import annotations

import gc
import os
import re
import sys

from absl import app, flags, logging

# Light imports only, up to the signal handler (`main`); JAX loads after.
from vidjax import config as config_lib
from vidjax.base import errors, stopping
from vidjax.checkpoints import failed_saves
from vidjax.config import defaults
from vidjax.data import reads  # Standard library only.

_CONFIG = flags.DEFINE_string(
  "config",
  None,
  "Config file: configs/NAME.py[:ARG]; --config.KEY=VALUE overrides its keys.",
)
_WORKDIR = flags.DEFINE_string(
  "workdir",
  None,
  "Run directory: checkpoints, metrics.jsonl, config.json, log.txt, plots/.",
)
_MODE = flags.DEFINE_enum(
  "mode",
  "train",
  list(defaults.MODES),
  "train (and evaluate), or evaluate only.",
)
flags.mark_flags_as_required(["config", "workdir"])


_HELP = {"-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml"}


def _parse_flags(argv: list[str]) -> tuple[list[str], list[str]]:
  """absl's flags; the config overrides are kept for `load_config`."""
  overrides, rest = config_lib.split_overrides(argv[1:])
  try:
    rest = flags.FLAGS([argv[0]] + rest)
    if len(rest) > 1:
      raise flags.Error(f"unexpected arguments {rest[1:]}")
  except SystemExit:
    if _HELP & set(rest):  # absl ends the help it printed with exit 1.
      sys.exit(0)
    raise
  except flags.Error as e:
    print(
      f"vidjax: error: {e}\n  hint: python -m vidjax.main --helpshort "
      "lists the flags",
      file=sys.stderr,
    )
    sys.exit(errors.EXIT_USAGE)
  return rest, overrides


def _maybe_initialize_distributed():
  """Joins the other processes of a multi-process run, before any JAX work.

  Cross-process collectives on CPU use Gloo, JAX's default (0.10-0.12), so
  CPU runs need no extra setting.
  """
  import jax

  env = os.environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    missing = [
      k
      for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
      if not env.get(k, "").isdigit()
    ]
    if missing:
      raise errors.ConfigError(
        f"JAX_COORDINATOR_ADDRESS is set but {' and '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} unset or not a number",
        hint="a multi-process run sets all three on every process; unset "
        "JAX_COORDINATOR_ADDRESS for a single process",
      )
    # Everything is given: no cluster auto-detection, which inside a SLURM
    # allocation would restrict each process to GPU number SLURM_LOCALID.
    jax.distributed.initialize(
      coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
      num_processes=int(env["JAX_NUM_PROCESSES"]),
      process_id=int(env["JAX_PROCESS_ID"]),
      cluster_detection_method="deactivate",
    )
  elif int(env.get("SLURM_NTASKS", "1")) > 1:
    # JAX reads SLURM's environment itself, but gives every task ONE GPU
    # (number SLURM_LOCALID), for one task per GPU. With one task per node
    # (launch/slurm.sh) the task should drive all of the node's GPUs.
    kwargs = {}
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", env["SLURM_NTASKS"]))
    nodes = int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "0")))
    visible = [
      d
      for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",")
      if d and d != "NoDevFiles"
    ]  # SLURM's value for "no GPUs"
    gpus = len(visible) or int(env.get("SLURM_GPUS_ON_NODE", "0") or 0)
    if tasks == nodes and not env.get("JAX_LOCAL_DEVICE_IDS"):
      if gpus:
        kwargs["local_device_ids"] = list(range(gpus))
      else:
        logging.warning(
          "one SLURM task per node, but neither CUDA_VISIBLE_DEVICES nor "
          "SLURM_GPUS_ON_NODE says how many GPUs it has: JAX will use one "
          "GPU per task. Request GPUs with --gpus-per-node, or set "
          "JAX_LOCAL_DEVICE_IDS=0,1,..."
        )
    jax.distributed.initialize(**kwargs)
  else:
    return
  logging.info("process %d of %d", jax.process_index(), jax.process_count())


def run(
  config: str,
  workdir: str,
  mode: str = "train",
  overrides: list[str] | tuple[str, ...] = (),
) -> None:
  """What the command line does once its flags are parsed.

  Args:
    config: `configs/NAME.py[:ARG]`.
    workdir: the run directory.
    mode: "train" (and evaluate) or "eval".
    overrides: `--config.KEY=VALUE` strings.

  Raises:
    errors.UserError: a mistake in the command, the config or the data
      (`main` prints `describe()` and exits with its `exit_code`).
  """

  spec, config = config, config_lib.load_config(config, overrides)
  _maybe_initialize_distributed()
  from vidjax.base import internals

  internals.import_flax_without_ipython()  # Before anything imports flax.
  from vidjax import memory, train

  stopping.check()
  try:
    if mode == "eval":
      train.evaluate_only(config, workdir)
    else:
      train.train_and_evaluate(config, workdir)
  except memory.StepTooLarge as e:
    variant = config_lib.cpu_variant(spec) if e.on_host else None
    if variant:  # The exact one, where the hint could only describe it.
      e.hint = e.hint.replace(memory.CPU_VARIANT, f"--config {variant}")
    raise


# Tracing and building models allocate millions of short-lived objects and
# few cycles: at Python's default thresholds (700, 10, 10) the collector
# took ~15% of a small run's CPU (start-up, the memory check's traces).
GC_THRESHOLDS = (10_000, 20, 100)


def main(parsed) -> int:
  _, overrides = parsed
  gc.set_threshold(*GC_THRESHOLDS)  # Process-wide: the command line's.
  try:
    # First: a SIGTERM or Ctrl-C from now on stops as documented.
    with stopping.handling(
      "during start-up; nothing was written: run the same command again"
    ):
      from vidjax.report import console

      # Process-wide: sys.stdout/stderr wrapped, root log handlers swapped;
      # a failed checkpoint save's noise (Orbax's tracebacks from each
      # thread, asyncio's orphaned tasks) kept off the console.
      console.setup_console(verbose=flags.FLAGS["verbosity"].present)
      failed_saves.install_quiet()
      run(_CONFIG.value, _WORKDIR.value, _MODE.value, overrides)
  except errors.UserError as e:
    logging.error("%s", e.describe())
    return e.exit_code
  except errors.Stopped as e:
    logging.warning("%s", e)
    return e.exit_code
  except OSError as e:
    error = errors.refused_write(e, _WORKDIR.value)
    if error is None:
      raise  # A bug: its traceback.
    logging.error("%s", error.describe())
    return error.exit_code
  except RuntimeError as e:  # JAX's runtime errors are RuntimeErrors.
    error = out_of_memory(e)
    if error is None:
      raise  # A bug: its traceback.
    logging.error("%s", error.describe())
    return error.exit_code
  return errors.EXIT_FINISHED


def out_of_memory(error: BaseException) -> errors.UserError | None:
  """XLA's out-of-memory (RESOURCE_EXHAUSTED) during a run, as two lines:
  what ran out, what to change; None for any other error."""
  text = str(error).strip()
  if "RESOURCE_EXHAUSTED" not in text:
    return None
  first = text.splitlines()[0]
  asked = re.search(r"allocating (\d+) bytes", first)
  return errors.UserError(
    f"the device ran out of memory: {first}"
    + (f" ({int(asked.group(1)) / 2**30:.1f} GiB)" if asked else ""),
    hint="raise --config.accum_steps (the same batch in smaller parts), "
    "lower --config.batch_size, or --config.model.remat=full; on a CPU, "
    "the recipe's CPU variant (configs/own_videos.py:...,cpu, or :debug)",
  )


def _main_past_stuck_reads(parsed) -> int:
  """`main`, then an exit that does not wait for a chunk read that never
  returns (a stuck mount): its thread would keep the process alive."""
  code = main(parsed)
  if reads.in_progress():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  return code


if __name__ == "__main__":
  app.run(_main_past_stuck_reads, flags_parser=_parse_flags)
