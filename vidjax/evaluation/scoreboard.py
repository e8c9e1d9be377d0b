"""The field's benchmarks as evaluation kinds: zero-shot classification and
EgoMCQ, scored with their papers' definitions.

An evaluation set (the main one or a named `eval.sets` entry) with
`eval.kind` set is scored here instead of by its task's metrics; its clips
go through the run's video tower as any set's, on a video-text (CLIP) task:

  'zeroshot'  classes made of texts (`vidjax.evaluation.zeroshot`): EGTEA Gaze+
              (`data.format='egtea'`, its 106 action names), Charades-Ego
              ('charades_ego', 157 class names, multi-label, untrimmed
              videos) and EK-100 CLS ('ek100_cls', the 3,806 actions, each
              every distinct narration it has in the training and
              validation CSVs). Each class text is put in every
              `eval.templates` prompt; a clip's views (clips x crops) are
              reduced by `eval.views` ('max': LaViLa's zero-shot EGTEA
              protocol; 'mean'). Metrics: `top1`, `top5`,
              `mean_class_acc` (mean of the confusion matrix's per-class
              recall) and `chance_top1`; Charades-Ego: `mAP`,
              `classes_left_out` (classes with no positive, not in the
              mean) and `chance_mAP` (a random ranking's, about each
              class's share of positives).
  'egomcq'    EgoMCQ ('egomcq'): each question's narration against its 5
              candidate clips, scored both ways: `inter_video`,
              `intra_video` by the dot product of the unnormalised
              embeddings (LaViLa's `validate_mcq`: the figure its tables
              give), `inter_video_cosine`, `intra_video_cosine` by cosine
              (by the `types` value: 1 inter, 2 intra; the reference prints
              them swapped),
              `chance_acc` (0.2) and `questions_left_out` (a candidate
              clip that could not be read).

`check_set` refuses at start-up what would make the figure not the
benchmark's: a kind on a format it does not score, a task without a text
tower, a video the chunk store lacks (e.g. an EgoMCQ uid with no chunks),
naming the file and row.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_collections
import numpy as np

from vidjax.base import errors
from vidjax.config import defaults
from vidjax.data import video
from vidjax.data.annotations import annotation_files, benchmark_files
from vidjax.evaluation import zeroshot
from vidjax.tasks import common, metrics

# The formats each kind scores.
KIND_FORMATS = {
  "zeroshot": ("egtea", "charades_ego", "ek100_cls"),
  "egomcq": ("egomcq",),
}
_SHOWN = 3  # Rows named in a refusal.


def class_texts(config: ml_collections.ConfigDict) -> list[list[str]]:
  """The texts of each class of a zero-shot set, by class id."""
  data = config.data
  if data.format == "ek100_cls":
    files = [
      p
      for v in (data.train_annotations, data.eval_annotations)
      for p in annotation_files.split_paths(v)
    ]
    return benchmark_files.ek100_class_texts(
      files, annotation_files.ek100_actions(data)
    )
  names = benchmark_files.class_names(
    data.format, data.eval_annotations, data.classes
  )
  return [[n] for n in names]


def check_set(
  config: ml_collections.ConfigDict, name: str = "", spec=None
) -> None:
  """Start-up checks of a benchmark set (`config` resolved for it; `spec`
  the named set's own keys). Loads its files, so a bad row is refused here.

  Raises:
    errors.ConfigError: a kind, view reduction or format that do not go
      together, or a task without a text tower.
    errors.DataFileError: a file row that does not fit (named), or videos
      the chunk store lacks.
  """
  kind, data = config.eval.kind, config.data
  where = f"eval.sets.{name}." if name else ""
  if kind not in defaults.EVAL_KINDS:
    raise errors.ConfigError(
      f"{where}eval.kind={kind!r} is not one of {defaults.EVAL_KINDS}"
    )
  if config.eval.views not in defaults.VIEW_REDUCTIONS:
    raise errors.ConfigError(
      f"{where}eval.views={config.eval.views!r} is not one of "
      f"{defaults.VIEW_REDUCTIONS}"
    )
  if data.format not in KIND_FORMATS[kind]:
    raise errors.ConfigError(
      f"{where}eval.kind={kind!r} scores data.format "
      f"{' or '.join(KIND_FORMATS[kind])}, not {data.format!r}"
    )
  if not defaults.needs_text(config.task):
    raise errors.ConfigError(
      f"{where}eval.kind={kind!r} needs a video-text model (task contrastive "
      f"or retrieval), not task {config.task!r}",
      hint="score a fine-tuned classifier with eval.kind='' (its head)",
    )
  if (
    data.format == "ek100_cls"
    and name
    and not spec.data.get("train_annotations")
  ):
    raise errors.ConfigError(
      f"eval.sets.{name}.data.train_annotations is unset: EK-100's zero-shot "
      "classes are its actions, numbered over EPIC_100_train.csv and "
      "EPIC_100_validation.csv together",
      hint=f"set --config.eval.sets.{name}.data.train_annotations to "
      "EPIC_100_train.csv",
    )
  records = annotation_files.load_annotations(data, data.eval_annotations)
  if kind == "zeroshot":
    texts = class_texts(config)
    top = max((r.label for r in records if r.label is not None), default=-1)
    if top >= len(texts):
      raise errors.DataFileError(
        f"{data.eval_annotations}: label {top} but only {len(texts)} classes"
      )
  try:
    videos = video.manifest(data.root)
  except video.VideoReadError as e:
    raise errors.DataError(str(e)) from None
  missing = [(i, r) for i, r in enumerate(records) if r.video_id not in videos]
  if missing:
    rows = "; ".join(_row(data, i, r) for i, r in missing[:_SHOWN])
    more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
    raise errors.DataFileError(
      f"{data.eval_annotations}: {len(missing)} clips of videos with no "
      f"chunks in {data.root} (not in its manifest.jsonl): {rows}{more}",
      hint="chunk these videos into the store (python -m vidjax.data.chunk "
      "SRC DST), or fix the ids in the file; the benchmark needs every clip",
    )


def _row(data, i: int, r) -> str:
  if data.format == "egomcq":
    return (
      f'question "{r.extra["question"]}" choice "{r.extra["choice"]}": '
      f"video_uid {r.video_id!r}"
    )
  return f"row {i + 1}: {r.video_id!r}"


def evaluate(
  config: ml_collections.ConfigDict,
  records: list,
  outputs: dict[str, np.ndarray],
  *,
  encode_tokens: Callable[[np.ndarray], np.ndarray],
  tokenizer: Callable,
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
  """The metrics of a benchmark set (see the module docstring), and the
  vectors they come from.

  Args:
    config: the run config resolved for the set.
    records: the set's clip records, in file order.
    outputs: the evaluation outputs of every view: `video_emb` [M, D],
      `text_emb` [M, D], `index` [M] (the record), `valid` [M].
    encode_tokens: int32[eval.batch_size, L] -> float[eval.batch_size, D],
      the run's text tower.
    tokenizer: the run's tokenizer.

  Returns:
    (metrics, embeddings): unprefixed metrics; `video` float32[N, D] (each
    clip read, views averaged; `index` int[N] its record) and `text`
    float32[M, D] (the class embeddings, or EgoMCQ's queries; `text_ids`
    int[M] the class or question), L2-normalised.
  """
  out = common.valid_outputs(outputs)
  ids, video = metrics.average_views(
    zeroshot.l2_normalize(out["video_emb"]), out["index"]
  )
  emb = {"video": zeroshot.l2_normalize(video), "index": ids}
  if config.eval.kind == "egomcq":
    return _egomcq(config, records, out, emb)
  class_emb = zeroshot.class_embeddings(
    encode_tokens,
    tokenizer,
    class_texts(config),
    tuple(config.eval.templates),
    batch_size=config.eval.batch_size,
  )
  emb.update(text=class_emb, text_ids=np.arange(len(class_emb)))
  ids, scores = zeroshot.classify(
    out["video_emb"], class_emb, out["index"], config.eval.views
  )
  if config.data.format == "charades_ego":
    labels = np.zeros(scores.shape, np.int8)
    for row, i in enumerate(ids):
      labels[row, records[i].extra["labels"]] = 1
    result = metrics.charades_map(scores, labels)
    positive = labels[labels.any(1)]
    scored = positive.any(0)
    result["chance_mAP"] = float(positive[:, scored].mean(0).mean())
    return result, emb
  labels = np.array([records[i].label for i in ids])
  result = metrics.topk_accuracy(scores, labels, ks=(1, 5))
  result["mean_class_acc"] = metrics.mean_class_accuracy(scores, labels)
  result["chance_top1"] = 1.0 / scores.shape[1]
  return result, emb


def _egomcq(config, records, out, emb):
  """EgoMCQ: questions whose 5 candidates were all read, scored."""
  ids, video_emb = metrics.average_views(out["video_emb"], out["index"])
  _, text_emb = metrics.average_views(out["text_emb"], out["index"])
  k = benchmark_files.EGOMCQ_CHOICES
  questions = len(records) // k
  have = np.zeros(len(records), bool)
  have[ids] = True
  complete = have.reshape(questions, k).all(1)
  where = np.full(len(records), -1)
  where[ids] = np.arange(len(ids))
  rows = where.reshape(questions, k)[complete]  # [Q', 5] into ids.
  first = [records[k * q] for q in np.flatnonzero(complete)]
  answers = np.array([r.extra["answer"] for r in first])
  types = np.array([r.extra["types"] for r in first])
  result = {}
  for cosine, suffix in ((False, ""), (True, "_cosine")):  # LaViLa's first.
    scores = metrics.egomcq_scores(
      text_emb[rows[:, 0]], video_emb[rows], cosine=cosine
    )
    accuracy = metrics.egomcq_accuracy(scores, answers, types)
    result.update({f"{n}{suffix}": v for n, v in accuracy.items()})
  result["chance_acc"] = 1.0 / k
  result["questions_left_out"] = int(questions - complete.sum())
  emb["text"] = zeroshot.l2_normalize(text_emb[rows[:, 0]])
  emb["text_ids"] = np.flatnonzero(complete)
  return result, emb
