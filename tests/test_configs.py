"""The recipes in configs/: each builds, validates for one 8-GPU machine, and
its `:debug` variant trains 2 steps and evaluates on CPU (synthetic corpus)."""

import math
from pathlib import Path
import types

from flax import nnx
import jax
import numpy as np
import pytest

import debug_runs
from vidjax import (
  augment,
  config as config_lib,
  models,
  optim,
  steps as steps_lib,
  tasks,
)
from vidjax.checkpoints import checkpoint_reader
from vidjax.data import annotations
from vidjax.report import monitor

# The :debug runs are made once per test process (debug_runs.py): keep the
# tests that share them in one process when tests run in parallel.
pytestmark = pytest.mark.xdist_group("debug_runs")

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# Recipe -> the final evaluation metrics its task must report.
RECIPES = {
  "demo": ("eval/t2v_r1", "eval/v2t_r1", "eval/chance_r1"),
  "clip_vitb16_ego4d": (
    "eval/t2v_r1",
    "eval/v2t_r1",
    "eval/chance_r1",
    "eval/ek100_mir/mAP_avg",
    "eval/ek100_mir/nDCG_avg",
    # LaViLa's zero-shot list, on the corpus's files in their layouts.
    "eval/egomcq/inter_video",  # LaViLa's scoring (unnormalised dot products)
    "eval/egomcq/intra_video",
    "eval/egomcq/intra_video_cosine",  # And cosine beside it.
    "eval/egtea/mean_class_acc",
    "eval/charades_ego/mAP",
    "eval/ek100_cls/top1",
  ),
  "ek100_mir_ft": (
    "eval/t2v_r1",
    "eval/chance_r1",
    "eval/mAP_avg",
    "eval/nDCG_avg",
  ),
  "ek100_cls_ft": (
    "eval/top1",
    "eval/top5",
    "eval/mean_class_acc",
    "eval/verb_top1",
    "eval/noun_top1",
    "eval/verb_mean_class_acc",
    "eval/noun_mean_class_acc",
  ),
  "videomae_vitb_k400_pretrain": ("eval/loss",),
  "umt_vitb_k400_pretrain": ("eval/loss",),
  "k400_ft": ("eval/top1", "eval/top5", "eval/mean_class_acc"),
  "egtea_ft": ("eval/top1", "eval/top5", "eval/mean_class_acc"),
  "charades_ego_ft": ("eval/charades_ego/mAP", "eval/charades_ego/chance_mAP"),
}
# Built and validated but not trained here, for the suite's time:
# charades_ego_ft's task and model are clip_vitb16_ego4d's, and its
# evaluation (Charades-Ego as a zero-shot classifier) is that run's
# `eval/charades_ego/...` set. umt_vitb_k400_pretrain's :debug needs a
# teacher: tests/test_distill.py trains it from clip_vitb16_ego4d's run.
NOT_TRAINED = ("charades_ego_ft", "umt_vitb_k400_pretrain")
# The demo's run (demo:debug itself trains in test_train.py) changes the
# frames and the image size through the data keys alone, and counts its 2
# steps as 2 epochs of its 12 training clips (1 step each at batch 16).
OVERRIDES = {
  "demo": (
    "--config.data.num_frames=8",
    "--config.data.size=32",
    "--config.total_steps=1",
    "--config.total_epochs=2",
  )
}
TOP_LEVEL = (
  "seed",
  "task",
  "total_steps",
  "batch_size",
  "accum_steps",
  "fsdp",
  "resume",
  "init_from",
  "peak_tflops",
  "data",
  "model",
  "optim",
  "augment",
  "eval",
  "checkpoint",
  "log",
)


def load(name: str, variant: str | None = None):
  return config_lib.load_config(
    str(CONFIGS / f"{name}.py") + (f":{variant}" if variant else "")
  )


@pytest.mark.parametrize(
  "name, variant",
  [(name, variant) for name in RECIPES for variant in (None, "debug")]
  + [("clip_vitb16_ego4d", "lavila"), ("clip_vitb16_ego4d", "flip,debug")],
)
def test_recipe_builds_and_validates_for_8_devices(name, variant):
  config = load(name, variant)
  assert set(TOP_LEVEL) <= set(config.keys())
  config_lib.validate(config, num_devices=8)
  assert (config.model.num_frames, config.model.image_size) == (
    config.data.num_frames,
    config.data.size,
  )
  assert config.model.num_frames % config.model.tubelet == 0
  task = tasks.get_task(config.task)
  for train in (True, False):
    augment.make_augment(task.augment_config(config, train=train))
  model = nnx.eval_shape(
    lambda: models.build_model(config.model, rngs=nnx.Rngs(0))
  )
  params = nnx.split(model, nnx.Param, ...)[1]
  tx, _ = optim.make_optimizer(config.optim, config.total_steps)
  # One abstract update: weight-decay masks and layer decay fit the model.
  jax.eval_shape(tx.update, params, jax.eval_shape(tx.init, params), params)
  if variant != "debug" and name != "demo":
    # Real recipes hard-code no paths: the user gives every one.
    assert (
      config.data.root,
      config.data.train_annotations,
      config.data.eval_annotations,
      config.init_from,
    ) == ("", "", "", "")


def test_recipes_keep_avions_schedules():
  """(total_steps, batch_size, optim.warmup_steps): AVION's epochs of the
  data sets' published sizes."""
  for spec, schedule in [
    ("clip_vitb16_ego4d", (9765, 2048, 0)),
    ("clip_vitb16_ego4d:lavila", (19530, 2048, 0)),
    ("ek100_mir_ft", (13100, 512, 131)),
    ("ek100_cls_ft", (13100, 512, 262)),
    ("videomae_vitb_k400_pretrain", (749600, 256, 37480)),
    ("umt_vitb_k400_pretrain", (23517, 2048, 4680)),  # UMT's 201 and 40.
    ("k400_ft", (93700, 256, 4685)),
    ("egtea_ft", (6400, 128, 64)),  # LaViLa's: 100 epochs, 1 of warmup.
  ]:
    config = load(*spec.split(":"))
    assert (
      config.total_steps,
      config.batch_size,
      config.optim.warmup_steps,
    ) == schedule, spec
  # Evaluated every epoch, and :lavila's epochs are twice as long.
  assert load("clip_vitb16_ego4d", "lavila").eval.every_steps == 19530 // 5
  # The warmup starts at AVION's --lr-start 1e-6, scaled by the batch as its
  # scripts scale lr (MIR: unscaled; CLS: / 128; VideoMAE: / 256).
  for spec, start in [
    ("ek100_mir_ft", 1e-6),
    ("ek100_cls_ft", 1e-6 * 512 / 128),
    ("videomae_vitb_k400_pretrain", 1e-6 * 256 / 256),
    ("k400_ft", 1e-6 * 256 / 256),
  ]:
    assert load(spec).optim.warmup_lr == pytest.approx(start), spec
  # AVION's VideoMAE pretraining decays its mask token.
  names = load("videomae_vitb_k400_pretrain").optim.no_decay_names
  assert "mask_token" not in names and "pos_embed" in names


def test_flip_is_the_recipe_masked_with_flips_batch_and_unmasked_tuning():
  """:flip masks half the tokens and spends the memory on twice the batch
  (its rate scaled), for the same 5 epochs; the last 49 of its 4880 steps
  train on every token at 1/100 of the rate after 5 warmup steps, in 2
  microbatches (also joined with other variants)."""
  base, flip = load("clip_vitb16_ego4d"), load("clip_vitb16_ego4d", "flip")
  assert config_lib.changes(base.to_dict(), flip.to_dict()) == [
    ("batch_size", 2048, 4096),
    ("eval.every_steps", 1953, 976),
    ("model.mask_ratio", 0.0, 0.5),
    ("optim.lr", 3e-05, 6e-05),
    ("total_steps", 9765, 4880),
    ("unmask_accum_steps", 0, 2),
    ("unmask_fraction", 0.0, 0.01),
    ("unmask_lr", 0.0, 6e-07),
    ("unmask_warmup_steps", 0, 5),
  ]
  assert steps_lib.unmask_start(flip) == 4880 - 49
  assert steps_lib.unmask_start(base) is None
  both = load("clip_vitb16_ego4d", "lavila,flip")
  assert (both.model.mask_ratio, both.total_steps) == (0.5, 9765)


@pytest.mark.parametrize("name", RECIPES)
def test_unknown_variant_is_refused(name):
  with pytest.raises(ValueError, match="nope"):
    load(name, "nope")


def test_synthetic_relevancy_grades_shared_verb_and_noun(tmp_path_factory):
  root = debug_runs.corpus(
    load("ek100_mir_ft", "debug").data.synthetic, tmp_path_factory
  )
  matrix = np.load(root / "relevancy_val.npy")
  texts = [r.text for r in annotations.load_jsonl(root / "val.jsonl")]
  assert matrix.dtype == np.float32 and matrix.shape == (len(texts),) * 2
  for i, a in enumerate(texts):
    for j, b in enumerate(texts):
      # "a red square moves left": noun = "red square", verb = "left".
      same_noun = a.split()[1:3] == b.split()[1:3]
      same_verb = a.split()[-1] == b.split()[-1]
      assert matrix[i, j] == 0.5 * same_noun + 0.5 * same_verb, (a, b)


@pytest.mark.parametrize("name", [n for n in RECIPES if n not in NOT_TRAINED])
def test_debug_variant_trains_two_steps_and_evaluates(name, tmp_path_factory):
  # One run per recipe for the session, shared with test_handoff.py.
  workdir, returned = debug_runs.run(
    tmp_path_factory, name, *OVERRIDES.get(name, ())
  )

  rows = monitor.read_metrics(workdir)
  losses = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
  assert sorted(losses) == [1, 2]
  assert all(math.isfinite(v) for v in losses.values())
  final = [r for r in rows if any(k.startswith("eval/") for k in r)][-1]
  assert final["step"] == 2
  for key in RECIPES[name]:
    assert math.isfinite(final[key]), (key, final)
    assert returned[key] == pytest.approx(final[key])
  for key in ("eval/mAP_avg", "eval/ek100_mir/mAP_avg"):
    if key in final:
      assert 0 < final[key] <= 1
  assert not (workdir / "plots").exists()  # log.plots=false: none drawn.
  config = debug_runs.load(name, *OVERRIDES.get(name, ()))
  if name in OVERRIDES:  # 8 frames, (32 / 16)^2 patches and the class token.
    params, saved = checkpoint_reader.read_params(workdir / "checkpoints", 2)
    assert (saved["model"]["num_frames"], saved["model"]["image_size"]) == (
      8,
      32,
    )
    assert params["visual.temporal_pos"].shape[0] == 8
    assert params["visual.spatial_pos"].shape[0] == 5
  if config.eval.save_embeddings:  # One file per set and eval.
    for set_name in [""] + list(config.eval.sets):
      saved = np.load(workdir / "embeddings" / set_name / "step_2.npz")
      assert saved["video"].shape[1] == saved["text"].shape[1]


def test_debug_recipes_do_not_warn_that_their_batch_exceeds_their_clips(
  tmp_path, monkeypatch
):
  """A :debug recipe's synthetic corpus (12 training clips for its batch of
  16) is small on purpose; the same on your own data is warned about."""
  from vidjax import train

  warned = []
  monkeypatch.setattr(
    train.logging, "warning", lambda fmt, *a: warned.append(fmt % a)
  )
  run = types.SimpleNamespace(
    state={"params": {"w": np.zeros(3)}, "step": 0},
    steps=types.SimpleNamespace(unmask_start=None),
    workdir=tmp_path,
  )
  report = types.SimpleNamespace(kept_records=lambda: [None] * 12)
  for name in RECIPES:
    config = load(name, "debug")
    with config.unlocked():
      config.data.root = str(tmp_path / "synthetic" / "chunks")
    train._log_summary(
      run, config, {"train": report}, train.resume.StartPoint("scratch")
    )
  assert warned == []
  config.data.root = str(tmp_path / "mine")
  train._log_summary(
    run, config, {"train": report}, train.resume.StartPoint("scratch")
  )
  assert warned == [
    "batch_size=16 is larger than the 12 training clips: every batch "
    "repeats clips; lower --config.batch_size"
  ]
