"""The memory benchmark: what the real step keeps, per remat policy."""

from pathlib import Path

import pytest

from vidjax.bench import memory


def test_kept_memory_falls_as_the_policy_keeps_less(capsys):
  config = Path(__file__).parents[1] / "configs/clip_vitb16_ego4d.py:debug"
  rows = memory.main(
    [
      "--config",
      str(config),
      "--batch-per-device",
      "4",
      "--remat",
      "none,save_attention,full",
    ]
  )
  kept = [row["kept_mib_per_clip"] for row in rows]
  assert kept == sorted(kept, reverse=True) and kept[-1] > 0
  assert kept[0] > 2 * kept[-1]
  for row in rows:
    assert row["total_gib"] == pytest.approx(
      row["fixed_gib"] + 4 * row["kept_mib_per_clip"] / 1024
    )
  assert "save_attention" in capsys.readouterr().out
