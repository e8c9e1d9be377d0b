"""The training loop: preemption + resume, gradient accumulation, the CLI."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidjax import logging as log_lib, train

REPO = Path(__file__).resolve().parents[1]


def cli(workdir, *overrides):
  return [sys.executable, "-m", "vidjax.main", "--config",
          str(REPO / "configs/demo.py:debug"), "--workdir", str(workdir),
          "--config.total_steps=24", "--config.log.every_steps=1",
          "--config.checkpoint.every_steps=1000", "--config.batch_size=32",
          *overrides]


def losses(workdir):
  by_step = {}
  if not (Path(workdir) / "metrics.jsonl").exists():
    return by_step
  for row in log_lib.read_metrics(workdir):
    if "train/loss" in row:
      by_step[row["step"]] = row["train/loss"]  # Resumed runs append.
  return by_step


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  subprocess.run(cli(workdir), check=True, cwd=REPO, capture_output=True)
  return workdir


def test_sigterm_then_resume_matches_uninterrupted_run(uninterrupted, tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.Popen(cli(workdir), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if max(losses(workdir), default=0) >= 5:
      proc.send_signal(signal.SIGTERM)
      break
    time.sleep(0.05)
  output = proc.communicate(timeout=240)[0].decode()
  assert proc.returncode == 0, output
  stopped_at = max(losses(workdir))
  assert 5 <= stopped_at < 24, f"SIGTERM came too late ({stopped_at})"
  ckpts = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                 if p.name.isdigit())
  assert ckpts and ckpts[-1] >= stopped_at
  subprocess.run(cli(workdir), check=True, cwd=REPO, capture_output=True)
  resumed, expected = losses(workdir), losses(uninterrupted)
  assert sorted(resumed) == sorted(expected) == list(range(1, 25))
  np.testing.assert_allclose([resumed[s] for s in range(1, 25)],
                             [expected[s] for s in range(1, 25)], rtol=1e-5)
  final = [r for r in log_lib.read_metrics(workdir) if "eval/t2v_r1" in r]
  assert final and final[-1]["step"] == 24
  config = json.loads((workdir / "config.json").read_text())
  assert config["total_steps"] == 24


def test_bad_config_stops_at_start_with_a_message(tmp_path):
  result = subprocess.run(cli(tmp_path, "--config.batch_size=12"), cwd=REPO,
                          capture_output=True, text=True)
  assert result.returncode != 0
  assert "batch_size" in result.stderr and "12" in result.stderr
  result = subprocess.run(cli(tmp_path, "--config.optim.nonsense=1"), cwd=REPO,
                          capture_output=True, text=True)
  assert result.returncode != 0 and "nonsense" in result.stderr


def test_gradient_accumulation_matches_one_big_batch():
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((3, 2)), jnp.float32)}
  batch = {"x": jnp.asarray(rng.standard_normal((16, 3)), jnp.float32),
           "y": jnp.asarray(rng.standard_normal((16, 2)), jnp.float32)}

  def loss_fn(params, rest, batch, key):
    del rest, key
    loss = jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
    return loss, {"abs": jnp.abs(loss)}

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  one = train._accumulate(grad_fn, 1, params, None, batch, jax.random.key(0))
  four = train._accumulate(grad_fn, 4, params, None, batch, jax.random.key(0))
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four)):
    np.testing.assert_allclose(a, b, rtol=1e-5)
