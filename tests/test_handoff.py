"""AVION's chain on the :debug recipes: pretrain, evaluate, fine-tune.

The :debug pretrainings (video-text CLIP, VideoMAE) train once; the
evaluation without training and every fine-tune start from their workdir or
one checkpoint step directory through `config.init_from`, in-process on
the synthetic corpus. The runs from scratch are test_configs.py's (all
through `debug_runs`). Runs are deterministic, so a fine-tune whose first
loss equals the run from scratch did not start from the pretraining.
"""

import json
import math

import numpy as np
import pytest

import debug_runs
from vidjax import train
from vidjax.base import rundir
from vidjax.checkpoints import checkpoint_reader
from vidjax.report import monitor
from vidjax.weights.tensor_io import interpolate_temporal

# The :debug runs are made once per test process (debug_runs.py): keep the
# tests that share them in one process when tests run in parallel.
pytestmark = pytest.mark.xdist_group("debug_runs")


def first_loss(workdir) -> float:
  return next(
    row["train/loss"]
    for row in monitor.read_metrics(workdir)
    if row["step"] == 1 and "train/loss" in row
  )


def init_report(workdir) -> dict:
  return json.loads((workdir / rundir.INIT_FROM_JSON).read_text())


def test_eval_mode_reproduces_the_pretraining_final_metrics(tmp_path_factory):
  pretrained, final = debug_runs.run(tmp_path_factory, "clip_vitb16_ego4d")
  best = checkpoint_reader.read_best(pretrained / "checkpoints")
  assert (best["metric"], best["step"]) == ("eval/ek100_mir/mAP_avg", 2)
  for source in (pretrained / "checkpoints" / "2", pretrained):
    config = debug_runs.load(
      "clip_vitb16_ego4d", f"--config.init_from={source}"
    )
    workdir = debug_runs.prepare(
      config, tmp_path_factory.mktemp("eval"), tmp_path_factory
    )
    assert train.evaluate_only(config, workdir) == final
    report = init_report(workdir)
    assert report["change"] == "clip -> clip" and len(report["loaded"]) == 62
    assert report["resized"] == report["dropped"] == report["fresh"] == {}
    assert not (workdir / "checkpoints").exists()  # Nothing was trained.


@pytest.mark.parametrize(
  "name, pretraining, fresh",
  [
    ("ek100_mir_ft", "clip_vitb16_ego4d", set()),
    ("ek100_cls_ft", "clip_vitb16_ego4d", {"head.kernel", "head.bias"}),
    (
      "k400_ft",
      "videomae_vitb_k400_pretrain",
      {"head.kernel", "head.bias", "encoder.norm.scale", "encoder.norm.bias"},
    ),
  ],
)
def test_finetune_starts_from_the_pretraining(
  name, pretraining, fresh, tmp_path_factory
):
  pretrained, _ = debug_runs.run(tmp_path_factory, pretraining)
  finetuned, metrics = debug_runs.run(
    tmp_path_factory, name, f"--config.init_from={pretrained}"
  )
  scratch, _ = debug_runs.run(tmp_path_factory, name)
  report = init_report(finetuned)
  assert set(report["fresh"]) == fresh
  assert report["loaded"] and not report["resized"]
  assert all(math.isfinite(v) for v in metrics.values())
  loss, scratch_loss = first_loss(finetuned), first_loss(scratch)
  assert math.isfinite(loss) and loss != scratch_loss


def test_mir_finetune_at_8_frames_starts_from_a_checkpoint_step(
  tmp_path_factory,
):
  pretrained, _ = debug_runs.run(tmp_path_factory, "clip_vitb16_ego4d")
  step_dir = pretrained / "checkpoints" / "2"
  config = debug_runs.load(
    "ek100_mir_ft",
    f"--config.init_from={step_dir}",
    "--config.data.num_frames=8",
  )
  workdir = debug_runs.prepare(
    config, tmp_path_factory.mktemp("mir8"), tmp_path_factory
  )
  params = train.setup(config, workdir).state["params"]
  saved, _ = checkpoint_reader.read_params(pretrained / "checkpoints", 2)
  np.testing.assert_allclose(
    params["visual"]["temporal_pos"][...],
    interpolate_temporal(saved["visual.temporal_pos"], 8),
    rtol=1e-6,
  )
  for path in ("text.blocks.layers.1.attn.qkv.kernel", "visual.proj.kernel"):
    node = params
    for key in path.split("."):
      node = node[int(key) if key.isdigit() else key]
    np.testing.assert_array_equal(node[...], saved[path])
  assert init_report(workdir)["resized"] == {
    "visual.temporal_pos": "(4, 64) -> (8, 64), linear interpolation"
  }
