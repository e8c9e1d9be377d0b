"""Annotation files -> clip records (Ego4D, EPIC-Kitchens-100, Kinetics, JSONL).

A `ClipRecord` names a video (the chunker's `video_id`, the source file's
stem), a span in seconds and a caption and/or class label. Loaders read the
formats as released and report bad rows as `ValueError: FILE:LINE: problem`:

  ego4d          Ego4D narrations as LaViLa/AVION ship them: ego4d_train.pkl,
                 ego4d_val.pkl, and LaViLa's LLM-generated
                 ego4d_train.rephraser.no_punkt_top3.pkl and
                 ego4d_train.narrator_63690737.return_10.pkl, whose
                 narrations are lists (pickles are read only with
                 `allow_pickle=True`; convert once with `python -m
                 vidjax.data.annotations convert-ego4d IN.pkl OUT.jsonl
                 --allow-pickle`)
  ek100_cls      EPIC_100_{train,validation}.csv            (see `ek100`)
  ek100_mir      EPIC_100_retrieval_{train,test}.csv        (see `ek100`)
  kinetics       Kinetics-400/600/700 CSVs (label,youtube_id,time_start,...)
  kinetics_list  VideoMAE/AVION lists: `path num_frames label` lines
  jsonl          generic: video_id, start, end, text and/or label
  egomcq, egtea, charades_ego, charades_ego_trimmed
                 the field's benchmarks (see `benchmark_files`)

`load_records(kind, path, **kw)` dispatches on `kind`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
import json
import math
import os
from typing import NoReturn

import numpy as np

from vidjax.base import errors
from vidjax.data.annotations.benchmark_files import (
  load_charades_ego,
  load_charades_ego_trimmed,
  load_egomcq,
  load_egtea,
)
from vidjax.data.annotations.ek100 import (
  check_relevancy_shape,
  ek100_action_map,
  load_ek100_cls,
  load_ek100_mir,
  load_ek100_mir_sentences,
  load_relevancy,
)
from vidjax.data.annotations.records import (
  FIELDS,
  ClipRecord,
  PathLike,
  error,
  jsonable,
  load_pickle,
  parse_timestamp,
  read_csv,
  read_lines,
  span,
  to_int,
)

__all__ = [
  "ClipRecord",
  "FORMATS",
  "LOADERS",
  "check_relevancy_shape",
  "ek100_action_map",
  "format_hint",
  "load_ego4d",
  "load_ek100_cls",
  "load_ek100_mir",
  "load_ek100_mir_sentences",
  "load_jsonl",
  "load_kinetics",
  "load_kinetics_list",
  "load_label_map",
  "load_records",
  "load_relevancy",
  "parse_timestamp",
  "write_jsonl",
]

# Kinetics clips as the ActivityNet crawler names them (`abc_000014_000024`).
KINETICS_VIDEO_ID_FORMAT = "{youtube_id}_{time_start:06d}_{time_end:06d}"


# ---------------------------------------------------------------- JSONL ----


def load_jsonl(path: PathLike) -> list[ClipRecord]:
  """One JSON object per line: `video_id`, `start`, `end` (seconds), optional
  `text` (str) and `label` (int); other keys go to `extra`."""
  records = []
  for where, line in read_lines(path):
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      csv = "," in line and not line.lstrip().startswith(("{", "["))
      raise error(
        where,
        f"not JSON ({e.msg} at column {e.colno}): expected "
        "one JSON object per line"
        + ("; this line looks like CSV" if csv else ""),
      ) from None
    if not isinstance(obj, dict) or "video_id" not in obj:
      raise error(
        where,
        'expected a JSON object with "video_id", "start", '
        '"end" (and "text" or "label")',
      )
    start, end = span(obj.get("start"), obj.get("end"), where)
    text, label = obj.get("text"), obj.get("label")
    if text is not None and not isinstance(text, str):
      raise error(where, f"text {text!r} is not a string")
    if label is not None and type(label) is not int:
      raise error(where, f"label {label!r} is not an integer")
    extra = {k: v for k, v in obj.items() if k not in FIELDS}
    records.append(
      ClipRecord(str(obj["video_id"]), start, end, text, label, extra)
    )
  return records


def write_jsonl(records: Sequence[ClipRecord], path: PathLike) -> int:
  """Writes records in `load_jsonl`'s format; returns how many."""
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      if set(r.extra) & set(FIELDS):
        raise ValueError(
          f"{r.video_id}: extra keys {sorted(r.extra)} clash "
          f"with the record fields {FIELDS}"
        )
      obj = {k: getattr(r, k) for k in FIELDS if getattr(r, k) is not None}
      f.write(json.dumps(obj | r.extra, ensure_ascii=False) + "\n")
  return len(records)


# --------------------------------------------------------------- Ego4D ----


def load_ego4d(
  path: PathLike, *, allow_pickle: bool = False
) -> list[ClipRecord]:
  """Ego4D narration clips from LaViLa/AVION's pickle or its JSONL conversion.

  Pickled entries are `(video_uid, start_second, end_second, narration)`, or
  5-tuples with a trailing value (LaViLa's narrator file: the list of its
  narrations' NLLs), kept as `extra['score']`. A list narration (LaViLa's
  rephraser and narrator files) gives `text` = its first element and
  `extra['texts']` = the list; in training each element draws one of them
  with its own random generator (`loader.ClipLoader`), as LaViLa/AVION's
  `random.choice` does, but reproducibly.

  Args:
    path: a `.pkl` (needs `allow_pickle=True`) or `.jsonl` file.
    allow_pickle: opt in to unpickling; only plain data and numpy values are
      accepted even then.

  Returns:
    The records, in file order.
  """
  if os.fspath(path).endswith(".jsonl"):
    return load_jsonl(path)
  entries = load_pickle(path, allow_pickle, "convert-ego4d")
  if not isinstance(entries, (list, tuple)):
    raise error(
      os.fspath(path),
      f"expected a list of tuples, got {type(entries).__name__}",
    )
  records = []
  for i, entry in enumerate(entries):
    where = f"{os.fspath(path)}[{i}]"
    if not isinstance(entry, (tuple, list)) or len(entry) not in (4, 5):
      raise error(
        where,
        f"expected (video_uid, start, end, narration[, score]), got {entry!r}",
      )
    start, end = span(entry[1], entry[2], where)
    text, extra = entry[3], {}
    if isinstance(text, (list, tuple)) and text:
      extra["texts"] = [str(t) for t in text]
      text = extra["texts"][0]
    if not isinstance(text, str):
      raise error(where, f"narration {text!r} is not a string or a list")
    if len(entry) == 5:
      extra["score"] = jsonable(entry[4], where)
    records.append(ClipRecord(str(entry[0]), start, end, text, None, extra))
  return records


# ------------------------------------------------------------- Kinetics ----


def load_label_map(path: PathLike) -> dict[str, int]:
  """Class name -> id from a JSON object, or from a text file with one name
  per line (line order gives the ids)."""
  name = os.fspath(path)
  with open(name, encoding="utf-8") as f:
    content = f.read()
  if name.endswith(".json"):
    mapping = json.loads(content)
    if not (
      isinstance(mapping, dict)
      and all(type(v) is int for v in mapping.values())
    ):
      raise error(name, "expected a JSON object of class name -> integer id")
    return mapping
  names = [line.strip() for line in content.splitlines() if line.strip()]
  if len(set(names)) != len(names):
    raise error(name, "class names repeat")
  return {n: i for i, n in enumerate(names)}


def load_kinetics(
  path: PathLike,
  *,
  label_map: Mapping[str, int] | PathLike | None = None,
  video_id_format: str = KINETICS_VIDEO_ID_FORMAT,
  trimmed: bool = True,
) -> list[ClipRecord]:
  """Kinetics-400/600/700 clips (`label,youtube_id,time_start,time_end,split`).

  Args:
    path: the CSV; test files without `label` give unlabelled records.
    label_map: class name -> id, or a file for `load_label_map`. None: this
      file's class names sorted and numbered from 0 (the usual convention;
      pass the training map when reading a partial file).
    video_id_format: `str.format` pattern for video ids, with fields
      `youtube_id`, `time_start`, `time_end` (ints when whole) and `label`.
      The default, `{youtube_id}_{time_start:06d}_{time_end:06d}`, matches the
      crawler's file names (so the chunker's ids).
    trimmed: the videos are the trimmed clips, so a clip spans
      `[0, time_end - time_start]` seconds of its file. False: whole videos
      (use '{youtube_id}'), spanning `[time_start, time_end]`.

  Returns:
    Records with `label` (when labelled) and `extra` holding `youtube_id`,
    `split` and `label_name`.
  """
  rows = list(read_csv(path, ("youtube_id", "time_start", "time_end")))
  labelled = bool(rows) and "label" in rows[0][1]
  if isinstance(label_map, (str, os.PathLike)):
    label_map = load_label_map(label_map)
  elif label_map is None:
    names = sorted({row.get("label", "") for _, row in rows})
    label_map = {n: i for i, n in enumerate(names)}
  records = []
  for where, row in rows:
    t0, t1 = span(row["time_start"], row["time_end"], where)
    times = {
      k: int(t) if t.is_integer() else t
      for k, t in (("time_start", t0), ("time_end", t1))
    }
    try:
      video_id = video_id_format.format(
        youtube_id=row["youtube_id"], label=row.get("label", ""), **times
      )
    except (KeyError, ValueError, IndexError) as e:
      raise error(
        where, f"video_id_format {video_id_format!r}: {e!r}"
      ) from None
    extra = {"youtube_id": row["youtube_id"], "split": row.get("split", "")}
    label = None
    if labelled:
      if row["label"] not in label_map:
        raise error(where, f"label {row['label']!r} is not in the label map")
      label, extra["label_name"] = label_map[row["label"]], row["label"]
    start, end = (0.0, t1 - t0) if trimmed else (t0, t1)
    records.append(ClipRecord(video_id, start, end, None, label, extra))
  return records


def load_kinetics_list(path: PathLike) -> list[ClipRecord]:
  """VideoMAE/AVION video lists: one `path num_frames label` line per video.

  AVION's k400_320p_train_list.txt / k400_val_list.txt, e.g.
  `train_320px/0074cdXclLU_000047_000057.mp4 300 104`. The video id is the
  file name without extension (the chunker's id); a clip spans the whole
  video (`end` = inf: to the video's last frame), as AVION samples it.

  Returns:
    Records with `label` and `extra` holding `path` and `num_frames`.
  """
  records = []
  for where, line in read_lines(path):
    fields = line.rsplit(None, 2)  # The path may contain spaces.
    if len(fields) != 3:
      raise error(where, f'expected "path num_frames label", got {line!r}')
    video, frames, label = fields
    num_frames = to_int(frames, where, "num_frames")
    if num_frames < 1:
      raise error(where, f"num_frames {num_frames} is not positive")
    video_id = os.path.splitext(os.path.basename(video))[0]
    records.append(
      ClipRecord(
        video_id,
        0.0,
        math.inf,
        None,
        to_int(label, where, "label"),
        {"path": video, "num_frames": num_frames},
      )
    )
  return records


# ---------------------------------------------------- dispatcher and CLI ----

# What each `data.format` reads, for the messages about a file that does not.
FORMATS = {
  "jsonl": 'JSON Lines, one JSON object per line: {"video_id": "bikes", '
  '"start": 0.0, "end": 4.5, "text": "a caption"} (or "label": 3)',
  "ego4d": "LaViLa/AVION's Ego4D pickles (ego4d_train.pkl), or their JSONL "
  "conversion (convert-ego4d)",
  "ek100_cls": "EPIC-Kitchens-100's EPIC_100_train.csv / "
  "EPIC_100_validation.csv (columns video_id, start_timestamp, "
  "stop_timestamp, verb_class, noun_class)",
  "ek100_mir": "EPIC-Kitchens-100's EPIC_100_retrieval_train.csv / "
  "_test.csv (columns narration_id, video_id, start_timestamp, "
  "stop_timestamp, narration)",
  "kinetics": "Kinetics CSVs (columns label, youtube_id, time_start, time_end)",
  "kinetics_list": "AVION/VideoMAE lists: one 'path num_frames label' line "
  "per video",
  "egomcq": 'Ego4D\'s egomcq.json (an object keyed "0".."N-1" of query, '
  "choices, answer, types)",
  "egtea": "EGTEA Gaze+'s train_split1.txt / test_split1.txt ('clip_name "
  "action verb noun' lines) with action_idx.txt beside them",
  "charades_ego": "Charades-Ego's CharadesEgo_v1_{train,test}_only1st.csv "
  "(columns id, actions, length) with Charades_v1_classes.txt beside them",
  "charades_ego_trimmed": "the Charades-Ego CSVs, one clip per action span",
}


def format_hint(kind: str) -> str:
  """What `data.format=kind` reads, and how to choose another."""
  return (
    f"data.format={kind!r} reads {FORMATS[kind]}; for another format "
    f"set --config.data.format ({', '.join(FORMATS)})"
  )


LOADERS = {
  "ego4d": load_ego4d,
  "ek100_cls": load_ek100_cls,
  "ek100_mir": load_ek100_mir,
  "kinetics": load_kinetics,
  "kinetics_list": load_kinetics_list,
  "jsonl": load_jsonl,
  "egomcq": load_egomcq,
  "egtea": load_egtea,
  "charades_ego": load_charades_ego,
  "charades_ego_trimmed": load_charades_ego_trimmed,
}


def load_records(
  kind: str, path: PathLike | Sequence[PathLike], **kwargs
) -> list[ClipRecord]:
  """Loads `path` with the loader for `kind`, a key of `LOADERS`.

  Several paths (e.g. LaViLa's rephraser and narrator files) are read in
  order and their records concatenated, as AVION's `ConcatDataset`.
  """
  if kind not in LOADERS:
    raise ValueError(
      f"unknown annotation kind {kind!r}; expected one of {sorted(LOADERS)}"
    )
  if isinstance(path, (str, os.PathLike)):
    return LOADERS[kind](path, **kwargs)
  return [r for p in path for r in LOADERS[kind](p, **kwargs)]


def main(argv: Sequence[str] | None = None) -> int:
  """One-time conversions of pickled annotations to formats safe to load."""
  parser = argparse.ArgumentParser(prog="python -m vidjax.data.annotations")
  commands = parser.add_subparsers(dest="command", required=True)
  for command, what in (
    ("convert-ego4d", "Ego4D narration pickle -> JSONL"),
    ("convert-relevancy", "EK-100 MIR relevancy -> .npy"),
  ):
    sub = commands.add_parser(command, help=what)
    sub.add_argument("src")
    sub.add_argument("dst")
    sub.add_argument(
      "--allow-pickle",
      action="store_true",
      help="required: you trust SRC (unpickling can run code)",
    )
  args = parser.parse_args(argv)
  if not args.allow_pickle:
    parser.error(
      f"refusing to unpickle {args.src} without --allow-pickle "
      "(unpickling can run code stored in the file)"
    )
  ego4d = args.command == "convert-ego4d"
  try:
    data = (load_ego4d if ego4d else load_relevancy)(
      args.src, allow_pickle=True
    )
  except (errors.UserError, OSError, ValueError) as e:
    _refuse(parser, args.src, e)
  try:
    if ego4d:
      wrote = f"{write_jsonl(data, args.dst)} records"
    else:
      with open(args.dst, "wb") as f:  # np.save(name) would append '.npy'.
        np.save(f, data, allow_pickle=False)
      wrote = f"{data.dtype}{list(data.shape)}"
  except OSError as e:
    _refuse(parser, args.dst, e)
  print(f"wrote {wrote} to {args.dst}")
  return 0


def _refuse(
  parser: argparse.ArgumentParser, path: str, e: Exception
) -> NoReturn:
  """Exits 2 with the error's message, naming `path`: bad input gets no
  traceback."""
  message = e.describe() if isinstance(e, errors.UserError) else str(e)
  if path not in message:
    message = f"{path}: {message}"
  parser.exit(errors.EXIT_USAGE, f"{parser.prog}: error: {message}\n")
