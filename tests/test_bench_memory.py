"""The memory benchmark: what the real step keeps, per remat policy; the
benchmarks' batches on any device count."""

from pathlib import Path

import jax
import pytest

from benchmarks import device_batch, memory


def test_kept_memory_falls_as_the_policy_keeps_less(capsys):
  config = Path(__file__).parents[1] / "configs/clip_vitb16_ego4d.py:debug"
  rows = memory.main(
    [
      "--config",
      str(config),
      "--batch-per-device",
      "4",
      "--accum-steps",
      "2",
      "--remat",
      "none,save_attention,full",
    ]
  )
  kept = [row["kept_mib_per_clip"] for row in rows]
  assert kept == sorted(kept, reverse=True) and kept[-1] > 0
  assert kept[0] > 2 * kept[-1]
  # 2 microbatches of 2 clips, and the step's 4 clips' cached embeddings
  # and gradients: 2 towers x 64 dimensions x 4 bytes x 2, per clip.
  for row in rows:
    assert row["cached_mib"] == pytest.approx(4 * 2 * 64 * 4 * 2 / 2**20)
    assert row["total_gib"] == pytest.approx(
      row["fixed_gib"]
      + (2 * row["kept_mib_per_clip"] + row["cached_mib"]) / 1024
    )
  out = capsys.readouterr().out
  assert "save_attention" in out
  assert "4 clips per device in 2 microbatches of 2" in out
  # The extra forward pass that keeps the loss the whole batch's: 1/3 more.
  assert "TFLOP for the embedding cache's extra forward pass (+33%)" in out


def test_benchmark_batches_split_over_the_devices():
  # The suite's 8 host devices, as an 8-GPU machine: a batch of 4 (a
  # worker's start in benchmarks.pipeline) becomes 8. CI runs every
  # benchmark's --smoke on 1 and 8 devices (.ci/run).
  assert jax.local_device_count() == 8
  assert [device_batch(b) for b in (1, 4, 8, 12, 32)] == [8, 8, 8, 16, 32]
