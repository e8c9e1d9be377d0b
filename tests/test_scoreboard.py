"""The field's benchmarks end to end from the command line (`--mode eval`),
on the synthetic corpus's files in their released layouts: zero-shot EGTEA
beats chance with the demo's reference pretraining, EgoMCQ, Charades-Ego
and EK-100 CLS score; mistakes in the files stop it before anything is
written. (As evaluation sets during training: test_configs.py's
clip_vitb16_ego4d:debug run.)"""

import csv
import json
import math
import re

import pytest

import debug_runs
from vidjax import errors, main, monitor

# The demo's reference run (its model) is made in this group's process.
pytestmark = pytest.mark.xdist_group("demo_reference")

PRETRAINING = "configs/clip_vitb16_ego4d.py:debug"


def _command(corpus, **files):
  """--config overrides: EGTEA's training split zero-shot as the main set
  (the clips the model learned), each benchmark set on its files."""
  root = f"{corpus}/chunks"
  out = [
    f"--config.data.root={root}",
    f"--config.data.vocab={corpus}/vocab.txt.gz",
    "--config.data.format=egtea",
    f"--config.data.eval_annotations={files.get('egtea', corpus / 'egtea/train_split1.txt')}",
    "--config.eval.kind=zeroshot",
    "--config.eval.views=max",  # LaViLa's zero-shot EGTEA protocol.
    "--config.data.eval_clips=2",
  ]
  sets = {
    "egomcq": files.get("egomcq", corpus / "egomcq.json"),
    "charades_ego": corpus / "charades_ego/CharadesEgo_v1_test_only1st.csv",
    "ek100_cls": corpus / "ek100_val.csv",
  }
  for name, path in sets.items():
    out += [
      f"--config.eval.sets.{name}.data.root={root}",
      f"--config.eval.sets.{name}.data.eval_annotations={path}",
    ]
  return out + [
    f"--config.eval.sets.ek100_cls.data.train_annotations={corpus}/ek100_train.csv"
  ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return debug_runs.demo_reference(tmp_path_factory)


@pytest.fixture(scope="module")
def scores(reference, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("scoreboard")
  main.run(
    PRETRAINING,
    str(workdir),
    "eval",
    [f"--config.init_from={reference}"] + _command(reference / "synthetic"),
  )
  return monitor.read_metrics(workdir)[-1], reference / "synthetic"


def test_zero_shot_egtea_beats_chance(scores):
  final, _ = scores
  # 12 clips of 48 classes: chance is 1/48.
  assert final["eval/chance_top1"] == pytest.approx(1 / 48)
  assert final["eval/top1"] >= 5 * final["eval/chance_top1"], final
  assert final["eval/mean_class_acc"] > 0 and final["eval/skipped"] == 0


def test_every_benchmark_scores(scores):
  final, corpus = scores
  assert final["eval/egomcq/chance_acc"] == 0.2
  assert final["eval/egomcq/questions_left_out"] == 0
  for group in ("inter_video", "intra_video"):
    assert 0 <= final[f"eval/egomcq/{group}"] <= 1
  # Charades-Ego: the 48 classes, of which the test videos have a few.
  test = corpus / "charades_ego/CharadesEgo_v1_test_only1st.csv"
  rows = list(csv.DictReader(test.open()))
  codes = {a.split()[0] for row in rows for a in row["actions"].split(";")}
  assert final["eval/charades_ego/classes_left_out"] == 48 - len(codes)
  assert 0 < final["eval/charades_ego/mAP"] <= 1
  assert final["eval/charades_ego/chance_mAP"] < 1
  assert math.isfinite(final["eval/ek100_cls/top1"])
  assert final["eval/ek100_cls/chance_top1"] == pytest.approx(1 / 14)


def _refused(reference, tmp_path, **files):
  """The message of the DataFileError of `--mode eval` on changed files
  (refused before the workdir is written), and their paths."""
  corpus, paths = reference / "synthetic", {}
  (tmp_path / "action_idx.txt").write_text(
    (corpus / "egtea/action_idx.txt").read_text()
  )  # EGTEA's classes beside its split files, as released.
  for name, (source, change) in files.items():
    paths[name] = tmp_path / source.split("/")[-1]
    paths[name].write_text(change((corpus / source).read_text()))
  workdir = tmp_path / "run"
  with pytest.raises(errors.DataFileError) as e:
    main.run(
      PRETRAINING,
      str(workdir),
      "eval",
      [f"--config.init_from={reference}"] + _command(corpus, **paths),
    )
  assert not workdir.exists()
  return e.value.describe(), paths


def _unknown_uid(text):
  items = json.loads(text)
  items["1"]["choices"]["3"]["video_uid"] = "vid999"
  return json.dumps(items)


def test_an_egomcq_uid_without_chunks_is_refused(reference, tmp_path):
  message, paths = _refused(
    reference, tmp_path, egomcq=("egomcq.json", _unknown_uid)
  )
  assert str(paths["egomcq"]) in message
  assert 'question "1" choice "3": video_uid \'vid999\'' in message
  assert "no chunks" in message and "python -m vidjax.data.chunk" in message


def test_egteas_classes_file_missing_is_refused(reference, tmp_path):
  split = tmp_path / "elsewhere" / "test_split1.txt"
  split.parent.mkdir()
  split.write_text("P01-R00-Synthetic-0-2000-F000000-F000016 3 1 1\n")
  config = [f"--config.init_from={reference}"] + _command(
    reference / "synthetic", egtea=split
  )
  with pytest.raises(errors.DataFileError) as e:
    main.run(PRETRAINING, str(tmp_path / "run"), "eval", config)
  assert f"{split.parent}/action_idx.txt: no such file" in e.value.describe()
  assert "set data.classes" in e.value.describe()


def test_an_egtea_action_out_of_range_is_refused(reference, tmp_path):
  message, paths = _refused(
    reference,
    tmp_path,
    egtea=(
      "egtea/train_split1.txt",
      lambda text: re.sub(r"^(\S+) \d+", r"\1 99", text, count=1),
    ),
  )
  assert f"{paths['egtea']}:1: action 99 is not in" in message
  assert "(ids 1-48); fix the row" in message
