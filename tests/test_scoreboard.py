"""The field's benchmarks from the command line (`--mode eval`) on the
synthetic corpus's files in their released layouts: zero-shot EGTEA beats
chance with the demo's reference pretraining; mistakes in the files stop
the evaluation before anything is written. (EgoMCQ, Charades-Ego and EK-100
CLS as evaluation sets during training and again with `--mode eval`:
test_configs.py's and test_handoff.py's clip_vitb16_ego4d:debug runs.)"""

import json
import re

import pytest

import debug_runs
from vidjax import main
from vidjax.base import errors
from vidjax.config import defaults
from vidjax.evaluation import eval_sets
from vidjax.report import monitor

# The demo's reference run (its model, its compiled evaluation step) is
# made in this group's process.
pytestmark = pytest.mark.xdist_group("demo_reference")

DEMO = "configs/demo.py:debug"


def _command(reference, data_format, path, kind="zeroshot"):
  """`--mode eval` overrides: one benchmark file as the evaluation set."""
  corpus = reference / "synthetic"
  return [
    f"--config.init_from={reference}",
    f"--config.data.root={corpus}/chunks",
    f"--config.data.vocab={corpus}/vocab.txt.gz",
    f"--config.data.format={data_format}",
    f"--config.data.eval_annotations={path}",
    f"--config.eval.kind={kind}",
  ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return debug_runs.demo_reference(tmp_path_factory)


def test_zero_shot_egtea_beats_chance(reference, tmp_path):
  """EGTEA's layout on the clips the model learned: its 12 training clips,
  48 classes (chance 1/48), LaViLa's protocol of the max over views."""
  split = reference / "synthetic/egtea/train_split1.txt"
  command = _command(reference, "egtea", split) + [
    "--config.eval.views=max",
    "--config.data.eval_clips=2",
  ]
  main.run(DEMO, str(tmp_path), "eval", command)
  final = monitor.read_metrics(tmp_path)[-1]
  assert final["eval/chance_top1"] == pytest.approx(1 / 48)
  assert final["eval/top1"] >= 5 * final["eval/chance_top1"], final
  assert final["eval/top5"] >= final["eval/top1"]
  assert final["eval/mean_class_acc"] > 0 and final["eval/skipped"] == 0


def _refused(reference, tmp_path, data_format, source, change, kind):
  """The message of the DataFileError of `--mode eval` on a changed copy
  of a corpus file (refused before the workdir is written), and the copy."""
  corpus = reference / "synthetic"
  (tmp_path / "action_idx.txt").write_text(
    (corpus / "egtea/action_idx.txt").read_text()
  )  # EGTEA's classes beside its split files, as released.
  path = tmp_path / source.split("/")[-1]
  path.write_text(change((corpus / source).read_text()))
  workdir = tmp_path / "run"
  with pytest.raises(errors.DataFileError) as e:
    main.run(
      DEMO, str(workdir), "eval", _command(reference, data_format, path, kind)
    )
  assert not workdir.exists()
  return e.value.describe(), path


def _unknown_uid(text):
  items = json.loads(text)
  items["1"]["choices"]["3"]["video_uid"] = "vid999"
  return json.dumps(items)


def test_an_egomcq_uid_without_chunks_is_refused(reference, tmp_path):
  message, path = _refused(
    reference, tmp_path, "egomcq", "egomcq.json", _unknown_uid, "egomcq"
  )
  assert str(path) in message
  assert 'question "1" choice "3": video_uid \'vid999\'' in message
  assert "no chunks" in message and "python -m vidjax.data.chunk" in message


def test_egteas_classes_file_missing_is_refused(reference, tmp_path):
  split = tmp_path / "elsewhere" / "test_split1.txt"
  split.parent.mkdir()
  split.write_text("P01-R00-Synthetic-0-2000-F000000-F000016 3 1 1\n")
  with pytest.raises(errors.DataFileError) as e:
    main.run(
      DEMO, str(tmp_path / "run"), "eval", _command(reference, "egtea", split)
    )
  assert f"{split.parent}/action_idx.txt: no such file" in e.value.describe()
  assert "set data.classes" in e.value.describe()


def test_an_egtea_action_out_of_range_is_refused(reference, tmp_path):
  message, path = _refused(
    reference,
    tmp_path,
    "egtea",
    "egtea/train_split1.txt",
    lambda text: re.sub(r"^(\S+) \d+", r"\1 99", text, count=1),
    "zeroshot",
  )
  assert f"{path}:1: action 99 is not in" in message
  assert "(ids 1-48); fix the row" in message


@pytest.mark.parametrize(
  "task, data_format, name, problem",
  [
    (
      "contrastive",
      "ek100_cls",
      "ek100_cls",
      "data.train_annotations is unset",
    ),
    ("contrastive", "jsonl", "", "scores data.format egtea or charades_ego"),
    ("classification", "egtea", "", "needs a video-text model"),
  ],
)
def test_a_set_that_cannot_be_scored_is_refused(
  task, data_format, name, problem
):
  """Before any file is read: a zero-shot set whose classes cannot be
  made, a kind on a format it does not score, a model without text."""
  config = defaults.base_config(task)
  if name:
    config.eval.sets[name] = defaults.benchmark_set(name)
    config.eval.sets[name].data.eval_annotations = "EPIC_100_validation.csv"
  else:
    config.data.update(format=data_format, eval_annotations="test.txt")
    config.eval.kind = "zeroshot"
  with pytest.raises(errors.ConfigError, match=problem):
    eval_sets.check_files(config)
