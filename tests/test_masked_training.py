"""Masked training (FLIP) run end to end on the demo: it learns with half
of its video tokens dropped and an unmasked tuning (FLIP's: its own
learning rate after a warmup, here in 2 microbatches of the same global
batch), the switch compiles the training step once more, and a run resumed
before the switch goes through it exactly as the uninterrupted run did.
"""

import logging

from absl import logging as absl_logging
import numpy as np
import pytest

import debug_runs
from vidjax import train
from vidjax.data import synthetic
from vidjax.report import monitor

# The three tests share the masked run (a module fixture): in one test
# process, one after another, so it is trained once.
pytestmark = pytest.mark.xdist_group("masked_run")

# 40 steps: 30 on 33 of the 65 video tokens, the last 10 on every token,
# at 1/100 of the demo's learning rate after 4 warmup steps.
STEPS, SWITCH, SAVED = 40, 30, 29
LR, TUNING_LR, WARMUP = 2e-3, 2e-5, 4
MASKED = (
  "--config.optim.schedule=constant",
  "--config.optim.warmup_steps=0",
  "--config.log.every_steps=1",
  f"--config.total_steps={STEPS}",
  "--config.model.mask_ratio=0.5",
  "--config.unmask_fraction=0.25",
  f"--config.unmask_lr={TUNING_LR}",
  f"--config.unmask_warmup_steps={WARMUP}",
  "--config.unmask_accum_steps=2",
  f"--config.checkpoint.every_steps={SAVED}",
  "--config.eval.every_steps=0",
)


def masked_config(corpus):
  """demo.py:debug masked, evaluated on its 12 training clips: with 12
  clips (of 48 caption classes) nothing generalises to held-out captions,
  so the learned alignment is measured, unmasked, on the clips it learned."""
  return debug_runs.load(
    "demo",
    *MASKED,
    f"--config.data.root={corpus}/chunks",
    f"--config.data.train_annotations={corpus}/train.jsonl",
    f"--config.data.eval_annotations={corpus}/train.jsonl",
    f"--config.data.vocab={corpus}/vocab.txt.gz",
  )


def losses(workdir):
  return {
    row["step"]: row["train/loss"]
    for row in monitor.read_metrics(workdir)
    if "train/loss" in row
  }


class Messages(logging.Handler):
  """The messages logged at INFO and above while it is attached."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory):
  """(workdir, final metrics, compilations by name, log messages) of the
  masked run."""
  workdir = tmp_path_factory.mktemp("masked")
  debug_runs.prepare(debug_runs.load("demo"), workdir, tmp_path_factory)
  corpus = workdir / "synthetic"
  synthetic.write_vocab(corpus / "vocab.txt.gz")
  logger, messages = absl_logging.get_absl_logger(), Messages()
  level = logger.level
  logger.addHandler(messages)
  logger.setLevel(logging.INFO)
  try:
    with debug_runs.counting_compiles() as compiles:
      metrics = train.train_and_evaluate(masked_config(corpus), workdir)
  finally:
    logger.removeHandler(messages)
    logger.setLevel(level)
  return workdir, metrics, compiles, "\n".join(messages.messages)


def test_masked_demo_learns_and_compiles_the_switch_once(masked_run):
  _, metrics, compiles, log = masked_run
  assert metrics["eval/t2v_r1"] >= 5 * metrics["eval/chance_r1"], metrics
  assert compiles["jit(train_step)"] == 2, compiles  # Masked, unmasked.
  assert (
    "masked training: the video tower sees 33 of its 65 tokens "
    "(random, mask_ratio 0.5)"
  ) in log
  assert (
    f"the unmasked tuning starts: steps {SWITCH + 1} to {STEPS} train "
    "on every video token, in 2 microbatches (the same global batch), at "
    f"its own learning rate {TUNING_LR:g} after {WARMUP} warmup steps"
  ) in log


def test_the_unmasked_tuning_runs_at_its_own_learning_rate(masked_run):
  """metrics.jsonl: the demo's rate through step 30, then the tuning's
  warmup from 0 to 1/100 of it over 4 steps, then that rate."""
  workdir = masked_run[0]
  lr = {
    row["step"]: row["train/lr"]
    for row in monitor.read_metrics(workdir)
    if "train/lr" in row
  }
  tuning = [TUNING_LR * min(i / WARMUP, 1) for i in range(STEPS - SWITCH)]
  np.testing.assert_allclose(
    [lr[s] for s in range(1, STEPS + 1)],
    [LR] * SWITCH + tuning,
    rtol=1e-6,
  )


def test_resume_before_the_unmask_switch_runs_what_the_run_ran(
  masked_run, tmp_path
):
  """From the run's checkpoint of step 29 (`resume`: its state, data
  position and key): a masked step, the switch, 10 unmasked steps; the
  losses and the final evaluation are the uninterrupted run's."""
  workdir, metrics, _, _ = masked_run
  config = masked_config(workdir / "synthetic")
  config.resume = str(workdir / "checkpoints" / str(SAVED))
  assert train.train_and_evaluate(config, tmp_path / "resumed") == metrics
  expected, got = losses(workdir), losses(tmp_path / "resumed")
  assert sorted(got) == list(range(SAVED + 1, STEPS + 1))
  np.testing.assert_array_equal(
    [got[s] for s in got], [expected[s] for s in got]
  )
