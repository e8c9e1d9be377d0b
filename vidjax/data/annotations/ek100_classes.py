"""EPIC-Kitchens-100 MIR relevancy from the verb and noun classes.

EPIC's relevancy of clip i to caption j is the mean of two IoUs: of their
verb classes (one each: 1 if the same, else 0) and of their noun-class sets
(the retrieval CSV's `all_noun_classes`; the train sentence CSV's
`verb_class` and `noun_classes`). That is how the dataset's authors build the
released pickles (their MIR baselines' code,
mwray/Joint-Part-of-Speech-Embeddings, `src/scripts/create_relevancy_files.py`).

The losses that read every in-batch pair's relevancy (SMS, the
relevancy-scaled max-margin: `config.loss.name`) get it from the classes:
each training item carries its clip's classes and its caption's
(`PairClasses.element`), and the task computes the B x B relevancy on the
device (`class_relevancy`, with `xp=jax.numpy`; 16 K int32 compares per pair
at `data.max_nouns=16`). A host holds class tables (67,217 clips and 15,989
captions at 17 int32 each: 5.6 MB), not the clips x captions matrix (1.07 GB
even as the reference's uint8, 8.6 GB as the released float64), and no host
needs another host's rows: the pairs of a global batch span every host's
items. So that the loss's input is the matrix's, `check_matrix` compares the
formula with the whole training matrix at start-up, refusing a run where any
entry differs by more than `TOLERANCE`. The values stay exact: the SMS
reference truncates M x 240 to uint8 (so 1/18 and 1/20 tie there); here
relevancies tie when within `losses.SMS_EPS` (docs/recipes.md).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
import dataclasses
import os

import numpy as np

from vidjax.base import errors
from vidjax.data.annotations import ek100
from vidjax.data.annotations.records import ClipRecord, PathLike, read_csv

# The most a computed relevancy may differ from the matrix's (float32 on the
# device against the released float64; the values are multiples of 1/240).
TOLERANCE = 1e-6
_ROWS_PER_CHUNK = 2048  # Bounds the temporaries of `check_matrix`.
# The keys a training element carries for the in-batch relevancy (beside
# `verb`, the clip's verb class, which the loader carries already).
KEYS = (
  "relevancy_row",
  "relevancy_column",
  "nouns",
  "caption_verb",
  "caption_nouns",
)


def class_relevancy(verb_a, nouns_a, verb_b, nouns_b, xp=np):
  """EPIC's relevancy of every a to every b: 0.5 [same verb] + 0.5 noun IoU.

  Args:
    verb_a: int[A] verb classes.
    nouns_a: int[A, K] noun classes, each set's distinct classes padded
      with -1.
    verb_b, nouns_b: int[B], int[B, K], likewise.
    xp: `numpy` on the host, `jax.numpy` on the device.

  Returns:
    float32[A, B]; a pair without any noun has noun IoU 0.
  """
  same = (nouns_a[:, None, :, None] == nouns_b[None, :, None, :]) & (
    nouns_a[:, None, :, None] >= 0
  )
  inter = xp.sum(same, axis=(2, 3)).astype(xp.float32)
  sizes = [
    xp.sum(n >= 0, axis=1).astype(xp.float32) for n in (nouns_a, nouns_b)
  ]
  union = sizes[0][:, None] + sizes[1][None, :] - inter
  iou = inter / xp.maximum(union, 1.0)
  verb = (verb_a[:, None] == verb_b[None, :]).astype(xp.float32)
  return (0.5 * verb + 0.5 * iou).astype(xp.float32)


def _noun_rows(sets: Sequence[Sequence[int]], max_nouns: int, what: str):
  """int32[N, max_nouns]: each set's distinct classes, padded with -1."""
  out = np.full((len(sets), max_nouns), -1, np.int32)
  for i, nouns in enumerate(sets):
    distinct = sorted(set(int(n) for n in nouns))
    if len(distinct) > max_nouns:
      raise errors.DataFileError(
        f"{what} row {i + 1} has {len(distinct)} noun classes, more than "
        f"data.max_nouns={max_nouns}",
        hint=f"set --config.data.max_nouns={len(distinct)} (or more)",
      )
    out[i, : len(distinct)] = distinct
  return out


def _caption_classes(sentences: PathLike) -> tuple[list[int], list[list[int]]]:
  """The train sentence CSV's verb class and noun classes of each caption."""
  verbs, nouns = [], []
  for where, row in read_csv(sentences, ("verb_class", "noun_classes")):
    try:
      verbs.append(int(row["verb_class"]))
      nouns.append([int(c) for c in ast.literal_eval(row["noun_classes"])])
    except (ValueError, SyntaxError, TypeError):
      raise errors.DataFileError(
        f"{where}: verb_class {row['verb_class']!r} / noun_classes "
        f"{row['noun_classes']!r} are not a class and a list of classes",
        hint="data.train_sentences is EPIC_100_retrieval_train_sentence.csv "
        "(the test file has no classes)",
      ) from None
  return verbs, nouns


@dataclasses.dataclass(frozen=True)
class PairClasses:
  """The classes behind every in-batch relevancy, per record and caption.

  Attributes:
    row: int32[num_records], each record's row of the training matrix.
    verb: int32[num_records], the records' verb classes.
    nouns: int32[num_records, K], their noun classes (-1 padded).
    caption_verb: int32[num_captions], the captions' verb classes.
    caption_nouns: int32[num_captions, K], their noun classes.
  """

  row: np.ndarray
  verb: np.ndarray
  nouns: np.ndarray
  caption_verb: np.ndarray
  caption_nouns: np.ndarray

  @classmethod
  def load(
    cls,
    clips_file: PathLike,
    sentences: PathLike,
    max_nouns: int,
    records: Sequence[ClipRecord] | None = None,
  ) -> PairClasses:
    """The classes of the clips of `clips_file` (EPIC_100_retrieval_train.csv)
    and of the captions of `sentences` (its sentence CSV).

    Args:
      clips_file, sentences: the files.
      max_nouns: K, `data.max_nouns`.
      records: `load_ek100_mir(clips_file)`, if read already.
    """
    clips = ek100.load_ek100_mir(clips_file) if records is None else records
    verbs, nouns = _caption_classes(sentences)
    clip_nouns = [r.extra.get("all_noun_classes", []) for r in clips]
    return cls(
      row=np.arange(len(clips), dtype=np.int32),
      verb=np.asarray([r.extra["verb_class"] for r in clips], np.int32),
      nouns=_noun_rows(clip_nouns, max_nouns, os.fspath(clips_file)),
      caption_verb=np.asarray(verbs, np.int32),
      caption_nouns=_noun_rows(nouns, max_nouns, os.fspath(sentences)),
    )

  def take(self, rows: Sequence[int]) -> PairClasses:
    """These classes for the records of matrix rows `rows` (the checked
    records, in their order); the captions' stay."""
    rows = np.asarray(rows, np.int64)
    return dataclasses.replace(
      self, row=self.row[rows], verb=self.verb[rows], nouns=self.nouns[rows]
    )

  def element(self, index: int, column: int) -> dict[str, np.ndarray]:
    """The `KEYS` of record `index` paired with caption `column` (-1: its
    own narration, which is as relevant as its own classes make it)."""
    own = column < 0
    return {
      "relevancy_row": np.int32(self.row[index]),
      "relevancy_column": np.int32(column),
      "nouns": self.nouns[index],
      "caption_verb": np.int32(
        self.verb[index] if own else self.caption_verb[column]
      ),
      "caption_nouns": self.nouns[index] if own else self.caption_nouns[column],
    }


def check_matrix(
  matrix: np.ndarray,
  path: PathLike,
  classes: PairClasses,
  clips_file: PathLike,
  sentences: PathLike,
) -> None:
  """Raises unless `class_relevancy` gives every entry of `matrix`.

  Args:
    matrix: float[clips, captions], the training relevancy (a memory map
      of a .npy is read a block of rows at a time).
    path: its file, for the message.
    classes: `PairClasses.load` of every clip (row i: the matrix's row i).
    clips_file, sentences: the retrieval CSV and its sentence CSV, for the
      message.

  Raises:
    errors.DataFileError: an entry differs by more than `TOLERANCE`.
  """
  # Distinct noun sets on each side: their IoUs once (intersections by a
  # product of incidence matrices), a table look-up after.
  sets_a, of_a = np.unique(classes.nouns, axis=0, return_inverse=True)
  sets_b, of_b = np.unique(classes.caption_nouns, axis=0, return_inverse=True)
  width = int(max(sets_a.max(initial=0), sets_b.max(initial=0))) + 2
  incidence = []
  for sets in (sets_a, sets_b):
    one_hot = np.zeros((len(sets), width), np.float32)
    np.put_along_axis(one_hot, np.where(sets < 0, width - 1, sets), 1.0, axis=1)
    one_hot[:, width - 1] = 0.0  # The padding's column.
    incidence.append(one_hot)
  inter = incidence[0] @ incidence[1].T
  union = incidence[0].sum(1)[:, None] + incidence[1].sum(1)[None, :] - inter
  iou = inter / np.maximum(union, 1.0)  # float32: 2e-8 from the float64's
  of_a, of_b = of_a.reshape(-1), of_b.reshape(-1)
  for start in range(0, matrix.shape[0], _ROWS_PER_CHUNK):
    stop = min(start + _ROWS_PER_CHUNK, matrix.shape[0])
    same_verb = np.equal.outer(classes.verb[start:stop], classes.caption_verb)
    formula = 0.5 * same_verb + 0.5 * iou[of_a[start:stop]][:, of_b]
    diff = np.abs(np.asarray(matrix[start:stop], np.float64) - formula)
    if (diff > TOLERANCE).any():
      i, j = np.unravel_index(np.argmax(diff), diff.shape)
      raise errors.DataFileError(
        f"{os.fspath(path)}: entry ({start + i}, {j}) is "
        f"{float(matrix[start + i, j]):.6f}, but the classes of "
        f"{os.fspath(clips_file)} row {start + i + 1} and "
        f"{os.fspath(sentences)} row {j + 1} give {formula[i, j]:.6f} "
        "(0.5 for the same verb class + 0.5 IoU of the noun classes)",
        hint="the relevancy-aware losses compute the in-batch relevancy "
        "from these classes: use the released matrix with its own CSVs, "
        "or --config.loss.name=max_margin",
      )
