"""What a person reads: tables, summaries, log file, a console that went away."""

import logging
import os
from pathlib import Path
import subprocess
import sys
import types

import pytest

import limits
import vidjax
from vidjax.base import internals, rundir
from vidjax.report import console


def test_eval_table_short_and_ordered():
  table = console.eval_table(
    300,
    {
      "eval/t2v_r10": 0.75,
      "eval/chance_r1": 1 / 48,
      "eval/t2v_r1": 0.1875,
      "eval/skipped": 0,
      "eval/t2v_r5": 0.5,
      "eval/v2t_r1": 0.125,
    },
  )
  assert table.splitlines() == [
    "eval at step 300:",
    "  t2v_r1    0.1875 | t2v_r5    0.5000 | t2v_r10   0.7500",
    "  v2t_r1    0.1250 | skipped        0 | chance_r1 0.0208",
  ]


def test_run_summary_and_estimate():
  devices = [types.SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3")] * 8
  text = console.run_summary(
    devices=devices,
    batch_size=512,
    accum_steps=2,
    num_params=86_570_000,
    clips={"train": 67_217, "eval": 9_668},
    total_steps=13_100,
    first_step=500,
    start="resuming at step 500",
  )
  assert text.splitlines() == [
    "8 devices (NVIDIA H100 80GB HBM3); batch 512 = 32 per device x 2 "
    "accumulation steps; 86.57M parameters, resuming at step 500",
    "  data: 67217 train clips, 9668 eval clips; 131 steps per epoch, 13100 "
    "steps = 99.8 epochs",
    "  steps 500 -> 13100: time estimated after the first steps",
  ]
  assert console.time_estimate(100, 10_000, 0.37) == (
    "about 1h 01m to step 10000 (0.37 s/step)"
  )
  assert console.duration(95) == "1m 35s" and console.duration(4.2) == "4s"


def test_data_bound_warning_names_the_knobs():
  data = types.SimpleNamespace(workers=0, threads=2, num_frames=16)
  text = console.data_bound_warning(0.87, data)
  assert text.startswith("the run is data-bound: 87% of the time")
  for knob in (
    "--config.data.workers, now 0",
    "--config.data.threads, now 2",
    "fewer frames (--config.data.num_frames, now 16)",
    "--short-side",
    "benchmarks.pipeline",
  ):
    assert knob in text
  # At 4 frames (AVION's fewest) it does not suggest fewer.
  text = console.data_bound_warning(
    0.87, types.SimpleNamespace(**dict(vars(data), num_frames=4))
  )
  assert "num_frames" not in text and "--short-side" in text


def test_lines_before_the_log_file_are_kept(tmp_path, monkeypatch):
  handler = console._LogFile()
  logger = logging.getLogger("vidjax-test-log-file")
  logger.addHandler(handler)
  try:
    logger.warning("before")
    handler.open(str(tmp_path / rundir.LOG_FILE))
    logger.warning("after")
  finally:
    logger.removeHandler(handler)
  lines = (tmp_path / rundir.LOG_FILE).read_text().splitlines()
  assert [line.split("] ")[-1] for line in lines] == ["before", "after"]
  assert " WARNING test_console.py:" in lines[0]


def test_console_shows_vidjax_info_and_other_libraries_warnings():
  keep = console._OnlyOurInfo().filter
  record = lambda path, level=logging.INFO, msg="m": logging.LogRecord(
    "absl", level, path, 1, msg, None, None
  )
  ours = os.path.join(os.path.dirname(console.__file__), "data", "pipeline.py")
  # A library installed inside a checkout that is itself named vidjax.
  theirs = os.path.join(
    os.sep,
    "home",
    "me",
    "vidjax",
    ".venv",
    "lib",
    "site-packages",
    "orbax",
    "checkpoint",
    "manager.py",
  )
  assert keep(record(ours))
  assert not keep(record(theirs))
  assert keep(record(theirs, logging.WARNING))
  assert not keep(
    record(theirs, logging.WARNING, internals._ORBAX_READ_ONLY_WARNINGS[0])
  )


def test_a_library_that_logged_before_the_set_up_is_not_printed_twice():
  # absl's first log with no handler set up calls logging.basicConfig(),
  # whose handler would print each later line again (Orbax logs at import).
  code = (
    "from absl import logging\n"
    "from vidjax.report import console\n"
    "logging.warning('before')\n"
    "console.setup_console()\n"
    "logging.warning('after')\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    timeout=limits.HANG_S,
    check=True,
  ).stderr.splitlines()
  assert out[0] == "WARNING:absl:before"
  assert len(out) == 2 and out[1].endswith(" warning: after"), out


def test_console_that_went_away_is_harmless(tmp_path):
  # A child whose stdout and stderr are a pipe nobody reads any more: every
  # write fails with EPIPE, yet it logs, prints, draws a bar and exits 0.
  code = (
    "import logging, sys, tqdm\n"
    "from vidjax.report import console\n"
    "console.setup_console()\n"
    "for i in tqdm.tqdm(range(3), file=sys.stderr, mininterval=0):\n"
    "  logging.getLogger('x').warning('line %d', i)\n"
    "  print('out', i, flush=True)\n"
    "open(sys.argv[1], 'w').write('finished')\n"
  )
  done = tmp_path / "done"
  proc = subprocess.Popen(
    [sys.executable, "-c", code, str(done)],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
  )
  proc.stdout.close()
  assert limits.wait(proc) == 0
  assert done.read_text() == "finished"


def test_progress_bar_moves_to_step(capsys):
  bar = console.ProgressBar(10, start_step=2, enabled=True)
  bar.update(5, {"train/loss": 0.5, "eval/name": "x"})
  assert bar._bar.n == 5
  bar.close()


def test_classification_table_has_the_chance_level_and_top5_past_5_classes():
  import ml_collections
  import numpy as np

  from vidjax.tasks import classification

  config = ml_collections.ConfigDict({"data": {"format": "jsonl"}})
  for classes, labels in ((2, [0, 1, 1, 0]), (8, [0, 7, 3, 3])):
    # Scores fall with the distance to the predicted classes 0, 1, 1, 1.
    logits = -((np.arange(classes) - np.array([[0], [1], [1], [1]])) ** 2) - (
      0.01 * np.arange(classes)
    )
    metrics = classification.eval_metrics(
      dict(
        logits=logits,
        label=np.array(labels),
        index=np.arange(4),
        valid=np.ones(4, bool),
      ),
      config,
    )
    table = console.eval_table(10, {f"eval/{k}": v for k, v in metrics.items()})
    if classes == 2:  # Top-5 of 2 classes is always 1: not shown.
      assert table.splitlines()[1] == (
        "  mean_class_acc 0.7500 | top1           "
        "0.7500 | chance_top1    0.5000"
      )
    else:
      assert table.splitlines()[1:] == [
        "  mean_class_acc 0.2500 | top1           0.2500 | top5           0.7500",
        "  chance_top1    0.1250",
      ]


def test_a_torn_last_line_of_the_log_file_is_dropped(tmp_path, caplog):
  log_txt = tmp_path / rundir.LOG_FILE
  log_txt.write_text("12:00 first run\n12:01 the line being writ")
  handler = console._LogFile()
  logger = logging.getLogger("vidjax-test-torn-log")
  logger.addHandler(handler)
  try:
    handler.open(str(log_txt))
    logger.warning("resumed")
  finally:
    logger.removeHandler(handler)
  lines = log_txt.read_text().splitlines()
  assert lines[0] == "12:00 first run" and lines[-1].endswith("] resumed")
  assert "ended in a torn line" in caplog.text


def test_ctrl_c_twice_leaves_its_error_as_the_last_line(capsys, monkeypatch):
  # The error goes through tqdm.write, which draws an open bar again under
  # it; `train` closes the bar first (an abort hook).
  from vidjax.base import stopping

  def exit_now(code):
    raise SystemExit(code)

  monkeypatch.setattr(stopping.os, "_exit", exit_now)
  handler = console._ConsoleHandler(sys.stderr)
  logging.getLogger().addHandler(handler)
  bar = console.ProgressBar(10, enabled=True)
  try:
    bar.update(3)
    with stopping.on_abort(bar.close), pytest.raises(SystemExit):
      stopping.Signals(None)._abort()
  finally:
    logging.getLogger().removeHandler(handler)
    bar.close()
  err = capsys.readouterr().err
  assert "3/10" in err  # The bar was drawn, and left above the error.
  assert err.endswith("error: stopped at once by Ctrl-C (pressed again)\n")


def test_vidjax_info_lines_are_kept_from_every_folder_others_from_warning():
  keep = console._OnlyOurInfo()

  def record(path, level=logging.INFO):
    return logging.LogRecord("absl", level, path, 1, "a line", None, None)

  package = Path(vidjax.__file__).parent
  for module in ("train.py", "data/pipeline.py", "report/console.py"):
    assert keep.filter(record(str(package / module))), module
  library = "/site-packages/grain/_src/python/data_loader.py"
  assert not keep.filter(record(library))
  assert keep.filter(record(library, logging.WARNING))
