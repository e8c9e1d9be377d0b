"""A run's data, checked before the first step: paths, vocabulary, annotations.

    check_paths(config, keys)             unset or missing paths, all named
    load_tokenizer(config)                CLIP's vocabulary (found if unset),
                                          `model.text.vocab_size` 0 -> its size
    reports = check_annotations(config, splits, needs_text=..., needs_label=...)
    check_chunk_files(config, reports)    the manifest against the chunk files
    stop_if_unusable(reports, config, workdir)  too many bad rows: stop
    report(reports, config, workdir)      summary, warnings, bad rows file

Every annotation row is checked against the chunk store's manifest: its video
id is known (else close matches are suggested, e.g. 'Bikes' for 'bikes'), its
span lies in the video (a start at or past the end, or an end past twice the
length, e.g. milliseconds given as seconds), it has a caption when the task
needs text and a label when it needs labels (within `model.num_classes`;
0 takes the number from the training labels). Bad rows are listed in
`WORKDIR/bad_rows_<split>.jsonl`; training leaves them out, evaluation keeps
them (a row's position may matter, e.g. for a relevancy matrix), but an
evaluation row without the caption or label it is scored by stops the run.
More than `data.max_bad_row_fraction` of a file's rows (and more than
`MIN_BAD_ROWS`) stops the run with the numbers, as does a file with no
usable row. Evaluation labels that never occur in training are a warning.

The videos the rows use are checked against their chunk files: the last
chunk the manifest's frame count implies exists and no chunk follows it;
the first few videos' last chunk is opened to compare its frames and rate.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import json
import math
import os

from absl import logging
import jax
import ml_collections

from vidjax.base import errors, rundir
from vidjax.data import annotations, tokenizer as tokenizer_lib, video
from vidjax.data.annotations import annotation_files

# A span may end a little past the video (rounding, a shorter download): its
# frames are clamped to the video. Past this many times its length it is not
# the video's time line any more.
MAX_END_OVER_LENGTH = 2.0
# A few bad rows are tolerated whatever the fraction: a small file is not
# stopped by its first typo (unless data.max_bad_row_fraction is 0).
MIN_BAD_ROWS = 2
_EXAMPLES = 3  # Example rows shown per kind of problem.
_UNSCORABLE = ("no_text", "no_label")  # What an evaluation cannot keep.

KINDS = {  # kind -> how the summary counts it: one, several
  "unknown_video": ("unknown video id", "unknown video ids"),
  "outside_video": ("span outside its video", "spans outside their video"),
  "no_text": ("row without a caption", "rows without a caption"),
  "no_label": ("row without a label", "rows without a label"),
  "bad_label": (
    "label outside model.num_classes",
    "labels outside model.num_classes",
  ),
}


def check_paths(config: ml_collections.ConfigDict, keys: list[str]) -> None:
  """Stops at start-up, naming every path in `keys` that is unset or missing.

  Keys are dotted (`data.root`, `eval.sets.ek100_mir.relevancy`); a value may
  list several files separated by commas.
  """
  problems = []
  for key in keys:
    value = functools.reduce(
      lambda node, part: node[part], key.split("."), config
    )
    for path in annotation_files.split_paths(value) or [value]:
      if not path or not os.path.exists(path):
        problems.append(
          f"{key} = {path!r} ({'unset' if not path else 'not found'})"
        )
  if problems:
    raise errors.PathError(
      "data paths to fix:\n  " + "\n  ".join(problems),
      hint="set them with --config.KEY=PATH",
    )


def load_tokenizer(
  config: ml_collections.ConfigDict,
) -> tokenizer_lib.Tokenizer:
  """The CLIP tokenizer of `data.vocab` (unset: CLIP's vocabulary, which
  vidjax ships), making texts of `model.text.context_length` tokens.

  An unset `data.vocab` stays unset, so that a run's config.json names no
  machine's path for it (the run can move). Sets `model.text.vocab_size` to
  the file's size when it is 0.
  """
  vocab = config.data.vocab
  if not vocab:
    vocab = tokenizer_lib.find_clip_vocab()
    if vocab is None:
      raise errors.PathError(
        "data.vocab is unset and CLIP's vocabulary is not in this install "
        f"of vidjax ({tokenizer_lib.SHIPPED_VOCAB})",
        hint="reinstall vidjax (pip install -e .), or pass "
        f"--config.data.vocab=PATH to CLIP's {tokenizer_lib.CLIP_VOCAB_FILE}",
      )
    logging.info("data.vocab: CLIP's vocabulary (%s)", vocab)
  else:
    check_paths(config, ["data.vocab"])
  try:
    tokenizer = tokenizer_lib.Tokenizer(
      vocab, context_length=config.model.text.context_length
    )
  except ValueError as e:
    raise errors.ConfigError(
      f"data.vocab: {e}",
      hint="it should be a gzip "
      f"BPE merges file like {tokenizer_lib.CLIP_VOCAB_FILE}",
    ) from e
  text = config.model.text
  if text.vocab_size == 0:
    text.vocab_size = tokenizer.vocab_size
  elif tokenizer.vocab_size > text.vocab_size:
    raise errors.ConfigError(
      f"{vocab} has {tokenizer.vocab_size} tokens but "
      f"model.text.vocab_size is {text.vocab_size}",
      hint=f"set --config.model.text.vocab_size={tokenizer.vocab_size} (or 0:"
      " the vocabulary's size)",
    )
  return tokenizer


@dataclasses.dataclass
class Report:
  """One annotation file, checked.

  Attributes:
    split: 'train' or 'eval'.
    path: the annotation file.
    records: all its rows, in file order.
    bad: row index -> its problems, as (kind, detail) pairs.
    warnings: what the run should hear about the file, but goes on with.
  """

  split: str
  path: str
  records: list
  bad: dict[int, list[tuple[str, str]]]
  warnings: list[str] = dataclasses.field(default_factory=list)

  @property
  def fraction(self) -> float:
    return len(self.bad) / max(len(self.records), 1)

  def too_many(self, limit: float) -> bool:
    """More bad rows than `limit` of the file allows (at least MIN_BAD_ROWS)."""
    allowed = max(limit * len(self.records), MIN_BAD_ROWS) if limit > 0 else 0
    return len(self.bad) > allowed

  @property
  def unscorable(self) -> dict[int, list[tuple[str, str]]]:
    """Evaluation rows without the caption or label they are scored by."""
    if self.split == "train":
      return {}
    return {
      i: [p for p in problems if p[0] in _UNSCORABLE]
      for i, problems in self.bad.items()
      if any(kind in _UNSCORABLE for kind, _ in problems)
    }

  @property
  def good_records(self) -> list:
    return [r for i, r in enumerate(self.records) if i not in self.bad]

  def kept_records(self) -> list:
    """What the run uses: training leaves the bad rows out."""
    return self.good_records if self.split == "train" else self.records

  def summary(self, limit: float, bad_rows_file: str | None) -> str:
    """'train.jsonl: 3 of 40 rows are bad (7.5%; ...)' and one line per kind."""
    name = os.path.basename(self.path)
    if not self.bad:
      return f"{self.split} {name}: {len(self.records)} rows, all good"
    listed = f", listed in {bad_rows_file}" if bad_rows_file else ""
    if not self.good_records:
      head = f"none of its {len(self.records)} rows is usable{listed}"
    elif self.unscorable:
      head = (
        f"{len(self.unscorable)} of {len(self.records)} rows cannot be "
        f"scored{listed}"
      )
    elif self.too_many(limit):
      head = (
        f"{len(self.bad)} of {len(self.records)} rows are bad "
        f"({self.fraction:.1%}; the limit is data.max_bad_row_fraction="
        f"{limit}){listed}"
      )
    else:  # Within the limit: say the rule, since the share may exceed it.
      what = (
        "left out, training goes on"
        if self.split == "train"
        else "kept in the evaluation"
      )
      allowed = int(max(limit * len(self.records), MIN_BAD_ROWS))
      head = (
        f"{len(self.bad)} of {len(self.records)} rows "
        f"{'is' if len(self.bad) == 1 else 'are'} bad ({self.fraction:.1%})"
        f"{listed}; {what}: up to {allowed} bad rows are allowed here "
        f"(data.max_bad_row_fraction={limit} of the rows, at least "
        f"{MIN_BAD_ROWS})"
      )
    shown = self.unscorable if self.good_records else self.bad
    return "\n  ".join(
      [f"{self.split} {name}: {head}"] + _examples(shown or self.bad)
    )

  def write_bad_rows(self, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
      for row, problems in sorted(self.bad.items()):
        r = self.records[row]
        line = {
          "row": row + 1,
          "problems": [d for _, d in problems],
          **{
            k: getattr(r, k)
            for k in ("video_id", "start", "end", "text", "label")
          },
          **r.extra,
        }
        if line["end"] == math.inf:  # A whole video (Kinetics lists).
          line["end"] = None
        f.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")


def _examples(bad: dict[int, list[tuple[str, str]]]) -> list[str]:
  """One line per kind of problem: its count and the first few rows."""
  examples = collections.defaultdict(list)
  for row, problems in sorted(bad.items()):
    for kind, detail in problems:
      examples[kind].append(f"row {row + 1}: {detail}")
  return [
    f"{len(rows)} {KINDS[kind][len(rows) > 1]}, e.g. "
    f"{'; '.join(rows[:_EXAMPLES])}"
    for kind, rows in examples.items()
  ]


def _suggest(video_id: str, videos: dict, lower: dict, close: bool) -> str:
  match = lower.get(video_id.lower())
  if match is None and close:  # difflib is slow on big stores: examples only.
    found = difflib.get_close_matches(video_id, list(videos), n=1, cutoff=0.6)
    match = found[0] if found else None
  return f" (did you mean {match!r}?)" if match else ""


def _other_keys(record, what: str, field: str) -> str:
  """' (it has 'caption': the caption goes under 'text')' when a key is off."""
  keys = [k for k, v in record.extra.items() if v not in (None, "")]
  return (
    f" (it has {', '.join(map(repr, keys))}: {what} goes under {field!r})"
    if keys
    else ""
  )


def _row_problems(
  r, videos, lower, *, needs_text, needs_label, num_classes, detailed: bool
) -> list[tuple[str, str]]:
  problems = []
  info = videos.get(r.video_id)
  if info is None:
    problems.append(
      (
        "unknown_video",
        f"{r.video_id!r} is not in the chunk "
        f"store{_suggest(r.video_id, videos, lower, detailed)}",
      )
    )
  else:
    length = info.num_frames / float(info.frame_rate)
    # An infinite end is a whole-video record (AVION's Kinetics lists).
    if r.start >= length or (
      math.isfinite(r.end) and r.end > MAX_END_OVER_LENGTH * length + 1
    ):
      # Milliseconds: about 1000x too large, and fitting once divided.
      ms = (
        " (milliseconds?)"
        if r.end > 100 * length and r.end / 1000 <= length + 1
        else ""
      )
      problems.append(
        (
          "outside_video",
          f"{r.start:g}-{r.end:g} s but {r.video_id!r} has {length:.1f} s{ms}",
        )
      )
  if needs_text and not (r.text or "").strip():
    problems.append(
      (
        "no_text",
        "no caption in 'text'" + _other_keys(r, "the caption", "text"),
      )
    )
  if needs_label:
    if r.label is None:
      problems.append(
        ("no_label", "no 'label'" + _other_keys(r, "the class", "label"))
      )
    elif num_classes and not 0 <= r.label < num_classes:
      problems.append(
        ("bad_label", f"label {r.label} is not in [0, {num_classes})")
      )
  return problems


def _num_classes(config, labels: set[int]) -> int:
  """`model.num_classes`, set from `labels` (max + 1) when it is 0."""
  model = config.model
  if "num_classes" not in model:  # Only a classifier has classes.
    return 0
  if model.num_classes == 0 and labels:
    model.num_classes = max(labels) + 1
    logging.info("model.num_classes = %d, from the labels", model.num_classes)
  return model.num_classes


def _untrained_labels(
  records, trained: set[int], num_classes: int, train_file: str
) -> list[str]:
  """A warning for the evaluation labels that no training row has (without
  training rows: those outside the model's classes)."""
  if trained:
    untrained, where = (lambda label: label not in trained), f"in {train_file}"
  elif num_classes:
    untrained = lambda label: not 0 <= label < num_classes
    where = f"among the model's {num_classes} classes"
  else:
    return []
  rows = collections.Counter(
    r.label for r in records if r.label is not None and untrained(r.label)
  )
  if not rows:
    return []
  shown = ", ".join(map(str, sorted(rows)[:10])) + (
    f" and {len(rows) - 10} more" if len(rows) > 10 else ""
  )
  return [
    f"{sum(rows.values())} rows have labels that never occur {where} "
    f"({shown}): the model cannot predict them, they count as wrong"
  ]


def check_annotations(
  config: ml_collections.ConfigDict,
  splits,
  *,
  needs_text: bool,
  needs_label: bool,
) -> dict[str, Report]:
  """Loads and checks the annotation files of `splits` ('train', 'eval').

  Reads only; `report` then logs and writes. Raises `errors.DataError` for
  a file that does not load (naming FILE:LINE) or has no rows, or a missing
  manifest.
  """
  data = config.data
  try:
    videos = video.manifest(data.root)
  except video.VideoReadError as e:
    raise errors.DataError(str(e)) from None
  paths = {
    s: data.train_annotations if s == "train" else data.eval_annotations
    for s in splits
  }
  # Unset: no such set (the evaluation is its named sets'): not checked.
  splits = [s for s in splits if paths[s]]
  paths = {s: paths[s] for s in splits}
  files = list(paths.values())
  if needs_label:  # num_classes comes from the training labels.
    files += [p for p in (data.train_annotations, data.eval_annotations) if p]
  records = {}
  for path in dict.fromkeys(files):  # In order: training first.
    try:
      records[path] = annotation_files.load_annotations(data, path)
    except (OSError, ValueError, KeyError) as e:
      # Ours name their file (maybe another: EK-100's action ids read both).
      named = isinstance(e, errors.DataFileError) or path in str(e)
      raise errors.DataError(
        str(e) if named else f"{path}: {e}",
        hint=annotations.format_hint(data.format)
        if data.format in annotations.FORMATS
        else "see docs/data.md for the formats",
      ) from None
  for split in splits:
    if not records[paths[split]]:
      raise errors.DataFileError(
        f"{paths[split]}: no annotation rows",
        hint=f"data.{split}_annotations should name a file with clips",
      )
  trained, num_classes = set(), 0
  if needs_label:  # Without training files: the evaluation's labels.
    trained = {
      r.label
      for r in records.get(data.train_annotations, ())
      if r.label is not None
    }
    num_classes = _num_classes(
      config,
      trained
      or {
        r.label
        for r in records.get(data.eval_annotations, ())
        if r.label is not None
      },
    )
  lower = {v.lower(): v for v in videos}
  reports = {}
  for split in splits:
    recs, bad, shown = records[paths[split]], {}, collections.Counter()
    for i, r in enumerate(recs):
      # An evaluation label outside the classes is scored (as wrong).
      problems = _row_problems(
        r,
        videos,
        lower,
        needs_text=needs_text,
        needs_label=needs_label,
        num_classes=num_classes if split == "train" else 0,
        detailed=shown["unknown_video"] < _EXAMPLES,
      )
      if problems:
        bad[i] = problems
        shown.update(kind for kind, _ in problems)
    reports[split] = Report(split, paths[split], recs, bad)
    if needs_label and split != "train":
      reports[split].warnings = _untrained_labels(
        recs,
        trained,
        num_classes,
        ", ".join(
          map(
            os.path.basename,
            annotation_files.split_paths(data.train_annotations),
          )
        ),
      )
  return reports


def check_chunk_files(
  config: ml_collections.ConfigDict, reports: dict[str, Report]
) -> None:
  """The chunk files of the videos that the kept rows use, against their
  manifest lines (`video.check_chunk_files`)."""
  videos = video.manifest(config.data.root)
  used = {
    r.video_id
    for checked in reports.values()
    for r in checked.kept_records()
    if r.video_id in videos
  }
  video.check_chunk_files(config.data.root, sorted(used))


def _stops(r: Report, limit: float) -> str | None:
  """Why a file stops the run: 'fix' its rows, or a 'fraction' over the limit."""
  if not r.good_records or r.unscorable:
    return "fix"
  return "fraction" if r.too_many(limit) else None


def _write_bad_rows(r: Report, workdir) -> str | None:
  """WORKDIR/bad_rows_<split>.jsonl for a file with bad rows (process 0)."""
  if not r.bad or jax.process_index() != 0:
    return None
  os.makedirs(os.fspath(workdir), exist_ok=True)
  path = os.fspath(rundir.bad_rows(workdir, r.split))
  r.write_bad_rows(path)
  return path


def stop_if_unusable(
  reports: dict[str, Report], config: ml_collections.ConfigDict, workdir
) -> None:
  """Stops the run, before anything is built, on a file it cannot use.

  Only then is something written: the bad rows of those files.

  Raises:
    errors.DataError: more than `data.max_bad_row_fraction` of a file's rows
      are bad, a file has no usable row, or evaluation rows lack what they
      are scored by (the message has the numbers and the first rows of each
      problem; the hint says what helps).
  """
  limit = config.data.max_bad_row_fraction
  stops = {split: _stops(r, limit) for split, r in reports.items()}
  over = [
    r.summary(limit, _write_bad_rows(r, workdir))
    for split, r in reports.items()
    if stops[split]
  ]
  if not over:
    return
  if "fix" in stops.values():  # No fraction would help.
    hint = "fix these rows in the file (see docs/own_videos.md for the format)"
  else:
    needed = max(r.fraction for r in reports.values())
    hint = (
      "fix the rows listed, or leave them out with --config.data."
      f"max_bad_row_fraction={math.ceil(needed * 20) / 20:g}"
    )
  raise errors.DataError("data check: " + "\n".join(over), hint=hint)


def report(
  reports: dict[str, Report], config: ml_collections.ConfigDict, workdir
) -> None:
  """Logs each file's summary and warnings and writes its bad rows, once the
  run is accepted (after `stop_if_unusable`)."""
  for r in reports.values():
    summary = r.summary(
      config.data.max_bad_row_fraction, _write_bad_rows(r, workdir)
    )
    (logging.warning if r.bad else logging.info)("data check: %s", summary)
    for warning in r.warnings:
      logging.warning(
        "data check: %s %s: %s", r.split, os.path.basename(r.path), warning
      )
