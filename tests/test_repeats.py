"""Repeated sampling (`data.repeats`): the device's views, the runs with
them, and the runs without them unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import debug_runs
from vidjax import augment, config as config_lib, tasks, train
from vidjax.augment import views
from vidjax.base import errors
from vidjax.data import batches, crop as crop_lib, loader
from vidjax.report import console, monitor

# Shares the :debug runs of test_configs.py (one per process).
pytestmark = pytest.mark.xdist_group("debug_runs")

SPEC = dict(crop="random_resized", crop_scale=(0.5, 1.0), hflip=0.5)
# The :debug recipes' training losses with one view per clip (8 CPU
# devices): in Grain's training order they were those of main before
# repeated sampling existed (bc46356: k400_ft 3.8712291717529297,
# 3.871192693710327; videomae 1.0401076078414917, 1.038913369178772);
# these are the same runs in the order of `vidjax.data.order`; k400_ft's
# second loss since its warmup starts at AVION's --lr-start, not 0 (ac432ec;
# 3.8712635040283203 from 0).
BEFORE = {
  "k400_ft": [3.8712196350097656, 3.8712210655212402],
  "videomae_vitb_k400_pretrain": [1.039721131324768, 1.0374150276184082],
}
# 4 views of 8 clips a step: the clips split over the 8 test devices.
REPEATS = ("--config.data.repeats=4", "--config.batch_size=32")


def _losses(workdir) -> list[float]:
  by_step = {}
  for row in monitor.read_metrics(workdir):
    if "train/loss" in row:
      by_step[row["step"]] = row["train/loss"]  # A resumed run appends.
  return [by_step[s] for s in sorted(by_step)]


def test_a_whole_canvas_box_is_the_canvas_and_a_flip_mirrors_it():
  video = jnp.asarray(
    np.random.default_rng(0).integers(0, 256, (2, 3, 24, 30, 3), np.uint8)
  )
  boxes = jnp.tile(jnp.asarray([0.0, 0.0, 30.0, 24.0]), (2, 2, 1))
  flips = jnp.asarray([[False, True], [True, False]])
  crop = jax.jit(views.crop_views, static_argnums=3)
  out = np.asarray(crop(video, boxes, flips, (24, 30)))
  assert out.shape == (4, 3, 24, 30, 3) and out.dtype == np.uint8
  v = np.asarray(video)
  np.testing.assert_array_equal(out[0], v[0])
  np.testing.assert_array_equal(out[1], v[0][:, :, ::-1])
  np.testing.assert_array_equal(out[2], v[1][:, :, ::-1])
  # A box of the right half, at its own size: exactly those pixels.
  half = jnp.asarray([[[14.0, 4.0, 16.0, 20.0]]] * 2)
  out = crop(video, half, jnp.zeros((2, 1), bool), (20, 16))
  np.testing.assert_array_equal(np.asarray(out[1]), v[1][:, 4:24, 14:30])


def test_each_view_draws_its_own_box_as_the_host_samplers_do():
  n, height, width = 512, 72, 90

  def sample(key, crop):
    spec = dict(SPEC, crop=crop, size=(64, 64))
    return jax.jit(lambda k: views.sample_boxes(k, n, height, width, spec))(key)

  boxes, flips = sample(jax.random.key(0), "random_resized")
  x, y, w, h = np.asarray(boxes).T
  assert (x >= 0).all() and (y >= 0).all()
  assert (x + w <= width).all() and (y + h <= height).all()
  area = w * h / (height * width)
  assert area.min() >= 0.45 and area.max() <= 1.05  # Rounded sides.
  assert len({tuple(b) for b in np.asarray(boxes)}) > n * 0.9
  assert 0.4 < np.asarray(flips).mean() < 0.6
  boxes, _ = sample(jax.random.key(1), "multi_scale")
  rng = np.random.default_rng(0)
  host = {
    crop_lib.multi_scale_crop(rng, height, width, 64).box for _ in range(4000)
  }
  drawn = {tuple(int(v) for v in b) for b in np.asarray(boxes)}
  assert drawn <= host and len(drawn) > 0.8 * len(host)


def test_views_of_a_clip_are_rows_in_a_row_with_its_keys():
  batch = {
    "video": jnp.zeros((2, 2, 24, 30, 3), jnp.uint8),
    "label": jnp.asarray([5, 7]),
    "valid": jnp.asarray([True, False]),
  }
  spec = dict(SPEC, size=(16, 16))
  out = jax.jit(lambda b, k: views.make_views(b, k, 3, spec))(
    batch, jax.random.key(0)
  )
  assert out["video"].shape == (6, 2, 16, 16, 3)
  assert out["label"].tolist() == [5, 5, 5, 7, 7, 7]
  assert out["valid"].tolist() == [True] * 3 + [False] * 3


def test_the_host_decodes_a_canvas_a_step_of_clips():
  config = debug_runs.load("k400_ft", *REPEATS)
  assert loader.canvas_size(config.data) == (74, 92)
  spec = batches.batch_spec(config, 32)
  assert spec["video"].shape == (8, 4, 74, 92, 3)
  assert spec["label"].shape == (8,)
  assert batches.batch_spec(config, 32, train=False)["video"].shape[:3] == (
    32,
    4,
    64,
  )
  config.data.repeat_canvas = (224, 256)
  assert loader.ClipSpec.from_config(config.data, train=True).size == (224, 256)


def test_the_summary_and_the_epochs_count_views():
  text = console.run_summary(
    devices=jax.devices(),
    batch_size=32,
    repeats=4,
    accum_steps=1,
    num_params=1e6,
    clips={"train": 640},
    total_steps=40,
    first_step=0,
    start="from scratch",
  )
  assert "batch 32 views (8 clips decoded x 4 views each)" in text
  assert "20 steps per epoch (of 640 views), 40 steps = 2.0 epochs" in text
  config = debug_runs.load("k400_ft", *REPEATS, "--config.total_epochs=2")
  config_lib.epochs_to_steps(config, train_clips=640)
  assert config.total_steps == 40  # As without repeats: epochs of views.


def test_video_text_tasks_refuse_repeats_in_one_line():
  config = debug_runs.load("demo", "--config.data.repeats=4")
  with pytest.raises(errors.ConfigError) as refused:
    config_lib.validate(config, num_devices=8)
  problem = str(refused.value).split("\n  - ")[1].splitlines()[0]
  assert "contrastive task cannot repeat clips" in problem
  assert "false negatives" in problem
  config = debug_runs.load("k400_ft", "--config.data.repeats=4")
  with pytest.raises(errors.ConfigError, match="use a multiple of 32"):
    config_lib.validate(config, num_devices=8)  # 16 / 4 clips on 8 devices.


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_one_view_per_clip_gives_the_losses_of_before(name, tmp_path_factory):
  workdir, _ = debug_runs.run(tmp_path_factory, name)
  assert _losses(workdir) == BEFORE[name]


def test_classification_trains_on_labelled_views():
  """K400's training augment with repeats (RandAugment, erasing, label
  smoothing): R rows of soft targets per clip (traced, not run)."""
  config = debug_runs.load("k400_ft", *REPEATS)
  task = tasks.get_task(config.task)
  fn = augment.make_augment(task.augment_config(config, train=True))
  spec = batches.batch_spec(config, 32)
  out = jax.eval_shape(fn, spec, jax.random.key(0))
  assert out["video"].shape == (32, 4, 64, 64, 3)
  assert out["label"].shape == (32,)
  assert out["label_target"].shape == (32, config.model.num_classes)


def test_videomae_resumes_repeated_views_exactly_across_sigterm(
  tmp_path, tmp_path_factory, monkeypatch
):
  # (K400's recipe resumes so too; one recipe keeps the suite short.)
  name = "videomae_vitb_k400_pretrain"
  uninterrupted, _ = debug_runs.run(tmp_path_factory, name, *REPEATS)
  expected = _losses(uninterrupted)
  assert len(expected) == 2 and all(np.isfinite(expected))
  rows = monitor.read_metrics(uninterrupted)
  perf = [r for r in rows if "perf/views_per_s" in r]
  assert perf
  for r in perf:
    assert r["perf/views_per_s"] == pytest.approx(4 * r["perf/clips_per_s"])

  workdir = debug_runs.preempted(
    monkeypatch, tmp_path_factory, tmp_path / "run", name, *REPEATS
  )
  train.train_and_evaluate(debug_runs.load(name, *REPEATS), workdir)
  assert _losses(workdir) == expected
