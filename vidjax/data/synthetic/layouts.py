"""The synthetic corpus's clips in the released annotation layouts.

`vidjax.data.synthetic.make_corpus` renders the videos and calls
`write_annotation_files` with each split's segments, which writes, under the
corpus root:

  {train,val}.jsonl                 generic JSONL (video_id, start, end, text,
                                    label)
  ek100_{train,val}.csv             the EPIC_100_{train,validation}.csv layout
                                    (verb = motion, noun = coloured shape)
  ek100_retrieval_{train,val}.csv   the EPIC_100_retrieval_{train,test}.csv
                                    layout: each segment and its first half,
                                    narrated alike (captions repeat, as in
                                    the real files)
  ek100_retrieval_{train,val}_sentence.csv
                                    the unique captions, in an order of their
                                    own, each naming a clip that carries it
                                    (train: 6 columns, val: 2, as released)
  caption_relevancy_ek100_retrieval_{train,val}.pkl
                                    pickled float64[clips, captions] matrices
                                    graded as EK-100's: half for the verb,
                                    half for the noun
  relevancy_val.npy                 float32[clips, clips] of val.jsonl
  ego4d_train.rephraser.pkl, ego4d_train.narrator.pkl
                                    LaViLa's LLM-augmented layout: lists of
                                    narrations (4-tuples; the narrator's
                                    5-tuples add their NLLs)

`use_corpus` points a config's data (and evaluation sets) at these files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import csv
import os
from pathlib import Path
import pickle

from absl import logging
import ml_collections
import numpy as np

from vidjax.base import errors
from vidjax.data import annotations
from vidjax.data.annotations.records import ClipRecord

EK100_COLUMNS = (
  "narration_id",
  "participant_id",
  "video_id",
  "narration_timestamp",
  "start_timestamp",
  "stop_timestamp",
  "start_frame",
  "stop_frame",
  "narration",
  "verb",
  "verb_class",
  "noun",
  "noun_class",
  "all_nouns",
  "all_noun_classes",
)
SENTENCE_COLUMNS = {  # As released: the test file keeps only the first two.
  "train": (
    "narration_id",
    "narration",
    "verb_class",
    "noun_classes",
    "verb",
    "nouns",
  ),
  "val": ("narration_id", "narration"),
}
LAVILA_FILES = ("ego4d_train.rephraser.pkl", "ego4d_train.narrator.pkl")
# format -> (training, evaluation) annotation files of the corpus.
FILES = {
  "jsonl": ("train.jsonl", "val.jsonl"),
  "ek100_cls": ("ek100_train.csv", "ek100_val.csv"),
  "ek100_mir": ("ek100_retrieval_train.csv", "ek100_retrieval_val.csv"),
  "ego4d": (",".join(LAVILA_FILES), "val.jsonl"),
  "egtea": ("egtea/train_split1.txt", "egtea/test_split1.txt"),
  "charades_ego_trimmed": (
    "charades_ego/CharadesEgo_v1_train_only1st.csv",
    "charades_ego/CharadesEgo_v1_test_only1st.csv",
  ),
}
# The benchmarks' evaluation files (`vidjax.data.synthetic.benchmark_files`),
# for evaluation sets in these formats.
BENCHMARK_FILES = {
  "egtea": "egtea/test_split1.txt",
  "charades_ego": "charades_ego/CharadesEgo_v1_test_only1st.csv",
  "egomcq": "egomcq.json",
  "ek100_cls": "ek100_val.csv",
}


def _timestamp(seconds: float) -> str:
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{int(h):02d}:{int(m):02d}:{s:05.2f}"


def _write_ek100_csv(
  path: Path, clips: Sequence[ClipRecord], ids: Sequence[str], fps: int
) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(EK100_COLUMNS)
    for r, narration_id in zip(clips, ids):
      e = r.extra
      writer.writerow(
        [
          narration_id,
          "P01",
          r.video_id,
          _timestamp(r.start),
          _timestamp(r.start),
          _timestamp(r.end),
          int(r.start * fps) + 1,
          int(r.end * fps),
          r.text,
          e["verb"],
          e["verb_class"],
          e["noun"],
          e["noun_class"],
          f"['{e['noun']}']",
          f"[{e['noun_class']}]",
        ]
      )


def graded_relevancy(
  rows: Sequence[ClipRecord], columns: Sequence[ClipRecord]
) -> np.ndarray:
  """float64[rows, columns]: 0.5 for a shared verb plus 0.5 for a shared noun."""
  verb = [[r.extra["verb_class"] for r in rs] for rs in (rows, columns)]
  noun = [[r.extra["noun_class"] for r in rs] for rs in (rows, columns)]
  same_verb = np.equal.outer(verb[0], verb[1])
  same_noun = np.equal.outer(noun[0], noun[1])
  return 0.5 * same_verb + 0.5 * same_noun


def _write_retrieval(
  root: Path,
  split: str,
  segments: Sequence[ClipRecord],
  fps: int,
  rng: np.random.Generator,
) -> None:
  """EK-100 MIR files of one split: clips, captions, relevancy pickle."""
  clips, ids, per_video = [], [], {}
  for r in segments:
    for end in (r.end, (r.start + r.end) / 2):  # The segment, its first half.
      k = per_video[r.video_id] = per_video.get(r.video_id, -1) + 1
      clips.append(ClipRecord(r.video_id, r.start, end, r.text, None, r.extra))
      ids.append(f"{r.video_id}_{k}")
  _write_ek100_csv(root / f"ek100_retrieval_{split}.csv", clips, ids, fps)
  first = {}  # caption -> the first clip carrying it
  for i, r in enumerate(clips):
    first.setdefault(r.text, i)
  order = rng.permutation(len(first))  # An order of its own.
  carriers = [list(first.values())[j] for j in order]
  with open(
    root / f"ek100_retrieval_{split}_sentence.csv", "w", newline=""
  ) as f:
    writer = csv.writer(f)
    writer.writerow(SENTENCE_COLUMNS[split])
    for i in carriers:
      e = clips[i].extra
      row = [
        ids[i],
        clips[i].text,
        e["verb_class"],
        f"[{e['noun_class']}]",
        e["verb"],
        f"['{e['noun']}']",
      ]
      writer.writerow(row[: len(SENTENCE_COLUMNS[split])])
  relevancy = graded_relevancy(clips, [clips[i] for i in carriers])
  with open(root / f"caption_relevancy_ek100_retrieval_{split}.pkl", "wb") as f:
    pickle.dump(relevancy, f)


def _write_lavila(root: Path, segments: Sequence[ClipRecord]) -> None:
  """LaViLa's rephraser (4-tuples) and narrator (5-tuples) pickles."""
  rephrased, narrated = [], []
  for r in segments:
    colour, shape, motion = r.extra["words"]
    rephrased.append(
      (
        r.video_id,
        r.start,
        r.end,
        [
          r.text,
          f"the {colour} {shape} goes {motion}",
          f"{colour} {shape} moving {motion}",
        ],
      )
    )
    narrated.append(
      (
        r.video_id,
        r.start,
        r.end,
        [
          f"a {shape} moves {motion}",
          f"the {colour} {shape} slides {motion}",
          f"something {colour} moves {motion}",
        ],
        [0.5, 0.75, 1.0],
      )
    )
  for name, entries in zip(LAVILA_FILES, (rephrased, narrated)):
    with open(root / name, "wb") as f:
      pickle.dump(entries, f)


def write_annotation_files(
  root: str | os.PathLike,
  splits: Mapping[str, Sequence[ClipRecord]],
  fps: int,
  seed: int = 0,
) -> None:
  """Writes every file of the module docstring under `root`.

  Args:
    root: the corpus root.
    splits: 'train' and 'val' segments: records with `text`, `label` and
      `extra` holding `verb`, `verb_class`, `noun`, `noun_class` and `words`
      (colour, shape, motion).
    fps: the videos' frame rate (for EK-100's frame columns).
    seed: for the sentence files' order.
  """
  root, rng = Path(root), np.random.default_rng(seed)
  for split, segments in splits.items():
    annotations.write_jsonl(
      [
        ClipRecord(r.video_id, r.start, r.end, r.text, r.label)
        for r in segments
      ],
      root / f"{split}.jsonl",
    )
    _write_ek100_csv(
      root / f"ek100_{split}.csv",
      segments,
      [f"{r.video_id}_{i}" for i, r in enumerate(segments)],
      fps,
    )
    _write_retrieval(root, split, segments, fps, rng)
  np.save(
    root / "relevancy_val.npy",
    graded_relevancy(splits["val"], splits["val"]).astype(np.float32),
    allow_pickle=False,
  )
  _write_lavila(root, splits["train"])


def _use_mir_files(
  data: ml_collections.ConfigDict,
  evaluation: ml_collections.ConfigDict,
  root: Path,
  train: bool,
) -> None:
  data.allow_pickle = True  # The corpus's own pickles.
  if train:
    data.train_sentences = str(root / "ek100_retrieval_train_sentence.csv")
    data.train_relevancy = str(
      root / "caption_relevancy_ek100_retrieval_train.pkl"
    )
  evaluation.sentences = str(root / "ek100_retrieval_val_sentence.csv")
  evaluation.relevancy = str(root / "caption_relevancy_ek100_retrieval_val.pkl")


def use_corpus(
  config: ml_collections.ConfigDict, root: str | os.PathLike
) -> None:
  """Points `config.data` and its evaluation sets at the corpus under `root`.

  The format picks the files (`FILES`); 'ek100_mir' also gets the training
  positives, the sentence file and the clips x captions relevancy pickle;
  'jsonl' with `data.synthetic.relevancy` the square `relevancy_val.npy`.
  Evaluation sets in the 'ek100_mir' format (`eval.sets`) get the retrieval
  validation files; sets of the benchmarks (`defaults.benchmark_set`) their
  files in `vidjax.data.synthetic.benchmark_files`'s layouts. A set whose
  `data.eval_annotations` the user gave keeps its files: a user's path
  always wins.
  """
  root, data = Path(root), config.data
  if data.format not in FILES:
    raise errors.ConfigError(
      f"data.format={data.format!r}: the synthetic corpus has no files in "
      "this format",
      hint=f"use one of {sorted(FILES)}, or set data.root "
      "and the annotation paths to your own data",
    )
  with config.unlocked():
    train_file, eval_file = FILES[data.format]
    data.root = str(root / "chunks")
    data.train_annotations = ",".join(
      str(root / f) for f in train_file.split(",")
    )
    data.eval_annotations = str(root / eval_file)
    if not data.vocab:
      data.vocab = str(root / "vocab.txt.gz")
    if data.format == "ego4d":
      data.allow_pickle = True
    if data.format == "ek100_mir":
      _use_mir_files(data, config.eval, root, train=True)
    elif data.synthetic.relevancy:
      config.eval.relevancy = str(root / "relevancy_val.npy")
    for name, eval_set in config.eval.sets.items():
      if eval_set.data.eval_annotations:  # The user's set: theirs whole.
        logging.info(
          "data: eval.sets.%s keeps its files (%s), not the synthetic corpus's",
          name,
          eval_set.data.eval_annotations,
        )
        continue
      fmt = eval_set.data.format
      if fmt in BENCHMARK_FILES:
        eval_set.data.update(
          root=str(root / "chunks"),
          eval_annotations=str(root / BENCHMARK_FILES[fmt]),
        )
        if fmt == "ek100_cls":  # Its actions: both CSVs'.
          eval_set.data.train_annotations = str(root / FILES[fmt][0])
      if eval_set.data.format == "ek100_mir":
        eval_set.data.update(
          root=str(root / "chunks"),
          eval_annotations=str(root / FILES["ek100_mir"][1]),
        )
        _use_mir_files(eval_set.data, eval_set, root, train=False)
