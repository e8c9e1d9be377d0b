"""Training curves from metrics.jsonl: last line per step wins, PNGs written."""

import json
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from vidjax.report import plot  # noqa: E402  (after the importorskip)


def _write_metrics(workdir, rows, tail=""):
  workdir.mkdir(parents=True, exist_ok=True)
  with open(workdir / "metrics.jsonl", "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows) + tail)


def _resumed_run(workdir):
  """60 steps logged, killed after step 45, resumed from the step-40 save."""
  rows = []
  for step in list(range(1, 46)) + list(range(41, 61)):
    resumed = len(rows) >= 45
    rows.append(
      {
        "step": step,
        "train/loss": (2.0 if resumed else 3.0) / step,
        "train/lr": 1e-3 * min(step / 10, 1.0),
        "perf/clips_per_s": 100.0 + step,
        "perf/data_wait_frac": 0.1,
        "data/skipped": 0,
      }
    )
    if step % 20 == 0:
      rows.append(
        {
          "step": step,
          "eval/t2v_r1": step / 100,
          "eval/v2t_r1": 0.1,
          "eval/chance_r1": 0.02,
          "eval/skipped": 0,
        }
      )
  _write_metrics(workdir, rows, tail='{"step": 61, "train/lo')  # torn line


def test_load_metrics_keeps_the_last_line_per_step(tmp_path):
  _resumed_run(tmp_path)
  metrics = plot.load_metrics(tmp_path)
  steps, loss = metrics["train/loss"]
  np.testing.assert_array_equal(steps, np.arange(1, 61))
  np.testing.assert_allclose(loss[:40], 3.0 / steps[:40])
  np.testing.assert_allclose(loss[40:], 2.0 / steps[40:])  # the resumed run's
  eval_steps, r1 = metrics["eval/t2v_r1"]
  np.testing.assert_array_equal(eval_steps, [20, 40, 60])
  np.testing.assert_allclose(r1, [0.2, 0.4, 0.6])


def test_load_metrics_drops_non_finite_and_strings(tmp_path):
  _write_metrics(
    tmp_path,
    [
      {"step": 1, "train/loss": 1.0, "note": "text", "flag": True},
      {"step": 2, "train/loss": None},  # NaN is logged as null
      {"step": 3, "train/loss": 0.5},
    ],
  )
  metrics = plot.load_metrics(tmp_path)
  assert set(metrics) == {"train/loss"}
  np.testing.assert_array_equal(metrics["train/loss"][0], [1, 3])


def test_load_metrics_names_a_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
    plot.load_metrics(tmp_path / "nowhere")


def test_plot_run_writes_pngs(tmp_path):
  _resumed_run(tmp_path)
  paths = plot.plot_run(tmp_path)
  assert sorted(p.name for p in paths) == [
    "eval.png",
    "loss.png",
    "lr.png",
    "throughput.png",
  ]
  for path in paths:
    assert path.parent == tmp_path / "plots"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5000  # has content, not a blank canvas


def test_plot_run_skips_figures_without_metrics(tmp_path):
  _write_metrics(
    tmp_path, [{"step": s, "train/loss": 1.0 / s} for s in range(1, 5)]
  )
  assert [p.name for p in plot.plot_run(tmp_path)] == ["loss.png"]


def test_moving_average_is_trailing():
  np.testing.assert_allclose(
    plot.moving_average(np.array([1.0, 3, 5, 7]), 2), [1, 2, 4, 6]
  )


def test_cli(tmp_path, capsys):
  _resumed_run(tmp_path)
  assert plot.main([str(tmp_path)]) == 0
  printed = capsys.readouterr().out.split()
  assert str(tmp_path / "plots" / "loss.png") in printed


def test_fractions_on_a_0_to_1_axis(tmp_path):
  # Two evaluations that differ by noise: a recall axis stays 0-1.
  _write_metrics(
    tmp_path,
    [
      {
        "step": 100,
        "eval/t2v_r5": 0.52,
        "eval/mAP_avg": 0.3,
        "eval/top1": 0.4,
        "eval/loss": 0.8,
        "eval/chance_r5": 0.1,
      },
      {
        "step": 200,
        "eval/t2v_r5": 0.53,
        "eval/mAP_avg": 0.31,
        "eval/top1": 0.41,
        "eval/loss": 0.7,
        "eval/chance_r5": 0.1,
      },
    ],
  )
  fig = plot.eval_figure(plot.load_metrics(tmp_path))
  limits = {
    ax.get_title(): ax.get_ylim() for ax in fig.axes if ax.get_visible()
  }
  for name in ("eval/t2v_r5", "eval/mAP_avg", "eval/top1"):
    assert limits[name] == (0, 1.02), name
  low, high = limits["eval/loss"]  # Not a fraction: fitted to the values.
  assert 0.6 < low and high < 0.9


def test_cli_refusals_in_a_line(tmp_path, capsys, monkeypatch):
  # Not a run: exit 2, a line and a hint.
  assert plot.main([str(tmp_path)]) == 2
  assert "has no metrics.jsonl" in capsys.readouterr().err
  # Without matplotlib (the [plots] extra): --help works, a run is refused.
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  with pytest.raises(SystemExit) as helped:
    plot.main(["--help"])
  assert helped.value.code == 0
  _resumed_run(tmp_path)
  assert plot.main([str(tmp_path)]) == 2
  assert "pip install 'vidjax[plots]'" in capsys.readouterr().err
