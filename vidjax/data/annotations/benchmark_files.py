"""The field's benchmark files, as released -> clip records and class texts.

  egomcq                Ego4D's EgoMCQ `egomcq.json`: an object keyed "0" ..
                        "N-1"; each question has `query` {clip_text,
                        video_uid, clip_start, clip_end, ...}, `choices` "0"
                        .. "4" (each {video_uid, clip_start, clip_end, ...}),
                        `answer` and `types` (1 inter-video, 2 intra-video).
                        Record 5q+k is candidate k of question q: its clip in
                        the chunked Ego4D video, `text` the query.
  egtea                 EGTEA Gaze+ `train_split1.txt` / `test_split1.txt`
                        (`clip_name action verb noun`, 1-based) with
                        `action_idx.txt` (`Action_Name idx`); the videos are
                        `cropped_clips/<video_id>/<clip_name>.mp4`, chunked
                        (the chunker names each by its clip name). `label`:
                        the action, 0-based; `text`: its name.
  charades_ego          Charades-Ego `CharadesEgo_v1_{train,test}_only1st.csv`
                        (`id`, `script`, `actions` as `cNNN start end;...`,
                        `length` in seconds) with `Charades_v1_classes.txt`
                        (`cNNN name`): one record per (untrimmed) video over
                        its whole length, `extra['labels']` its classes,
                        `text` its script; videos `<id>.mp4`.
  charades_ego_trimmed  the same CSVs, one record per action span (as LaViLa
                        fine-tunes): `label` the class, `text` its name.

The class names file is `data.classes`, or where the datasets ship it: next
to the annotation file (`action_idx.txt`, `Charades_v1_classes.txt`).
Rows that do not fit (an action id outside `action_idx.txt`, a class code
not in the classes file, a malformed `actions` cell) are refused as
`FILE:LINE: problem; fix`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from absl import logging

from vidjax.base import errors
from vidjax.data.annotations.records import (
  ClipRecord,
  PathLike,
  error,
  read_csv,
  read_lines,
  span,
  to_int,
)

# Where each format's class names ship: beside the annotation file.
CLASS_FILES = {
  "egtea": "action_idx.txt",
  "charades_ego": "Charades_v1_classes.txt",
  "charades_ego_trimmed": "Charades_v1_classes.txt",
}
EGOMCQ_CHOICES = 5


def classes_path(
  data_format: str, annotations: PathLike, classes: str = ""
) -> str:
  """`classes` if set, else the released class file beside `annotations`.

  Raises:
    errors.DataFileError: the file is not there.
  """
  path = Path(classes or Path(annotations).parent / CLASS_FILES[data_format])
  if not path.is_file():
    raise errors.DataFileError(
      f"{path}: no such file; {data_format}'s class names "
      f"({CLASS_FILES[data_format]}) ship beside {Path(annotations).name}",
      hint="put it there, or set data.classes (eval.sets.NAME.data.classes) "
      "to it",
    )
  return os.fspath(path)


# ---------------------------------------------------------------- EGTEA ----


def egtea_class_names(path: PathLike) -> list[str]:
  """EGTEA's 106 action names from `action_idx.txt`, index i for id i + 1.

  Names are LaViLa's prompts: underscores as spaces, lower case
  ('Open_fridge 5' -> 'open fridge'). The ids must be 1..N, each once.
  """
  names = {}
  for where, line in read_lines(path):
    fields = line.split()
    if len(fields) < 2:
      raise error(where, f"expected 'Action_Name idx', got {line.strip()!r}")
    idx = to_int(fields[-1], where, "idx")
    if idx in names:
      raise error(where, f"action idx {idx} is given twice")
    names[idx] = " ".join(fields[:-1]).replace("_", " ").lower()
  if sorted(names) != list(range(1, len(names) + 1)):
    missing = sorted(set(range(1, max(names, default=0) + 1)) - set(names))
    raise error(
      os.fspath(path),
      f"action ids must be 1..{len(names)} without gaps; missing {missing[:5]}",
    )
  return [names[i] for i in range(1, len(names) + 1)]


def load_egtea(path: PathLike, *, classes: str = "") -> list[ClipRecord]:
  """EGTEA Gaze+ clips of a split file (see the module docstring)."""
  class_file = classes_path("egtea", path, classes)
  names = egtea_class_names(class_file)
  records = []
  for where, line in read_lines(path):
    fields = line.split()
    if len(fields) < 2:
      raise error(where, f"expected 'clip_name action verb noun', got {line!r}")
    clip, action = fields[0], to_int(fields[1], where, "action")
    if not 1 <= action <= len(names):
      raise error(
        where,
        f"action {action} is not in {class_file} (ids 1-{len(names)}); fix "
        "the row, or set data.classes to the action_idx.txt of this split",
      )
    extra = {"clip_name": clip, "video": "-".join(clip.split("-")[:3])}
    for name, value in zip(("verb", "noun"), fields[2:4]):
      extra[f"{name}_id"] = to_int(value, where, name)
    # A cropped clip is the whole video: end = inf reads to its last frame.
    records.append(
      ClipRecord(clip, 0.0, math.inf, names[action - 1], action - 1, extra)
    )
  return records


# --------------------------------------------------------- Charades-Ego ----


def charades_classes(path: PathLike) -> list[tuple[str, str]]:
  """`(code, name)` of each line of `Charades_v1_classes.txt`, in order
  ('c000 Holding some clothes'); class id i is line i."""
  out = []
  for where, line in read_lines(path):
    code, _, name = line.strip().partition(" ")
    if (
      not (len(code) == 4 and code[0] == "c" and code[1:].isdigit()) or not name
    ):
      raise error(where, f"expected 'cNNN class name', got {line.strip()!r}")
    out.append((code, name.strip()))
  if len({c for c, _ in out}) != len(out):
    raise error(os.fspath(path), "class codes repeat")
  return out


def _actions(cell: str, where: str, ids: dict, class_file: str):
  """The `actions` cell -> [(class id, start, end)]."""
  out = []
  for item in filter(None, (s.strip() for s in cell.split(";"))):
    fields = item.split()
    if len(fields) != 3:
      raise error(
        where,
        f"actions item {item!r} is not 'cNNN start end' (items are "
        "separated by ';'); fix the cell",
      )
    code = fields[0]
    if code not in ids:
      raise error(
        where,
        f"class {code!r} is not in {class_file}; fix the row, or set "
        "data.classes to the Charades_v1_classes.txt these CSVs use",
      )
    start, end = span(fields[1], fields[2], where)
    out.append((ids[code], start, end))
  return out


def load_charades_ego(
  path: PathLike, *, classes: str = "", trimmed: bool = False
) -> list[ClipRecord]:
  """Charades-Ego videos (untrimmed) or action spans (`trimmed`)."""
  fmt = "charades_ego_trimmed" if trimmed else "charades_ego"
  class_file = classes_path(fmt, path, classes)
  table = charades_classes(class_file)
  ids = {code: i for i, (code, _) in enumerate(table)}
  records = []
  for where, row in read_csv(path, ("id", "actions", "length")):
    actions = _actions(row["actions"] or "", where, ids, class_file)
    try:
      length = float(row["length"])
    except ValueError:
      length = -1.0
    if not length > 0:
      raise error(where, f"length {row['length']!r} is not a positive number")
    video_id = row["id"]
    if trimmed:
      for label, start, end in actions:
        records.append(
          ClipRecord(video_id, start, end, table[label][1], label, {})
        )
      continue
    labels = sorted({label for label, _, _ in actions})
    text = (row.get("script") or row.get("descriptions") or "").strip()
    if not text:  # The released rows all have a script; a name otherwise.
      text = "; ".join(table[i][1] for i in labels) or None
    records.append(
      ClipRecord(video_id, 0.0, length, text, None, {"labels": labels})
    )
  return records


def load_charades_ego_trimmed(
  path: PathLike, *, classes: str = ""
) -> list[ClipRecord]:
  return load_charades_ego(path, classes=classes, trimmed=True)


def class_names(data_format: str, annotations: PathLike, classes: str = ""):
  """The class names of an EGTEA or Charades-Ego set, by class id."""
  path = classes_path(data_format, annotations, classes)
  if data_format == "egtea":
    return egtea_class_names(path)
  return [name for _, name in charades_classes(path)]


# ------------------------------------------------------------- EgoMCQ ----


def _mcq_clip(obj, where: str, what: str) -> tuple[str, float, float]:
  if not isinstance(obj, dict) or not {
    "video_uid",
    "clip_start",
    "clip_end",
  } <= set(obj):
    raise error(
      where, f"{what} needs video_uid, clip_start and clip_end, got {obj!r:.80}"
    )
  start, end = obj["clip_start"], obj["clip_end"]
  try:  # EgoVLP reads a time before the video's start as 0 s.
    start, end = (max(float(t), 0.0) for t in (start, end))
  except (TypeError, ValueError):
    pass  # `span` names them.
  start, end = span(start, end, f"{where} {what}")
  return str(obj["video_uid"]), start, end


def load_egomcq(path: PathLike) -> list[ClipRecord]:
  """EgoMCQ questions -> 5 records each (see the module docstring).

  `extra` holds `question` (its key), `choice`, `answer` and `types`.
  """
  name = os.fspath(path)
  with open(path, encoding="utf-8") as f:
    try:
      items = json.load(f)
    except json.JSONDecodeError as e:
      raise error(f"{name}:{e.lineno}", f"not JSON ({e.msg})") from None
  if not isinstance(items, dict) or sorted(items, key=_as_int) != [
    str(i) for i in range(len(items))
  ]:
    raise error(name, 'expected an object keyed "0" .. "N-1" (egomcq.json)')
  records, clamped = [], 0
  for q in range(len(items)):
    where, item = f'{name}["{q}"]', items[str(q)]
    if not isinstance(item, dict) or not {
      "query",
      "choices",
      "answer",
      "types",
    } <= set(item):
      raise error(where, "a question needs query, choices, answer and types")
    query = item["query"]
    text = query.get("clip_text") if isinstance(query, dict) else None
    if not isinstance(text, str) or not text.strip():
      raise error(where, "query.clip_text is missing or empty")
    choices = item["choices"]
    if not isinstance(choices, dict) or sorted(choices) != [
      str(k) for k in range(EGOMCQ_CHOICES)
    ]:
      raise error(where, 'choices must be keyed "0" .. "4"')
    answer, types = item["answer"], item["types"]
    if type(answer) is not int or not 0 <= answer < EGOMCQ_CHOICES:
      raise error(where, f"answer {answer!r} is not 0 .. 4")
    if types not in (1, 2):
      raise error(where, f"types {types!r} is not 1 (inter) or 2 (intra)")
    for k in range(EGOMCQ_CHOICES):
      choice = choices[str(k)]
      uid, start, end = _mcq_clip(choice, where, f'choice "{k}"')
      clamped += _before_zero(choice)
      extra = {"question": q, "choice": k, "answer": answer, "types": types}
      records.append(ClipRecord(uid, start, end, text, None, extra))
  if clamped:
    logging.info(
      "%s: %d candidate clips start before 0 s: read from 0 s, as EgoVLP "
      "reads them",
      name,
      clamped,
    )
  return records


def _before_zero(clip: dict) -> bool:
  try:
    return float(clip["clip_start"]) < 0
  except (TypeError, ValueError):
    return False


def _as_int(key: str) -> int:
  return int(key) if key.isdigit() else -1


# ------------------------------------------------------ EK-100 zero-shot ----


def ek100_class_texts(
  csv_paths, action_map: dict[tuple[int, int], int]
) -> list[list[str]]:
  """Every distinct narration of each EK-100 action (LaViLa's zero-shot
  classes), over the CSVs the action ids are numbered on, by action id."""
  texts: list[dict[str, None]] = [{} for _ in action_map]
  for path in csv_paths:
    for where, row in read_csv(path, ("verb_class", "noun_class", "narration")):
      pair = (
        to_int(row["verb_class"], where, "verb_class"),
        to_int(row["noun_class"], where, "noun_class"),
      )
      if row["narration"].strip():
        texts[action_map[pair]][row["narration"].strip()] = None
  return [list(t) for t in texts]
