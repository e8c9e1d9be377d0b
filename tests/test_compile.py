"""python -m vidjax.compile: every recipe's steps built by XLA's GPU compiler
for 8 H100s, on a machine without a GPU.

The default suite checks what needs no compiler: the shipped targets parse,
and the command refuses, naming the extra, where JAX's CUDA plugin is not
installed. The `gpu_compile` tests need the `[gpu-compile]` extra (skipped
without it; CI runs them in a venv of their own, .ci/run): each recipe as
users run it (not `:debug`) compiles for an H100 on 8 devices, prints its
compiled memory, calls cuDNN attention forward and backward in every tower
of its training step and forward in its evaluation step; and the analytic
estimate (`vidjax.memory`) is an upper bound of its training step, at most
30% over, at the recipe's batch and at 1 clip per device: the step's need,
its work ordered for the least memory (the command's default). `-rP` shows
each recipe's compile times and ratios.
"""

import json
from pathlib import Path
import subprocess
import sys

import pytest

from vidjax import config as config_lib
from vidjax.base import errors
from vidjax.compile import __main__ as command, targets

REPO = Path(__file__).parents[1]
CONFIGS = REPO / "configs"
# Every recipe's default, and the variants that train another program; not
# the demo, a CPU recipe (a float32 model: XLA attention).
RECIPES = sorted(
  p.name for p in CONFIGS.glob("*.py") if p.name != "demo.py"
) + ["clip_vitb16_ego4d.py:flip", "own_videos.py:labels"]
# The estimate is at least the compiled step's memory, and at most this
# much over it (measured ratios: BENCHMARKS.md).
TIGHT = 1.3


def test_every_shipped_target_parses():
  for name in targets.names():
    target = targets.load(name)
    assert target.memory_bytes > 16 * 2**30, name
    assert target.compute_capability >= (8, 0), name
    assert target.cudnn_version == 91000, name
    assert "gpu_device_info" in target.text
  h100 = targets.load("h100")
  assert h100.name == "NVIDIA H100 80GB HBM3"
  assert h100.compute_capability == (9, 0)
  assert targets.load("a5000").memory_bytes == 24564 * 2**20
  assert targets.load("h100", cudnn_version=90800).cudnn_version == 90800


def test_a_users_own_target_file_and_a_wrong_name(tmp_path):
  own = tmp_path / "mine.txtpb"
  text = targets.load("a6000").text.replace(
    "major: 9 minor: 10", "major: 9 minor: 8"
  )
  own.write_text(text)
  assert targets.load(str(own)).cudnn_version == 90800
  with pytest.raises(targets.TargetError) as e:
    targets.load("h1000")
  assert "h100_sxm" in e.value.hint and e.value.exit_code == errors.EXIT_USAGE


def test_without_the_extra_the_command_names_it(monkeypatch, capsys):
  monkeypatch.setattr(command, "PLUGINS", ("jax_plugins.no_such_plugin",))
  code = command.main(["--config", str(CONFIGS / "demo.py"), "--gpu", "h100"])
  err = capsys.readouterr().err
  assert code == errors.EXIT_FAILED
  assert 'pip install "vidjax[gpu-compile]"' in err
  assert "Traceback" not in err


def test_a_schedule_option_this_xla_does_not_know_is_left_out(monkeypatch):
  # A newer XLA may drop a flag the memory order sets: the step still
  # compiles, in XLA's own order, and the report names the flag.
  import jax
  import jax.numpy as jnp

  from vidjax.compile import compiler

  monkeypatch.setitem(
    compiler.SCHEDULES,
    "memory",
    {
      "xla_gpu_enable_latency_hiding_scheduler": False,
      "xla_gpu_option_no_xla_has": False,
    },
  )
  lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(4))
  compiled, added, unknown = compiler._compile(lowered, "memory")
  assert unknown == ["xla_gpu_option_no_xla_has"] and added == {}
  assert (compiled(jnp.ones(4)) == 2).all()


def _compile(recipe: str, tmp_path, *overrides: str) -> tuple[dict, str]:
  """The command's report and output for `recipe` on 8 GPUs."""
  out = tmp_path / "report.json"
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "vidjax.compile",
      "--config",
      str(CONFIGS / recipe),
      "--devices",
      "8",
      "--json",
      str(out),
      *overrides,
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert done.returncode == 0, done.stderr[-4000:]
  return json.loads(out.read_text()), done.stdout


def _ratio(step: dict) -> str:
  return f"estimate/compiled {step['estimate_over_compiled']:.2f}"


def _check_bound(recipe: str, report: dict, lines: list[str]) -> None:
  """The estimate of each training step within [1, `TIGHT`] x compiled."""
  for name, step in report["steps"].items():
    if "estimate" not in step:
      continue
    ratio = step["estimate"] / step["memory"]["total"]
    clips = report["clips_per_device"]
    lines.append(
      f"  {name} at {clips} clip{'s' * (clips != 1)} per device: "
      f"{step['memory']['total'] / 2**30:.2f} GiB compiled in "
      f"{step['compile_seconds']:.0f} s, {_ratio(step)}"
    )
    assert 1.0 <= ratio <= TIGHT, (recipe, name, clips, step)


@pytest.mark.gpu_compile
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_compiles_for_h100_and_the_estimate_bounds_it(
  recipe, tmp_path
):
  """At the recipe's batch: cuDNN attention forward and backward in every
  tower of the training step, forward only in the evaluation step, and the
  estimate within [1, `TIGHT`] x the compiled training step; again at 1
  clip per device (per microbatch)."""
  report, printed = _compile(recipe, tmp_path, "--gpu", "h100")
  assert "memory per device:" in printed and "compiled (argument" in printed
  # A probe trains its head on the frozen encoder's features: its training
  # step runs no tower (its evaluation step runs them).
  config = config_lib.load_config(str(CONFIGS / recipe))
  probe = config.model.get("probe")
  lines = [f"{recipe} on 8 x H100"]
  for name, step in report["steps"].items():
    if probe and name == "train":
      assert not any(sum(c.values()) for c in step["attention"].values())
      continue
    for tower, calls in step["attention"].items():
      assert tower != "other", (recipe, name, step["attention"])
      assert calls["forward"] >= 1, (recipe, name, tower, calls)
      if name != "eval":
        assert calls["backward"] >= 1, (recipe, name, tower, calls)
      else:
        assert calls["backward"] == 0, (recipe, name, tower, calls)
  lines.append(f"  eval: {report['steps']['eval']['compile_seconds']:.0f} s")
  _check_bound(recipe, report, lines)
  clips = 8 * config.accum_steps * config.data.get("repeats", 1)
  small = [f"--config.batch_size={clips}"]
  if config.get("unmask_accum_steps"):  # Its microbatches: the same.
    small.append(f"--config.unmask_accum_steps={config.accum_steps}")
  report, _ = _compile(recipe, tmp_path, "--gpu", "h100", "--no-eval", *small)
  _check_bound(recipe, report, lines)
  print("\n".join(lines))
