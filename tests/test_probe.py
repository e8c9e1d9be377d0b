"""`configs/probe.py`: a probe on the demo's frozen encoder, trained on its
features cached once, labels held-out clips well above chance, at a
fraction of the fine-tune's step time, and resumes exactly."""

import numpy as np
import pytest

import debug_runs
from vidjax import train
from vidjax.evaluation import feature_cache
from vidjax.report import monitor

# The demo's reference run is its encoder (the group shares it).
pytestmark = pytest.mark.xdist_group("demo_reference")

# The probe's corpus: the demo's :debug corpus, larger (24 held-out clips of
# 6 unseen videos); its encoder: the demo's 16-step reference run; 200 steps
# of batch 32 on the cache (a few seconds).
PROBE = (
  "--config.data.synthetic.num_videos=24",
  "--config.total_steps=200",
  "--config.log.every_steps=1",
  "--config.checkpoint.every_steps=1000",
)


def _probe(tmp_path_factory, *overrides):
  encoder = debug_runs.demo_reference(tmp_path_factory)
  return debug_runs.run(
    tmp_path_factory,
    "probe:demo",
    f"--config.init_from={encoder}",
    *PROBE,
    *overrides,
  )


def _rows(workdir, key):
  return [r[key] for r in monitor.read_metrics(workdir) if key in r]


def test_a_linear_probe_on_cached_features_labels_held_out_clips(
  tmp_path_factory,
):
  workdir, metrics = _probe(tmp_path_factory)
  # Measured: top-1 0.50 (12 of 24 clips), mean class accuracy 0.45.
  chance = metrics["eval/chance_top1"]
  assert chance == pytest.approx(1 / 12)
  assert metrics["eval/top1"] >= 4 * chance
  cache = np.load(feature_cache.cache_file(workdir))
  assert cache["features"].shape == (len(cache["label"]), 64)
  fine_tune = debug_runs.demo_reference(tmp_path_factory)
  probe_step = np.median(_rows(workdir, "perf/step_time_s"))
  full_step = np.median(_rows(fine_tune, "perf/step_time_s"))
  # Measured: 9 ms against 280 ms (2 loaded cores), with twice the clips.
  assert probe_step < full_step / 4
  assert not _rows(workdir, "perf/mfu")  # No model FLOPs in its steps.


def test_an_attentive_probe_labels_them_too(tmp_path_factory):
  workdir, metrics = _probe(tmp_path_factory, "--config.model.probe=attentive")
  # Measured: top-1 0.58 (14 of 24), mean class accuracy 0.61.
  assert metrics["eval/top1"] >= 4 * metrics["eval/chance_top1"]
  cache = np.load(feature_cache.cache_file(workdir))
  assert cache["features"].shape[1:] == (4 * 4 * 4, 64)  # 4 frames of 4 x 4.


def test_the_probe_resumes_exactly_from_its_cache_across_sigterm(
  tmp_path, tmp_path_factory, monkeypatch
):
  uninterrupted, _ = _probe(tmp_path_factory)
  expected = _rows(uninterrupted, "train/loss")
  encoder = debug_runs.demo_reference(tmp_path_factory)
  args = ("probe:demo", f"--config.init_from={encoder}", *PROBE)
  workdir = debug_runs.preempted(
    monkeypatch, tmp_path_factory, tmp_path / "run", *args
  )
  cached = feature_cache.cache_file(workdir).stat().st_mtime_ns
  train.train_and_evaluate(debug_runs.load(*args), workdir)
  assert feature_cache.cache_file(workdir).stat().st_mtime_ns == cached
  np.testing.assert_allclose(_rows(workdir, "train/loss"), expected, rtol=1e-6)
