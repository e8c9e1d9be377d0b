"""python -m vidjax.compile: a run's steps compiled for a GPU, on any machine.

    python -m vidjax.compile --config configs/NAME.py[:ARG] --gpu h100 \\
        --devices 8 [--json FILE] [--no-eval] [--schedule memory|gpu] \\
        [--cudnn-version N] [--config.KEY=VALUE ...]

Prints, per step and per device: the compiler's memory beside the analytic
estimate, cuDNN attention calls per tower (forward, backward), the other
custom calls, fusions and collectives, and the compile time (`--json FILE`
writes the same). The memory is the steps' need: their work ordered for
the least memory (`--schedule memory`, the default); `--schedule gpu`
orders it as a GPU compiles it by default, where XLA's latency-hiding
scheduler spends free memory on overlapping the collectives
(`compiler.SCHEDULES`). Needs the `[gpu-compile]` extra (JAX's CUDA plugin: XLA's
GPU compiler, no CUDA libraries); no GPU. Exit status 0, or 2 for a
mistake in the command or the config (with a hint), 1 for a step that does
not compile.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

from vidjax import config as config_lib
from vidjax.base import errors
from vidjax.compile import targets

# The CUDA plugins' modules (jax-cuda12-plugin, jax-cuda13-plugin).
PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")
INSTALL = (
  'pip install "vidjax[gpu-compile]" (JAX\'s CUDA plugin, no CUDA libraries)'
)
GiB = 2**30


class PluginMissing(errors.UserError):
  """XLA's GPU compiler is not installed."""


def plugin_installed() -> bool:
  """Whether JAX's CUDA plugin (XLA's GPU compiler) is installed."""
  return any(found(name) for name in PLUGINS)


def check_plugin() -> None:
  """Refuses, naming the extra, where JAX's CUDA plugin is not installed."""
  if not plugin_installed():
    raise PluginMissing(
      "compiling for a GPU needs XLA's GPU compiler, which JAX's CUDA "
      "plugin brings; it is not installed",
      hint=INSTALL,
    )


def found(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except ModuleNotFoundError:  # No jax_plugins namespace at all.
    return False


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.compile",
    description=__doc__.split("\n\n")[0],
    epilog="--config.KEY=VALUE overrides any config key, as in vidjax.main.",
  )
  parser.add_argument("--config", required=True, help="configs/NAME.py[:ARG]")
  parser.add_argument(
    "--gpu",
    default="h100",
    help=f"a target ({', '.join(targets.names())}) or a GpuTargetConfigProto "
    "text file",
  )
  parser.add_argument("--devices", type=int, default=8, help="GPUs in the mesh")
  parser.add_argument("--json", default="", help="also write the report here")
  parser.add_argument(
    "--no-eval", action="store_true", help="the training steps only"
  )
  parser.add_argument(
    "--schedule",
    choices=("memory", "gpu"),  # compiler.SCHEDULES (jax not imported yet)
    default="memory",
    help="how XLA orders the steps' work: 'memory' (default) for the least "
    "memory, the steps' need; 'gpu' as a GPU compiles them by default "
    "(overlap that spends free memory)",
  )
  parser.add_argument(
    "--cudnn-version",
    type=int,
    default=0,
    help="the cuDNN version to trace attention for, JAX's numbering "
    "(e.g. 90800); default: the target file's",
  )
  return parser


def _gib(n: float) -> str:
  return f"{n / GiB:.2f} GiB"


def _counts(counts: dict) -> str:
  return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def format_report(report: dict, spec: str) -> str:
  """The report of `compile_run` as the command prints it."""
  t = report["target"]
  lines = [
    f"{spec}: {report['devices']} x {t['name']} ({_gib(t['memory_bytes'])}, "
    f"compute capability {t['compute_capability']}, cuDNN "
    f"{t['cudnn_version']}), jax {report['jax']}",
    f"  batch {report['batch_size']} in {report['accum_steps']} "
    f"microbatch(es): {report['clips_per_device']} clips per device at a "
    f"time; remat {report['remat']!r}",
    "  work ordered "
    + (
      "for the least memory: the steps' need (--schedule gpu: as a GPU "
      "orders it, spending free memory on overlap)"
      if report["schedule"] == "memory"
      else "as a GPU compiles it by default: XLA's latency-hiding scheduler "
      "may spend free memory on overlap (--schedule memory: the need)"
    ),
  ]
  if report["stood_in"]:
    lines.append(
      "  stood in for the run's files: "
      + ", ".join(f"{k}={v}" for k, v in report["stood_in"].items())
    )
  for name, step in report["steps"].items():
    m = step["memory"]
    lines.append(f"step {name}: compiled in {step['compile_seconds']:.1f} s")
    if step["compiler_options"]:
      lines.append(
        "  XLA's default Triton tiles rejected a GEMM (no autotuning "
        "without a GPU): compiled with "
        + ", ".join(f"{k}={v}" for k, v in step["compiler_options"].items())
      )
    if step["unknown_options"]:
      lines.append(
        "  this XLA does not know "
        + ", ".join(step["unknown_options"])
        + ": the work is ordered as it orders it by default"
      )
    line = (
      f"  memory per device: {_gib(m['total'])} compiled (argument "
      f"{_gib(m['argument'])} + output {_gib(m['output'])} - alias "
      f"{_gib(m['alias'])} + temp {_gib(m['temp'])})"
    )
    if "estimate" in step:
      line += (
        f"; estimate {_gib(step['estimate'])} "
        f"({step['estimate_over_compiled']:.2f}x)"
      )
    verdict = "fits in" if step["fits"] else "DOES NOT FIT in"
    lines.append(f"{line}; {verdict} {_gib(t['memory_bytes'])}")
    attention = "; ".join(
      f"{tower} {c['forward']} forward, {c['backward']} backward"
      for tower, c in step["attention"].items()
    )
    lines.append(f"  cuDNN attention calls: {attention}")
    lines.append(f"  other custom calls: {_counts(step['custom_calls'])}")
    lines.append(f"  fusions: {_counts(step['fusions'])}")
    lines.append(f"  collectives: {_counts(step['collectives'])}")
  return "\n".join(lines)


def run(argv: list[str]) -> dict:
  """What the command does (printing included); returns the report."""
  overrides, rest = config_lib.split_overrides(argv)
  args = _parser().parse_args(rest)
  if args.devices < 1:
    raise errors.ConfigError(
      f"--devices {args.devices}", hint="at least one GPU"
    )
  check_plugin()
  target = targets.load(args.gpu, args.cudnn_version)
  config = config_lib.load_config(args.config, overrides)
  # Before jax is imported: it must not look for a GPU (there is none),
  # and the CPU has as many devices as the mesh (they size the estimate).
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["XLA_FLAGS"] = (
    f"{os.environ.get('XLA_FLAGS', '')} "
    f"--xla_force_host_platform_device_count={args.devices}"
  ).strip()
  from vidjax.base import internals

  internals.import_flax_without_ipython()
  from vidjax.compile import compiler

  report = compiler.compile_run(
    config,
    target,
    args.devices,
    eval_step=not args.no_eval,
    schedule=args.schedule,
  )
  print(format_report(report, args.config), flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"config": args.config, **report}, f, indent=1)
  return report


def main(argv: list[str] | None = None) -> int:
  try:
    run(sys.argv[1:] if argv is None else argv)
  except errors.UserError as e:
    print(f"vidjax.compile: error: {e.describe()}", file=sys.stderr)
    return e.exit_code
  return 0


if __name__ == "__main__":
  sys.exit(main())
