"""The synthetic corpus: real chunked H.264, annotations in two layouts."""

import json
from pathlib import Path

import numpy as np

from vidjax.data import annotations, synthetic, video


def test_corpus_layout_and_content(tmp_path):
  root = synthetic.make_corpus(
    tmp_path, num_videos=4, segment_seconds=2, progress=False
  )
  names = json.loads((root / "classes.json").read_text())
  assert names == synthetic.class_names() and len(names) == 48
  train = annotations.load_jsonl(root / "train.jsonl")
  val = annotations.load_jsonl(root / "val.jsonl")
  assert len(train) == 6 and len(val) == 2  # 2 segments per video.
  assert not {r.video_id for r in train} & {r.video_id for r in val}
  for r in train + val:
    assert r.text == names[r.label]
  ek = annotations.load_ek100_cls(root / "ek100_train.csv", label="verb")
  assert [r.start for r in ek] == [r.start for r in train]
  assert [synthetic.class_names()[r.label].split()[-1] for r in train] == [
    list(synthetic.MOTIONS)[r.label] for r in ek
  ]
  # The shape moves the way the caption says.
  r = next(r for r in train if r.text.endswith(("left", "right")))
  clip = video.read_clip(
    root / "chunks", r.video_id, [int(r.start * 8), int(r.end * 8) - 1]
  )
  colour = np.array(synthetic.COLOURS[r.text.split()[1]])
  xs = [
    np.nonzero((np.abs(f.astype(int) - colour).sum(-1) < 60).any(0))[0].mean()
    for f in clip
  ]
  assert (xs[1] > xs[0]) == r.text.endswith("right")
  # A second call finds the corpus complete and does nothing.
  mtime = (root / "train.jsonl").stat().st_mtime
  synthetic.make_corpus(
    tmp_path, num_videos=4, segment_seconds=2, progress=False
  )
  assert (root / "train.jsonl").stat().st_mtime == mtime
  # Other settings make it anew, leaving nothing of the old one.
  synthetic.make_corpus(
    tmp_path, num_videos=2, segment_seconds=2, progress=False
  )
  assert len(annotations.load_jsonl(root / "train.jsonl")) == 2
  # The videos, and EGTEA's cropped clips of their segments (2 each).
  videos = sorted(video.manifest(root / "chunks"))
  assert [v for v in videos if v.startswith("vid")] == ["vid000", "vid001"]
  assert len(videos) == 2 + 4
  assert sorted(p.name for p in (root / "raw").iterdir()) == [
    "cropped_clips",
    "vid000.mp4",
    "vid001.mp4",
  ]


def test_prepare_leaves_user_paths_alone(tmp_path):
  from vidjax import config as config_lib

  repo = Path(__file__).resolve().parents[1]
  config = config_lib.load_config(
    str(repo / "configs/demo.py:debug"), ["data.root=/mine/chunks"]
  )
  assert not synthetic.prepare(config, tmp_path)
  assert (
    config.data.root == "/mine/chunks" and not config.data.train_annotations
  )
  assert not any(tmp_path.iterdir())  # Nothing written.


def test_a_users_evaluation_set_keeps_its_files_on_the_corpus(tmp_path):
  # No training paths: the corpus trains, but the user's EGTEA set is theirs.
  from vidjax import config as config_lib
  from vidjax.data.synthetic import layouts

  repo = Path(__file__).resolve().parents[1]
  config = config_lib.load_config(
    str(repo / "configs/clip_vitb16_ego4d.py:debug"),
    ["eval.sets.egtea.data.eval_annotations=/mine/test_split1.txt"],
  )
  layouts.use_corpus(config, tmp_path)
  sets = config.eval.sets
  assert sets.egtea.data.eval_annotations == "/mine/test_split1.txt"
  assert sets.egtea.data.root == ""  # Not pointed at the corpus's chunks.
  assert sets.egomcq.data.eval_annotations.startswith(str(tmp_path))
  assert config.data.train_annotations.startswith(str(tmp_path))
