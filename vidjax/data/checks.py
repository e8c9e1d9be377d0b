"""A run's data, checked before the first step: paths, vocabulary, annotations.

    check_paths(config, keys)             unset or missing paths, all named
    load_tokenizer(config)                CLIP's vocabulary (found if unset),
                                          `model.text.vocab_size` 0 -> its size
    reports = check_annotations(config, splits, needs_text=..., needs_label=...)
    report(reports, config, workdir)      summary, bad rows file, stop

Every annotation row is checked against the chunk store's manifest: its video
id is known (else close matches are suggested, e.g. 'Bikes' for 'bikes'), its
span lies in the video (a start at or past the end, or an end past twice the
length, e.g. milliseconds given as seconds), it has a caption when the task
needs text and a label when it needs labels (within `model.num_classes`;
0 takes the number from the labels). Bad rows are listed in
`WORKDIR/bad_rows_<split>.jsonl`; training leaves them out, evaluation keeps
them (a row's position may matter, e.g. for a relevancy matrix). More than
`data.max_bad_row_fraction` of a file's rows stops the run with the numbers.
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

from vidjax import errors
from vidjax.data import annotations, pipeline, tokenizer as tokenizer_lib, video

# A span may end a little past the video (rounding, a shorter download): its
# frames are clamped to the video. Past this many times its length it is not
# the video's time line any more.
MAX_END_OVER_LENGTH = 2.0
_EXAMPLES = 1  # Example rows shown per kind of problem.

KINDS = {  # kind -> how the summary counts it: one, several
    "unknown_video": ("unknown video id", "unknown video ids"),
    "outside_video": ("span outside its video", "spans outside their video"),
    "no_text": ("row without a caption", "rows without a caption"),
    "no_label": ("row without a label", "rows without a label"),
    "bad_label": ("label outside model.num_classes",
                  "labels outside model.num_classes"),
}


def check_paths(config: ml_collections.ConfigDict, keys: list[str]) -> None:
  """Stops at start-up, naming every path in `keys` that is unset or missing.

  Keys are dotted (`data.root`, `eval.sets.ek100_mir.relevancy`); a value may
  list several files separated by commas.
  """
  problems = []
  for key in keys:
    value = functools.reduce(lambda node, part: node[part], key.split("."),
                             config)
    for path in pipeline.split_paths(value) or [value]:
      if not path or not os.path.exists(path):
        problems.append(f"{key} = {path!r} "
                        f"({'unset' if not path else 'not found'})")
  if problems:
    raise errors.PathError("data paths to fix:\n  " + "\n  ".join(problems),
                           hint="set them with --config.KEY=PATH")


def load_tokenizer(config: ml_collections.ConfigDict) -> tokenizer_lib.Tokenizer:
  """The CLIP tokenizer of `data.vocab`, found in open_clip when unset.

  Sets `data.vocab` to the file found, and `model.text.vocab_size` to the
  file's size when it is 0.
  """
  if not config.data.vocab:
    found = tokenizer_lib.find_clip_vocab()
    if found is None:
      raise errors.PathError(
          "data.vocab is unset and no CLIP vocabulary was found",
          hint="pass --config.data.vocab=PATH to CLIP's "
          f"{tokenizer_lib.CLIP_VOCAB_FILE} (`pip install open_clip_torch` "
          "ships it, and then it is found)")
    logging.info("data.vocab: CLIP's vocabulary from %s", found)
    config.data.vocab = found
  check_paths(config, ["data.vocab"])
  try:
    tokenizer = tokenizer_lib.Tokenizer(config.data.vocab)
  except ValueError as e:
    raise errors.ConfigError(f"data.vocab: {e}", hint="it should be a gzip "
                             f"BPE merges file like {tokenizer_lib.CLIP_VOCAB_FILE}") from e
  text = config.model.text
  if text.vocab_size == 0:
    text.vocab_size = tokenizer.vocab_size
  elif tokenizer.vocab_size > text.vocab_size:
    raise errors.ConfigError(
        f"{config.data.vocab} has {tokenizer.vocab_size} tokens but "
        f"model.text.vocab_size is {text.vocab_size}",
        hint=f"set --config.model.text.vocab_size={tokenizer.vocab_size} (or 0:"
        " the vocabulary's size)")
  return tokenizer


@dataclasses.dataclass
class Report:
  """One annotation file, checked.

  Attributes:
    split: 'train' or 'eval'.
    path: the annotation file.
    records: all its rows, in file order.
    bad: row index -> its problems, as (kind, detail) pairs.
  """
  split: str
  path: str
  records: list
  bad: dict[int, list[tuple[str, str]]]

  @property
  def fraction(self) -> float:
    return len(self.bad) / max(len(self.records), 1)

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
    what = "left out" if self.split == "train" else "kept in the evaluation"
    lines = [f"{self.split} {name}: {len(self.bad)} of {len(self.records)} rows "
             f"are bad ({self.fraction:.1%}; the limit is "
             f"data.max_bad_row_fraction={limit})"
             + (f", listed in {bad_rows_file}" if bad_rows_file else "")
             + (f"; {what}" if self.fraction <= limit else "")]
    examples = collections.defaultdict(list)
    for row, problems in sorted(self.bad.items()):
      for kind, detail in problems:
        examples[kind].append(f"row {row + 1}: {detail}")
    for kind, rows in examples.items():
      lines.append(f"{len(rows)} {KINDS[kind][len(rows) > 1]}, "
                   f"e.g. {'; '.join(rows[:_EXAMPLES])}")
    return "\n  ".join(lines)

  def write_bad_rows(self, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
      for row, problems in sorted(self.bad.items()):
        r = self.records[row]
        line = {"row": row + 1, "problems": [d for _, d in problems],
                **{k: getattr(r, k) for k in ("video_id", "start", "end", "text",
                                              "label")}, **r.extra}
        if line["end"] == math.inf:  # A whole video (Kinetics lists).
          line["end"] = None
        f.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")


def _suggest(video_id: str, videos: dict, lower: dict, close: bool) -> str:
  match = lower.get(video_id.lower())
  if match is None and close:  # difflib is slow on big stores: examples only.
    found = difflib.get_close_matches(video_id, list(videos), n=1, cutoff=0.6)
    match = found[0] if found else None
  return f" (did you mean {match!r}?)" if match else ""


def _other_keys(record, what: str, field: str) -> str:
  """' (it has 'caption': the caption goes under 'text')' when a key is off."""
  keys = [k for k, v in record.extra.items() if v not in (None, "")]
  return (f" (it has {', '.join(map(repr, keys))}: {what} goes under {field!r})"
          if keys else "")


def _row_problems(r, videos, lower, *, needs_text, needs_label, num_classes,
                  detailed: bool) -> list[tuple[str, str]]:
  problems = []
  info = videos.get(r.video_id)
  if info is None:
    problems.append(("unknown_video", f"{r.video_id!r} is not in the chunk "
                     f"store{_suggest(r.video_id, videos, lower, detailed)}"))
  else:
    length = info.num_frames / float(info.frame_rate)
    # An infinite end is a whole-video record (AVION's Kinetics lists).
    if r.start >= length or (math.isfinite(r.end)
                             and r.end > MAX_END_OVER_LENGTH * length + 1):
      # Milliseconds: about 1000x too large, and fitting once divided.
      ms = (" (milliseconds?)" if r.end > 100 * length and
            r.end / 1000 <= length + 1 else "")
      problems.append(("outside_video", f"{r.start:g}-{r.end:g} s but "
                       f"{r.video_id!r} has {length:.1f} s{ms}"))
  if needs_text and not (r.text or "").strip():
    problems.append(("no_text", "no caption in 'text'" + _other_keys(r, "the caption", "text")))
  if needs_label:
    if r.label is None:
      problems.append(("no_label", "no 'label'" + _other_keys(r, "the class", "label")))
    elif num_classes and not 0 <= r.label < num_classes:
      problems.append(("bad_label", f"label {r.label} is not in [0, {num_classes})"))
  return problems


def _num_classes(config, records_by_path: dict) -> int:
  """`model.num_classes`, set from the labels (max + 1) when it is 0."""
  model = config.model
  if "num_classes" not in model:  # Only a classifier has classes.
    return 0
  if model.num_classes == 0:
    labels = [r.label for recs in records_by_path.values() for r in recs
              if r.label is not None]
    if labels:
      model.num_classes = max(labels) + 1
      logging.info("model.num_classes = %d, from the labels", model.num_classes)
  return model.num_classes


def check_annotations(config: ml_collections.ConfigDict, splits, *,
                      needs_text: bool, needs_label: bool) -> dict[str, Report]:
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
  paths = {s: data.train_annotations if s == "train" else data.eval_annotations
           for s in splits}
  files = set(paths.values())
  if needs_label:  # num_classes comes from the labels of both files.
    files |= {p for p in (data.train_annotations, data.eval_annotations) if p}
  records = {}
  for path in files:
    try:
      records[path] = pipeline.load_annotations(data, path)
    except (OSError, ValueError, KeyError) as e:
      raise errors.DataError(f"{path}: {e}" if path not in str(e) else str(e),
                             hint="fix the file (see the README for the "
                             "formats)") from None
  for split in splits:  # Unset: no such set (named evaluation sets only).
    if paths[split] and not records[paths[split]]:
      raise errors.DataFileError(
          f"{paths[split]}: no annotation rows",
          hint=f"data.{split}_annotations should name a file with clips")
  num_classes = _num_classes(config, records) if needs_label else 0
  lower = {v.lower(): v for v in videos}
  reports = {}
  for split in splits:
    recs, bad, shown = records[paths[split]], {}, collections.Counter()
    for i, r in enumerate(recs):
      problems = _row_problems(r, videos, lower, needs_text=needs_text,
                               needs_label=needs_label, num_classes=num_classes,
                               detailed=shown["unknown_video"] < _EXAMPLES)
      if problems:
        bad[i] = problems
        shown.update(kind for kind, _ in problems)
    reports[split] = Report(split, paths[split], recs, bad)
  return reports


def report(reports: dict[str, Report], config: ml_collections.ConfigDict,
           workdir) -> None:
  """Logs each file's summary, writes its bad rows, stops past the limit.

  Raises:
    errors.DataError: more than `data.max_bad_row_fraction` of a file's rows
      are bad (the message has the numbers and an example of each problem).
  """
  limit = config.data.max_bad_row_fraction
  lines, over = [], []
  for split, r in reports.items():
    path = None
    if r.bad and jax.process_index() == 0:
      os.makedirs(os.fspath(workdir), exist_ok=True)
      path = os.path.join(os.fspath(workdir), f"bad_rows_{split}.jsonl")
      r.write_bad_rows(path)
    (over if r.fraction > limit else lines).append(r.summary(limit, path))
    if r.split == "train" and not r.good_records:
      over.append(f"{r.path}: no usable rows")
  for line in lines:
    logging.info("data check: %s", line)
  if over:
    needed = max(r.fraction for r in reports.values())
    raise errors.DataError(
        "data check: " + "\n".join(over),
        hint="fix the rows listed, or leave them out with "
        f"--config.data.max_bad_row_fraction={math.ceil(needed * 20) / 20:g}")
