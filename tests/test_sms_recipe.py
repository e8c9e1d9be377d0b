"""`configs/ek100_mir_ft.py:sms`: SMS on the training matrix's relevancy of
every in-batch pair, computed from the classes (`ek100_classes`)."""

import numpy as np
import pytest

import debug_runs
from vidjax import train
from vidjax.base import errors
from vidjax.data.annotations import ek100, ek100_classes
from vidjax.report import monitor

SMS = "ek100_mir_ft:sms"
# The :debug corpus, made once in the group's process.
pytestmark = pytest.mark.xdist_group("debug_runs")


def _losses(workdir):
  return [
    r["train/loss"] for r in monitor.read_metrics(workdir) if "train/loss" in r
  ]


def test_the_class_formula_is_the_corpus_matrix_and_refuses_another(
  tmp_path_factory,
):
  """The classes of the released layouts give the corpus's train matrix
  entry for entry (the check every relevancy-aware run makes at start-up);
  a matrix one entry off is refused, naming the entry."""
  config = debug_runs.load(SMS)
  workdir = debug_runs.prepare(
    config, tmp_path_factory.mktemp("corpus_files"), tmp_path_factory
  )
  root = workdir / "synthetic"
  files = (
    root / "ek100_retrieval_train.csv",
    root / "ek100_retrieval_train_sentence.csv",
  )
  path = root / "caption_relevancy_ek100_retrieval_train.pkl"
  matrix = ek100.load_relevancy(path, allow_pickle=True)
  classes = ek100_classes.PairClasses.load(*files, max_nouns=16)
  formula = ek100_classes.class_relevancy(
    classes.verb, classes.nouns, classes.caption_verb, classes.caption_nouns
  )
  np.testing.assert_allclose(formula, matrix, atol=ek100_classes.TOLERANCE)
  assert {0.0, 0.5, 1.0} <= set(np.unique(matrix))
  ek100_classes.check_matrix(matrix, path, classes, *files)
  off = matrix.copy()
  off[3, 5] += 0.25
  with pytest.raises(errors.DataFileError, match=r"entry \(3, 5\)"):
    ek100_classes.check_matrix(off, path, classes, *files)
  with pytest.raises(errors.DataFileError, match="data.max_nouns=0"):
    ek100_classes.PairClasses.load(*files, max_nouns=0)


def test_sms_debug_trains_and_resumes_exactly_across_sigterm(
  tmp_path, tmp_path_factory, monkeypatch
):
  uninterrupted, metrics = debug_runs.run(tmp_path_factory, SMS)
  expected = _losses(uninterrupted)
  assert len(expected) == 2 and all(np.isfinite(expected))
  assert expected[0] > 0  # SMS's terms: pairs of 0, 0.5 and 1 relevancy.
  assert "eval/mAP_avg" in metrics

  workdir = debug_runs.preempted(
    monkeypatch, tmp_path_factory, tmp_path / "run", SMS
  )
  train.train_and_evaluate(debug_runs.load(SMS), workdir)
  assert _losses(workdir) == expected
