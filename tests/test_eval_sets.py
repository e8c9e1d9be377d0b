"""Evaluation sets and EK-100 MIR on clips x captions, as `--mode eval` runs
them on the released layouts (built from the synthetic corpus)."""

import csv
from pathlib import Path
import pickle

import ml_collections
import numpy as np
import pytest

import debug_runs
from test_metrics import _ndcg_loop, _official_ap_loop
from vidjax import config as config_lib, startup, train
from vidjax.base import errors
from vidjax.data.annotations import ek100
from vidjax.data.annotations.records import ClipRecord
from vidjax.evaluation import eval_sets
from vidjax.report import monitor
from vidjax.tasks import classification, contrastive, metrics as metrics_lib

# The :debug runs are made once per test process (debug_runs.py): keep the
# tests that share them in one process when tests run in parallel.
pytestmark = pytest.mark.xdist_group("debug_runs")

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_sets_names_prefixes_and_files():
  config = config_lib.load_config(
    str(CONFIGS / "clip_vitb16_ego4d.py"),
    ["--config.data.eval_annotations=/d/ego4d_val.jsonl"],
  )
  (main,) = eval_sets.eval_sets(config)  # ek100_mir: its files are unset.
  assert (main.name, main.prefix, main.config) == ("", "eval/", config)
  keys = eval_sets.required_paths(config, needs_text=True)
  assert keys == [
    "data.root",
    "data.train_annotations",
    "data.vocab",
    "data.eval_annotations",
  ]
  with config.unlocked():
    config.eval.sets.ek100_mir.data.update(
      root="/d/ek", eval_annotations="/d/t.csv"
    )
    config.eval.sets.ek100_mir.update(
      relevancy="/d/r.pkl", sentences="/d/s.csv"
    )
  main, mir = eval_sets.eval_sets(config)
  assert (mir.name, mir.prefix) == ("ek100_mir", "eval/ek100_mir/")
  data, evaluation = mir.config.data, mir.config.eval
  assert (data.format, data.root, data.eval_annotations) == (
    "ek100_mir",
    "/d/ek",
    "/d/t.csv",
  )
  assert (evaluation.relevancy, evaluation.sentences) == (
    "/d/r.pkl",
    "/d/s.csv",
  )
  assert (
    data.num_frames == config.data.num_frames and not evaluation.sets
  )  # The run's.
  assert (
    config.data.format == "ego4d" and config.eval.relevancy == ""
  )  # Unchanged.
  assert eval_sets.required_paths(config, needs_text=True)[4:] == [
    "eval.sets.ek100_mir.data.root",
    "eval.sets.ek100_mir.data.eval_annotations",
    "eval.sets.ek100_mir.relevancy",
    "eval.sets.ek100_mir.sentences",
  ]
  with config.unlocked():
    config.data.eval_annotations = ""  # Only the named set then.
    config.eval.sets.ek100_mir.data.nonsense = 1
  with pytest.raises(
    ValueError,
    match=r"eval.sets.ek100_mir.data: unknown data keys \['nonsense'\]",
  ):
    eval_sets.eval_sets(config)
  with config.unlocked():
    del config.eval.sets.ek100_mir.data["nonsense"]
    config.data.root = "/d/chunks"
    config.eval.sets.ek100_mir.data.root = ""  # The run's chunks, then.
  (mir,) = eval_sets.eval_sets(config)
  assert (mir.name, mir.config.data.root) == ("ek100_mir", "/d/chunks")


def test_action_ids_need_the_training_csv_also_to_evaluate(tmp_path):
  """EK-100 action ids number the training and validation CSVs' pairs."""
  config = config_lib.load_config(
    str(CONFIGS / "ek100_cls_ft.py"),
    [
      f"--config.data.root={tmp_path}",
      f"--config.data.eval_annotations={tmp_path / 'EPIC_100_validation.csv'}",
    ],
  )
  with pytest.raises(
    errors.ConfigError,
    match=r"^data.train_annotations is "
    r"unset: with data.format='ek100_cls' and data.label="
    r"'action', the action ids",
  ):
    train.setup(config, tmp_path / "run", splits=("eval",))
  assert not (tmp_path / "run").exists()


def test_the_first_evaluation_compiles_the_eval_step_once_per_shape(
  tmp_path_factory,
):
  # The :debug pretraining evaluates two sets of one shape: its held-out
  # clips and zero-shot EK-100 MIR, whose rows also carry verb and noun
  # classes that a video-text task does not read.
  _, metrics = debug_runs.run(tmp_path_factory, "clip_vitb16_ego4d")
  assert {"eval/t2v_r1", "eval/ek100_mir/mAP_avg"} <= set(metrics)
  compiles = debug_runs.compiles(tmp_path_factory, "clip_vitb16_ego4d")
  assert compiles["jit(eval_step)"] == 1, compiles
  assert compiles["jit(train_step)"] == 1, compiles


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
  """`ek100_mir_ft.py:debug --mode eval` with saved embeddings: zero-shot
  retrieval of the `:debug` pretraining."""
  pretrained, _ = debug_runs.run(tmp_path_factory, "clip_vitb16_ego4d")
  config = debug_runs.load(
    "ek100_mir_ft",
    "--config.eval.save_embeddings=True",
    f"--config.init_from={pretrained}",
  )
  workdir = debug_runs.prepare(
    config, tmp_path_factory.mktemp("mir_eval"), tmp_path_factory
  )
  metrics = train.evaluate_only(config, workdir)
  # The config as the evaluation settled it (changeable: tests vary it).
  plan = startup.resolve(config, workdir, splits=("eval",))
  plan.close()
  return config_lib.copy(plan.config), workdir, metrics


def _rows(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_mir_eval_on_clips_x_captions_matches_the_saved_embeddings(evaluated):
  config, workdir, metrics = evaluated
  root = workdir / "synthetic"
  clips = _rows(root / "ek100_retrieval_val.csv")
  captions = _rows(root / "ek100_retrieval_val_sentence.csv")
  assert list(captions[0]) == [
    "narration_id",
    "narration",
  ]  # The test file's columns.
  relevancy = ek100.load_relevancy(config.eval.relevancy, allow_pickle=True)
  assert config.eval.relevancy.endswith(".pkl")
  assert len(captions) < len(clips) and relevancy.shape == (
    len(clips),
    len(captions),
  )
  # Captions in an order of their own, not the clips'.
  first = {}
  for c in clips:
    first.setdefault(c["narration"], c["narration_id"])
  assert [c["narration_id"] for c in captions] != list(first.values())

  saved = np.load(workdir / "embeddings" / "step_0.npz")
  video, text = saved["video"], saved["text"]
  assert video.dtype == text.dtype == np.float32
  assert video.shape == (len(clips), 64) and text.shape == (len(captions), 64)
  np.testing.assert_allclose(np.linalg.norm(video, axis=1), 1, atol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(text, axis=1), 1, atol=1e-6)
  assert list(saved["video_ids"]) == [c["narration_id"] for c in clips]
  assert list(saved["text_ids"]) == [c["narration_id"] for c in captions]

  # EK-100's definitions, query by query, on the saved embeddings.
  sim = video.astype(np.float64) @ text.astype(np.float64).T
  for name, s, r in (("v2t", sim, relevancy), ("t2v", sim.T, relevancy.T)):
    ap = np.mean([_official_ap_loop(s[i], r[i]) for i in range(len(s))])
    ndcg = np.mean([_ndcg_loop(s[i], r[i]) for i in range(len(s))])
    assert metrics[f"eval/mAP_{name}"] == pytest.approx(ap, abs=1e-9)
    assert metrics[f"eval/nDCG_{name}"] == pytest.approx(ndcg, abs=1e-9)
  logged = [r for r in monitor.read_metrics(workdir) if "eval/mAP_avg" in r][-1]
  assert logged["step"] == 0 and logged["eval/mAP_avg"] == pytest.approx(
    metrics["eval/mAP_avg"]
  )
  assert metrics["eval/chance_r1"] == pytest.approx(
    1 / len(clips)
  )  # Recall: clips x own narrations.


def test_mismatched_files_stop_at_start_naming_both(evaluated, tmp_path):
  config, workdir, _ = evaluated
  root = workdir / "synthetic"
  with config.unlocked():  # The training captions with the test relevancy.
    config.eval.sentences = str(root / "ek100_retrieval_train_sentence.csv")
  with pytest.raises(
    ValueError,
    match=r"caption_relevancy_ek100_retrieval_val.pkl is 8 x 4 but "
    r".*ek100_retrieval_val.csv has 8 clips and "
    r".*ek100_retrieval_train_sentence.csv has \d+ captions",
  ):
    eval_sets.check_files(config)
  with config.unlocked():
    config.eval.sentences = ""  # A clips x captions matrix needs its captions.
  with pytest.raises(
    ValueError, match="without a sentence file it must be 8 x 8"
  ):
    eval_sets.check_files(config)
  with config.unlocked():
    config.data.allow_pickle = False
  with pytest.raises(ValueError, match="allow_pickle"):
    eval_sets.check_files(config)


def test_retrieval_metrics_from_views_square_and_captions(tmp_path):
  """Views averaged per clip, unreadable views left out; without a sentence
  file the relevancy is clips x clips, with one it is clips x captions."""
  rng = np.random.default_rng(0)
  clips, views, captions, d = 6, 2, 4, 8
  video = rng.normal(size=(clips, views, d))
  text = rng.normal(size=(clips, d))
  index = np.repeat(np.arange(clips), views)
  valid = np.ones(clips * views, bool)
  valid[[4, 5]] = False  # Clip 2 could not be read at all.
  outputs = {
    "video_emb": video.reshape(-1, d),
    "index": index,
    "valid": valid,
    "text_emb": np.repeat(text, views, axis=0),
    "view": index * 0,
  }
  square = rng.uniform(size=(clips, clips)).round(1)
  np.save(tmp_path / "square.npy", square)
  config = ml_collections.ConfigDict(
    dict(
      data=dict(allow_pickle=False, eval_annotations="clips.csv"),
      eval=dict(relevancy=str(tmp_path / "square.npy"), sentences=""),
    )
  )
  kept = np.array([0, 1, 3, 4, 5])

  def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)

  mean_video = unit(unit(video).mean(1))[kept]
  got = contrastive.eval_metrics(outputs, config)
  want = metrics_lib.ek100_mir_metrics(
    mean_video @ unit(text[kept]).T, square[np.ix_(kept, kept)]
  )
  for key, value in want.items():
    assert got[key] == pytest.approx(value, abs=1e-6), key
  assert got["chance_r1"] == pytest.approx(1 / 5)
  # Clips x captions: every caption embedded once, in the sentence file's order.
  (tmp_path / "s.csv").write_text(
    "narration_id,narration\n"
    + "".join(f"c{j},caption {j}\n" for j in range(captions))
  )
  rectangular = rng.uniform(size=(clips, captions)).round(1)
  (tmp_path / "rel.pkl").write_bytes(pickle.dumps(rectangular))
  caption_emb = rng.normal(size=(captions, d))
  with config.unlocked():
    config.eval.update(
      relevancy=str(tmp_path / "rel.pkl"), sentences=str(tmp_path / "s.csv")
    )
    config.data.allow_pickle = True
  got = contrastive.eval_metrics(
    {**outputs, "caption_emb": caption_emb}, config
  )
  want = metrics_lib.ek100_mir_metrics(
    mean_video @ unit(caption_emb).T, rectangular[kept]
  )
  for key, value in want.items():
    assert got[key] == pytest.approx(value, abs=1e-6), key
  with pytest.raises(
    ValueError, match="does not fit clips.csv and its 3 captions"
  ):
    contrastive.eval_metrics(
      {**outputs, "caption_emb": caption_emb[:3]}, config
    )


def test_an_eval_label_the_head_does_not_have_is_scored_as_wrong():
  """Labels 0-2 trained, a 3-class head; the evaluation file also has class
  7 (warned about at start-up): scored as wrong, in training's evaluations
  and `--mode eval` alike (both score through `eval_metrics`)."""
  logits = np.array([[4.0, 0, 0], [0, 4.0, 0], [0, 0, 4.0], [4.0, 0, 0]])
  outputs = {
    "logits": np.repeat(logits, 2, axis=0),  # 2 views per clip.
    "label": np.repeat([0, 1, 7, 7], 2),
    "index": np.repeat(np.arange(4), 2),
    "valid": np.ones(8, bool),
  }
  config = ml_collections.ConfigDict(dict(data=dict(format="jsonl")))
  got = classification.eval_metrics(outputs, config)
  assert got["top1"] == pytest.approx(0.5)
  assert got["chance_top1"] == pytest.approx(1 / 3)


def test_saved_embeddings_name_clips_by_the_annotations_ids():
  # Without narration ids (JSON Lines): each row's video id, not its number.
  rows = [ClipRecord("bikes", 0, 2), ClipRecord("car", 1, 3)]
  assert list(eval_sets._record_ids(rows)) == ["bikes", "car"]
  rows = [ClipRecord("P01_01", 0, 2, extra={"narration_id": "P01_01_0"})]
  assert list(eval_sets._record_ids(rows)) == ["P01_01_0"]
