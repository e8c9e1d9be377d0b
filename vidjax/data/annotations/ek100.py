"""EPIC-Kitchens-100 files as released: action and retrieval CSVs, captions,
relevancy matrices, and the caption positives of multi-instance retrieval.

The files (epic-kitchens-100-annotations, plus the relevancy pickles that
LaViLa/AVION distribute):

  EPIC_100_train.csv, EPIC_100_validation.csv      action recognition
  retrieval_annotations/EPIC_100_retrieval_{train,test}.csv
      the clips of multi-instance retrieval (MIR), 15 columns: narration_id,
      participant_id, video_id, narration_timestamp, start_timestamp,
      stop_timestamp, start_frame, stop_frame, narration, verb, verb_class,
      noun, noun_class, all_nouns, all_noun_classes
  retrieval_annotations/EPIC_100_retrieval_{train,test}_sentence.csv
      the unique captions, in the file's own order: narration_id, narration
      (train adds verb_class, noun_classes, verb, nouns)
  caption_relevancy_EPIC_100_retrieval_{train,test}.pkl
      float[clips, captions] graded relevancy (test: 9668 x 3842): row i is
      row i of the retrieval CSV, column j is caption j of the sentence CSV.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
import dataclasses
import os
from typing import Any

import numpy as np

from vidjax.base import errors
from vidjax.data.annotations.records import (
  ClipRecord,
  PathLike,
  error,
  load_pickle,
  parse_timestamp,
  read_csv,
  to_int,
)

# Positives of a MIR training clip: captions of relevancy > 0.1 (AVION).
POSITIVE_THRESHOLD = 0.1
_ROWS_PER_CHUNK = 4096  # Bounds the temporaries of thresholding a matrix.


def _read_epic(path: PathLike) -> Iterator[tuple[str, ClipRecord]]:
  """EK-100 action/retrieval CSV rows -> ('FILE:LINE', unlabelled record)."""
  for where, row in read_csv(
    path, ("video_id", "start_timestamp", "stop_timestamp")
  ):
    start, end = (
      parse_timestamp(row[c], where, c)
      for c in ("start_timestamp", "stop_timestamp")
    )
    if end < start:
      raise error(where, "stop_timestamp is before start_timestamp")
    extra: dict[str, Any] = {
      k: row[k] for k in ("narration_id", "participant_id") if row.get(k)
    }
    for column in ("verb_class", "noun_class"):
      if row.get(column):
        extra[column] = to_int(row[column], where, column)
    if row.get("all_noun_classes"):
      try:
        extra["all_noun_classes"] = [
          int(c) for c in ast.literal_eval(row["all_noun_classes"])
        ]
      except (ValueError, SyntaxError, TypeError):
        raise error(
          where,
          f"all_noun_classes {row['all_noun_classes']!r} "
          "is not a list of integers",
        ) from None
    text = row.get("narration") or None
    yield where, ClipRecord(row["video_id"], start, end, text, None, extra)


def ek100_action_map(
  csv_paths: PathLike | Sequence[PathLike],
) -> dict[tuple[int, int], int]:
  """Action ids for (verb_class, noun_class) pairs, as LaViLa/AVION assign them.

  Every pair in the CSVs (they use EPIC_100_train.csv and
  EPIC_100_validation.csv: 3806 actions) becomes the string
  `f'{verb}:{noun}'`; the strings are sorted as strings (so '10:1' precedes
  '1:2') and numbered from 0, matching their checkpoints' action heads.

  Returns:
    `{(verb_class, noun_class): action_id}`.
  """
  if isinstance(csv_paths, (str, os.PathLike)):
    csv_paths = [csv_paths]
  keys = set()
  for path in csv_paths:
    for where, row in read_csv(path, ("verb_class", "noun_class")):
      verb = to_int(row["verb_class"], where, "verb_class")
      keys.add(f"{verb}:{to_int(row['noun_class'], where, 'noun_class')}")
  return {
    tuple(map(int, key.split(":"))): i for i, key in enumerate(sorted(keys))
  }


def load_ek100_cls(
  path: PathLike,
  *,
  label: str = "action",
  action_map: Mapping[tuple[int, int], int] | None = None,
) -> list[ClipRecord]:
  """EK-100 action-recognition clips (EPIC_100_{train,validation}.csv).

  Args:
    path: the CSV.
    label: which class becomes `label`: 'action', 'verb' or 'noun'. The verb
      and noun classes are always in `extra`.
    action_map: for 'action', `ek100_action_map([train_csv, val_csv])`, so
      that train and validation ids agree.

  Returns:
    Records with `text` = narration and `label` set.
  """
  if label not in ("action", "verb", "noun"):
    raise errors.ConfigError(
      f"label must be 'action', 'verb' or 'noun', not {label!r}"
    )
  if label == "action" and action_map is None:
    raise ValueError(
      'label="action" needs action_map=ek100_action_map('
      "[train_csv, validation_csv]) so ids agree across splits"
    )
  records = []
  for where, r in _read_epic(path):
    if "verb_class" not in r.extra or "noun_class" not in r.extra:
      raise error(where, "verb_class/noun_class missing (a test file?)")
    pair = (r.extra["verb_class"], r.extra["noun_class"])
    if label == "action":
      if pair not in action_map:
        raise error(where, f"verb/noun pair {pair} is not in the action map")
      value = action_map[pair]
    else:
      value = pair[0] if label == "verb" else pair[1]
    records.append(dataclasses.replace(r, label=value))
  return records


def load_ek100_mir(path: PathLike) -> list[ClipRecord]:
  """EK-100 retrieval clips (EPIC_100_retrieval_{train,test}.csv): `text` is
  the narration; record i is row i of the relevancy matrix."""
  return [r for _, r in _read_epic(path)]


def load_ek100_mir_sentences(path: PathLike) -> list[tuple[str, str]]:
  """The unique captions (EPIC_100_retrieval_{train,test}_sentence.csv).

  Returns:
    `(narration_id, narration)` in the file's order: caption j is column j
    of the relevancy matrix, and narration_id names a clip that carries it.
    Sentence files from before the annotations' 2020-09-30 fix, whose
    columns were `index,sentence`, read the same.
  """
  with open(path, encoding="utf-8-sig") as f:
    old = f.readline().strip().split(",")[:2] == ["index", "sentence"]
  ids, texts = ("index", "sentence") if old else ("narration_id", "narration")
  return [(row[ids], row[texts]) for _, row in read_csv(path, (ids, texts))]


def load_relevancy(
  path: PathLike, *, allow_pickle: bool = False, mmap: bool = False
) -> np.ndarray:
  """The EK-100 MIR relevancy matrix, `float[num_clips, num_captions]`.

  Reads `.npy`, `.npz` (its only array, or the one named 'relevancy') or the
  distributed `caption_relevancy_EPIC_100_retrieval_{train,test}.pkl`
  (needs `allow_pickle=True`, or convert it once with `convert-relevancy`).
  The dtype stays as stored, so metrics match the official ones.

  Args:
    path: the file.
    allow_pickle: opt in to unpickling a `.pkl`.
    mmap: memory-map a `.npy` instead of reading it (the training matrix,
      67217 x 15989, is several GB).
  """
  name = os.fspath(path)
  if name.endswith(".npy"):
    matrix = np.load(name, allow_pickle=False, mmap_mode="r" if mmap else None)
  elif name.endswith(".npz"):
    with np.load(name, allow_pickle=False) as data:
      keys = list(data.keys())
      if "relevancy" not in keys and len(keys) != 1:
        raise error(name, f"several arrays {keys}, none named 'relevancy'")
      matrix = data["relevancy" if "relevancy" in keys else keys[0]]
  else:
    matrix = np.asarray(load_pickle(path, allow_pickle, "convert-relevancy"))
  if matrix.ndim != 2 or not np.issubdtype(matrix.dtype, np.number):
    raise error(
      name,
      f"expected a 2-D numeric matrix, got {matrix.dtype}{list(matrix.shape)}",
    )
  return matrix


def check_relevancy_shape(
  matrix: np.ndarray,
  relevancy: PathLike,
  num_clips: int,
  clips_file: PathLike,
  num_captions: int,
  captions_file: PathLike | None,
) -> None:
  """Raises unless `matrix` is clips x captions of the files it goes with.

  Args:
    matrix: the relevancy matrix read from `relevancy`.
    relevancy: its file, for the message.
    num_clips, clips_file: the annotation file's rows and name.
    num_captions, captions_file: the sentence file's rows and name; None
      when captions are the clips' own narrations (a square matrix).
  """
  if matrix.shape == (num_clips, num_captions):
    return
  if captions_file is None:
    raise errors.DataFileError(
      f"{os.fspath(relevancy)} is {matrix.shape[0]} x {matrix.shape[1]} but "
      f"{os.fspath(clips_file)} has {num_clips} clips; without a sentence "
      f"file it must be {num_clips} x {num_clips}. A clips x captions "
      "matrix (the released one) needs its sentence CSV (eval.sentences "
      "or data.train_sentences)"
    )
  raise errors.DataFileError(
    f"{os.fspath(relevancy)} is {matrix.shape[0]} x {matrix.shape[1]} but "
    f"{os.fspath(clips_file)} has {num_clips} clips and "
    f"{os.fspath(captions_file)} has {num_captions} captions: rows must be "
    "the clips and columns the captions, in those files' order (are they "
    "from the same split?)"
  )


@dataclasses.dataclass(frozen=True)
class CaptionPositives:
  """For each clip, the captions it may be trained against.

  AVION's EK-100 MIR fine-tuning pairs each training clip with a caption
  drawn uniformly among those whose relevancy to it exceeds 0.1 (its own
  narration has relevancy 1). A shared verb alone gives 0.5, so a clip has
  thousands of positives; clips with the same verb and nouns have the same
  ones, so each distinct set is stored once (CSR), small enough to travel to
  the data-loading workers.

  Attributes:
    captions: caption j's text.
    row_of: int32[num_clips], the positive set of each clip.
    offsets: int64[num_sets + 1]; set k is `columns[offsets[k]:offsets[k+1]]`.
    columns: uint16 or int32[num_positives], caption indices.
  """

  captions: tuple[str, ...]
  row_of: np.ndarray
  offsets: np.ndarray
  columns: np.ndarray

  @classmethod
  def from_relevancy(
    cls,
    relevancy: np.ndarray,
    captions: Sequence[str],
    threshold: float = POSITIVE_THRESHOLD,
  ) -> CaptionPositives:
    """Positives of every row of `relevancy` (float[clips, captions])."""
    dtype = np.uint16 if relevancy.shape[1] <= 1 << 16 else np.int32
    sets: dict[bytes, int] = {}
    row_of = np.empty(relevancy.shape[0], np.int32)
    for start in range(0, relevancy.shape[0], _ROWS_PER_CHUNK):
      block = np.asarray(relevancy[start : start + _ROWS_PER_CHUNK]) > threshold
      for i, row in enumerate(block, start):
        key = np.flatnonzero(row).astype(dtype).tobytes()
        row_of[i] = sets.setdefault(key, len(sets))
    columns = [np.frombuffer(key, dtype) for key in sets]  # In insertion order.
    offsets = np.cumsum([0] + [len(c) for c in columns], dtype=np.int64)
    return cls(
      tuple(captions),
      row_of,
      offsets,
      np.concatenate(columns) if columns else np.zeros(0, dtype),
    )

  def draw_column(self, index: int, rng: np.random.Generator) -> int | None:
    """The caption (its column) for clip `index`, uniform among its
    positives (None: it has none)."""
    k = self.row_of[index]
    lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
    if hi == lo:
      return None
    return int(self.columns[lo + int(rng.integers(hi - lo))])

  def draw(self, index: int, rng: np.random.Generator) -> str | None:
    """`draw_column`'s caption text (None: none)."""
    column = self.draw_column(index, rng)
    return None if column is None else self.captions[column]


def mir_positives(
  records: Sequence[ClipRecord],
  clips_file: PathLike,
  sentences: PathLike,
  relevancy: PathLike,
  *,
  threshold: float = POSITIVE_THRESHOLD,
  allow_pickle: bool = False,
  matrix: np.ndarray | None = None,
) -> CaptionPositives:
  """The training positives of EK-100 MIR clips, checked against the files.

  Args:
    records: the clips, `load_ek100_mir(clips_file)` or some of them (the
      rows that passed the start-up data checks), by `narration_id`.
    clips_file: EPIC_100_retrieval_train.csv, whose rows are the
      relevancy's.
    sentences: EPIC_100_retrieval_train_sentence.csv.
    relevancy: caption_relevancy_EPIC_100_retrieval_train.pkl (or its .npy,
      which is memory-mapped rather than read whole).
    threshold: captions with relevancy above it are positives.
    allow_pickle: opt in to unpickling a `.pkl` relevancy.
    matrix: `relevancy` already read (`load_relevancy(..., mmap=True)`).
  """
  captions = [text for _, text in load_ek100_mir_sentences(sentences)]
  if matrix is None:
    matrix = load_relevancy(relevancy, allow_pickle=allow_pickle, mmap=True)
  rows = {
    r.extra["narration_id"]: i for i, r in enumerate(load_ek100_mir(clips_file))
  }
  check_relevancy_shape(
    matrix, relevancy, len(rows), clips_file, len(captions), sentences
  )
  positives = CaptionPositives.from_relevancy(matrix, captions, threshold)
  kept = [rows[r.extra["narration_id"]] for r in records]
  return dataclasses.replace(positives, row_of=positives.row_of[kept])
