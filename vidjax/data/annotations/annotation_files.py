"""The run's annotation files, as `config.data` names them -> clip records.

`load_annotations(config.data, path)` reads one file, or several separated by
commas, with the loader of `data.format` (`vidjax.data.annotations`) and
the class ids the run trains with: for 'kinetics' the training files' class
names, sorted (`kinetics_label_map`); for 'ek100_cls' actions numbered over
the training and validation CSVs together (`ek100_actions`), as AVION's
action heads are. `caption_positives` gives EK-100 MIR training clips the
captions they are relevant to (`data.train_relevancy`), and with
`pairs=True` the classes behind every in-batch pair's relevancy
(`ek100_classes`), checked against the matrix.
"""

from __future__ import annotations

import ml_collections

from vidjax.base import errors
from vidjax.data import annotations
from vidjax.data.annotations import (
  benchmark_files,
  ek100,
  ek100_classes,
  records as records_lib,
)


def split_paths(value: str) -> list[str]:
  """'a.jsonl,b.jsonl' -> ['a.jsonl', 'b.jsonl'] (several annotation files)."""
  return [p.strip() for p in str(value).split(",") if p.strip()]


def load_annotations(data: ml_collections.ConfigDict, path: str):
  """Records of an annotation file (or of comma-separated files, in order)."""
  kw = {}
  if data.format == "ego4d":
    kw["allow_pickle"] = data.allow_pickle
  if data.format == "kinetics":
    kw["label_map"] = kinetics_label_map(data, path)
  if data.format in benchmark_files.CLASS_FILES:
    kw["classes"] = data.classes
  if data.format == "ek100_cls":
    kw["label"] = data.label
    if data.label == "action":
      kw["action_map"] = ek100_actions(data)
  return annotations.load_records(data.format, split_paths(path), **kw)


def ek100_actions(
  data: ml_collections.ConfigDict,
) -> dict[tuple[int, int], int]:
  """EK-100 action ids, `{(verb, noun): action}`, numbered over the training
  and validation CSVs together (as AVION's action heads are)."""
  return annotations.ek100_action_map(
    [
      p
      for value in (data.train_annotations, data.eval_annotations)
      for p in split_paths(value)
    ]
  )


def _kinetics_classes(path: str) -> set[str]:
  """The class names in a Kinetics CSV's `label` column (none if it has none)."""
  return {
    row["label"]
    for _, row in records_lib.read_csv(path, ())
    if row.get("label") is not None
  }


def kinetics_label_map(
  data: ml_collections.ConfigDict, path: str
) -> dict[str, int]:
  """Class ids for format 'kinetics': the training files' class names, sorted.

  One map for every file, so that training, its evaluations and a later
  `--mode eval` agree on the ids even when the files list different classes
  (e.g. filtered to the videos that could be downloaded). Without training
  files (evaluating released weights) the names of `path` itself.

  Raises:
    errors.DataFileError: a file of `path` has classes the training files
      lack (no id of the trained model is theirs).
  """
  train = split_paths(data.train_annotations) or split_paths(path)
  names = set().union(*map(_kinetics_classes, train))
  for file in split_paths(path):
    unknown = sorted(_kinetics_classes(file) - names)
    if unknown:
      shown = ", ".join(map(repr, unknown[:5])) + (
        f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
      )
      raise errors.DataFileError(
        f"{file}: {len(unknown)} class{'es' if len(unknown) > 1 else ''} "
        f"not in the training classes of {', '.join(train)}: {shown}. "
        "Class ids come from the training classes (sorted); leave these "
        "rows out of the file"
      )
  return {name: i for i, name in enumerate(sorted(names))}


def caption_positives(
  data: ml_collections.ConfigDict, records, *, pairs: bool = False
):
  """EK-100 MIR training positives (`data.train_relevancy`), or None.

  With `pairs`: (positives, `ek100_classes.PairClasses` of `records`), the
  training matrix read once for both and checked against the classes
  (`ek100_classes.check_matrix`).
  """
  if not data.train_relevancy:
    if pairs:
      raise errors.ConfigError(
        "the relevancy-aware losses (loss.name) need the training "
        "relevancy: data.train_relevancy is unset",
        hint="set --config.data.train_relevancy to "
        "caption_relevancy_EPIC_100_retrieval_train.pkl (or its .npy)",
      )
    return None
  files = split_paths(data.train_annotations)
  if data.format != "ek100_mir" or len(files) != 1 or not data.train_sentences:
    raise errors.ConfigError(
      "data.train_relevancy needs data.format='ek100_mir', one "
      "data.train_annotations file (EPIC_100_retrieval_train.csv) and "
      "data.train_sentences (EPIC_100_retrieval_train_sentence.csv)"
    )
  matrix = ek100.load_relevancy(
    data.train_relevancy, allow_pickle=data.allow_pickle, mmap=True
  )
  positives = ek100.mir_positives(
    records,
    files[0],
    data.train_sentences,
    data.train_relevancy,
    threshold=data.positive_threshold,
    matrix=matrix,
  )
  if not pairs:
    return positives
  clips = ek100.load_ek100_mir(files[0])
  every = ek100_classes.PairClasses.load(
    files[0], data.train_sentences, data.max_nouns, records=clips
  )
  ek100_classes.check_matrix(
    matrix, data.train_relevancy, every, files[0], data.train_sentences
  )
  rows = {r.extra["narration_id"]: i for i, r in enumerate(clips)}
  return positives, every.take([rows[r.extra["narration_id"]] for r in records])
