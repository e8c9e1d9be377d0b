"""The memory benchmark: what the real step keeps, per remat policy."""
import pytest

from vidjax.bench import memory


def test_kept_memory_falls_as_the_policy_keeps_less(capsys):
  rows = memory.main(["--config", "configs/clip_vitb16_ego4d.py:debug",
                      "--batch-per-device", "4", "--remat",
                      "none,save_attention,full"])
  kept = [row["kept_mib_per_clip"] for row in rows]
  assert kept == sorted(kept, reverse=True) and kept[-1] > 0
  assert kept[0] > 2 * kept[-1]
  for row in rows:
    assert row["total_gib"] == pytest.approx(
        row["fixed_gib"] + 4 * row["kept_mib_per_clip"] / 1024)
  assert "save_attention" in capsys.readouterr().out
