"""Annotation files -> clip records (Ego4D, EPIC-Kitchens-100, Kinetics, JSONL).

A `ClipRecord` names a video (the chunker's `video_id`, the source file's
stem), a span in seconds and a caption and/or class label. Loaders read the
formats as released and report bad rows as `ValueError: FILE:LINE: problem`:
Ego4D narrations as LaViLa/AVION ship them (pickles, read only with
`allow_pickle=True`; convert once with `python -m vidjax.data.annotations
convert-ego4d IN.pkl OUT.jsonl --allow-pickle`), EPIC-Kitchens-100 action and
multi-instance retrieval (MIR) files, Kinetics-400/600/700 CSVs and a generic
JSONL. `load_records(kind, path, **kw)` dispatches on `kind`.
"""
from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import json
import os
import pickle
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

PathLike = str | os.PathLike

# Kinetics clips as the ActivityNet crawler names them (`abc_000014_000024`).
KINETICS_VIDEO_ID_FORMAT = '{youtube_id}_{time_start:06d}_{time_end:06d}'
_FIELDS = ('video_id', 'start', 'end', 'text', 'label')
_TIMESTAMP = re.compile(r'(\d+):([0-5]?\d):([0-5]?\d(?:\.\d*)?)')


@dataclasses.dataclass(frozen=True)
class ClipRecord:
  """One annotated clip.

  Attributes:
    video_id: the video's id in the chunk manifest.
    start: clip start in seconds on the video's timeline.
    end: clip end in seconds (>= start).
    text: caption/narration, if any.
    label: class id, if any.
    extra: dataset-specific fields (ids, verb/noun classes, alternative
      narrations, ...); not part of the hash.
  """
  video_id: str
  start: float
  end: float
  text: str | None = None
  label: int | None = None
  extra: dict = dataclasses.field(default_factory=dict, hash=False)


def _error(where: str, message: str) -> ValueError:
  return ValueError(f'{where}: {message}' if where else message)


def parse_timestamp(value: str, where: str = '',
                    column: str = 'timestamp') -> float:
  """`HH:MM:SS.ff` (any number of decimals) -> seconds."""
  match = _TIMESTAMP.fullmatch(value.strip())
  if match is None:
    raise _error(where, f'{column} {value!r} is not HH:MM:SS.ff')
  hours, minutes, seconds = match.groups()
  return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def _int(value: str, where: str, column: str) -> int:
  try:
    return int(value)
  except (TypeError, ValueError):
    raise _error(where, f'{column} {value!r} is not an integer') from None


def _span(start: Any, end: Any, where: str) -> tuple[float, float]:
  try:
    start, end = float(start), float(end)
  except (TypeError, ValueError):
    raise _error(where,
                 f'start/end {start!r}/{end!r} are not numbers') from None
  if not 0 <= start <= end:
    raise _error(where, f'need 0 <= start <= end, got start={start} end={end}')
  return start, end


def _read_csv(path: PathLike,
              required: Sequence[str]) -> Iterator[tuple[str, dict]]:
  """Yields `('FILE:LINE', row)`, after checking the header for `required`."""
  with open(path, newline='', encoding='utf-8-sig') as f:
    reader = csv.DictReader(f)
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
      raise _error(f'{os.fspath(path)}:1', f'missing column(s) {missing}; '
                   f'the header is {reader.fieldnames}')
    for row in reader:
      yield f'{os.fspath(path)}:{reader.line_num}', row


# ---------------------------------------------------------------- JSONL ----


def load_jsonl(path: PathLike) -> list[ClipRecord]:
  """One JSON object per line: `video_id`, `start`, `end` (seconds), optional
  `text` (str) and `label` (int); other keys go to `extra`."""
  records = []
  with open(path, encoding='utf-8') as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f'{os.fspath(path)}:{line_no}'
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise _error(where, f'not JSON ({e.msg})') from None
      if not isinstance(obj, dict) or 'video_id' not in obj:
        raise _error(where, 'expected an object with video_id, start, end')
      start, end = _span(obj.get('start'), obj.get('end'), where)
      text, label = obj.get('text'), obj.get('label')
      if text is not None and not isinstance(text, str):
        raise _error(where, f'text {text!r} is not a string')
      if label is not None and type(label) is not int:
        raise _error(where, f'label {label!r} is not an integer')
      extra = {k: v for k, v in obj.items() if k not in _FIELDS}
      records.append(
          ClipRecord(str(obj['video_id']), start, end, text, label, extra))
  return records


def write_jsonl(records: Sequence[ClipRecord], path: PathLike) -> int:
  """Writes records in `load_jsonl`'s format; returns how many."""
  with open(path, 'w', encoding='utf-8') as f:
    for r in records:
      if set(r.extra) & set(_FIELDS):
        raise ValueError(f'{r.video_id}: extra keys {sorted(r.extra)} clash '
                         f'with the record fields {_FIELDS}')
      obj = {k: getattr(r, k) for k in _FIELDS if getattr(r, k) is not None}
      f.write(json.dumps(obj | r.extra, ensure_ascii=False) + '\n')
  return len(records)


# ------------------------------------------------------------- pickles ----

# All the Ego4D lists and relevancy matrices need: numpy arrays and scalars
# (old and new module paths), and `_codecs.encode` for protocol-2 bytes.
_SAFE_GLOBALS = {('numpy', 'ndarray'), ('numpy', 'dtype'),
                 ('_codecs', 'encode')} | {
                     (m, n) for m in ('numpy.core.multiarray',
                                      'numpy._core.multiarray')
                     for n in ('_reconstruct', 'scalar')}


class _DataUnpickler(pickle.Unpickler):

  def find_class(self, module, name):
    if (module, name) in _SAFE_GLOBALS:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f'refusing to load {module}.{name}: only '
                                 'plain data and numpy arrays are expected')


def _load_pickle(path: PathLike, allow_pickle: bool, command: str) -> Any:
  """Unpickles `path` if allowed; even then only data and numpy arrays."""
  name = os.fspath(path)
  if not allow_pickle:
    raise ValueError(
        f'{name}: unpickling can run code stored in the file; pass '
        'allow_pickle=True if you trust it, or convert it once with '
        f'`python -m vidjax.data.annotations {command} {name} OUT '
        '--allow-pickle`')
  with open(path, 'rb') as f:
    try:
      return _DataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError,
            ImportError) as e:
      raise ValueError(f'{name}: cannot unpickle ({e})') from e


def _jsonable(value: Any, where: str) -> Any:
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, (list, tuple, np.ndarray)):
    return [_jsonable(v, where) for v in value]
  if value is None or isinstance(value, (str, int, float, bool)):
    return value
  raise _error(where, f'unexpected value of type {type(value).__name__}')


# --------------------------------------------------------------- Ego4D ----


def load_ego4d(path: PathLike, *,
               allow_pickle: bool = False) -> list[ClipRecord]:
  """Ego4D narration clips from LaViLa/AVION's pickle or its JSONL conversion.

  Pickled entries are `(video_uid, start_second, end_second, narration)`, or
  5-tuples with a trailing value (a narrator score in LaViLa's generated
  sets), kept as `extra['score']`. A list narration (LaViLa's rephrased and
  narrator files) gives `text` = its first element and `extra['texts']` = the
  list; LaViLa draws one at random per step.

  Args:
    path: a `.pkl` (needs `allow_pickle=True`) or `.jsonl` file.
    allow_pickle: opt in to unpickling; only plain data and numpy values are
      accepted even then.

  Returns:
    The records, in file order.
  """
  if os.fspath(path).endswith('.jsonl'):
    return load_jsonl(path)
  entries = _load_pickle(path, allow_pickle, 'convert-ego4d')
  if not isinstance(entries, (list, tuple)):
    raise _error(os.fspath(path), 'expected a list of tuples, got '
                 f'{type(entries).__name__}')
  records = []
  for i, entry in enumerate(entries):
    where = f'{os.fspath(path)}[{i}]'
    if not isinstance(entry, (tuple, list)) or len(entry) not in (4, 5):
      raise _error(where, 'expected (video_uid, start, end, narration'
                   f'[, score]), got {entry!r}')
    start, end = _span(entry[1], entry[2], where)
    text, extra = entry[3], {}
    if isinstance(text, (list, tuple)) and text:
      extra['texts'] = [str(t) for t in text]
      text = extra['texts'][0]
    if not isinstance(text, str):
      raise _error(where, f'narration {text!r} is not a string or a list')
    if len(entry) == 5:
      extra['score'] = _jsonable(entry[4], where)
    records.append(ClipRecord(str(entry[0]), start, end, text, None, extra))
  return records


# ----------------------------------------------------- EPIC-Kitchens-100 ----


def _read_epic(path: PathLike) -> Iterator[tuple[str, ClipRecord]]:
  """EK-100 action/retrieval CSV rows -> ('FILE:LINE', unlabelled record)."""
  for where, row in _read_csv(
      path, ('video_id', 'start_timestamp', 'stop_timestamp')):
    start, end = (parse_timestamp(row[c], where, c)
                  for c in ('start_timestamp', 'stop_timestamp'))
    if end < start:
      raise _error(where, 'stop_timestamp is before start_timestamp')
    extra: dict[str, Any] = {
        k: row[k] for k in ('narration_id', 'participant_id') if row.get(k)}
    for column in ('verb_class', 'noun_class'):
      if row.get(column):
        extra[column] = _int(row[column], where, column)
    if row.get('all_noun_classes'):
      try:
        extra['all_noun_classes'] = [
            int(c) for c in ast.literal_eval(row['all_noun_classes'])]
      except (ValueError, SyntaxError, TypeError):
        raise _error(where, f"all_noun_classes {row['all_noun_classes']!r} "
                     'is not a list of integers') from None
    text = row.get('narration') or None
    yield where, ClipRecord(row['video_id'], start, end, text, None, extra)


def ek100_action_map(
    csv_paths: PathLike | Sequence[PathLike]) -> dict[tuple[int, int], int]:
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
    for where, row in _read_csv(path, ('verb_class', 'noun_class')):
      verb = _int(row['verb_class'], where, 'verb_class')
      keys.add(f"{verb}:{_int(row['noun_class'], where, 'noun_class')}")
  return {tuple(map(int, key.split(':'))): i
          for i, key in enumerate(sorted(keys))}


def load_ek100_cls(
    path: PathLike, *, label: str = 'action',
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
  if label not in ('action', 'verb', 'noun'):
    raise ValueError(f"label must be 'action', 'verb' or 'noun', not {label!r}")
  if label == 'action' and action_map is None:
    raise ValueError('label="action" needs action_map=ek100_action_map('
                     '[train_csv, validation_csv]) so ids agree across splits')
  records = []
  for where, r in _read_epic(path):
    if 'verb_class' not in r.extra or 'noun_class' not in r.extra:
      raise _error(where, 'verb_class/noun_class missing (a test file?)')
    pair = (r.extra['verb_class'], r.extra['noun_class'])
    if label == 'action':
      if pair not in action_map:
        raise _error(where, f'verb/noun pair {pair} is not in the action map')
      value = action_map[pair]
    else:
      value = pair[0] if label == 'verb' else pair[1]
    records.append(dataclasses.replace(r, label=value))
  return records


def load_ek100_mir(path: PathLike) -> list[ClipRecord]:
  """EK-100 retrieval clips (EPIC_100_retrieval_{train,test}.csv): `text` is
  the narration; record i is row i of the relevancy matrix."""
  return [r for _, r in _read_epic(path)]


def load_ek100_mir_sentences(path: PathLike) -> list[tuple[str, str]]:
  """The unique captions (EPIC_100_retrieval_{train,test}_sentence.csv) as
  `(narration_id, narration)`: caption j is column j of the relevancy matrix,
  and narration_id names a clip that carries it."""
  return [(row['narration_id'], row['narration'])
          for _, row in _read_csv(path, ('narration_id', 'narration'))]


def load_relevancy(path: PathLike, *, allow_pickle: bool = False) -> np.ndarray:
  """The EK-100 MIR relevancy matrix, `float[num_clips, num_captions]`.

  Reads `.npy`, `.npz` (its only array, or the one named 'relevancy') or the
  distributed `caption_relevancy_EPIC_100_retrieval_{train,test}.pkl`
  (needs `allow_pickle=True`, or convert it once with `convert-relevancy`).
  The dtype stays as stored, so metrics match the official ones.
  """
  name = os.fspath(path)
  if name.endswith('.npy'):
    matrix = np.load(name, allow_pickle=False)
  elif name.endswith('.npz'):
    with np.load(name, allow_pickle=False) as data:
      keys = list(data.keys())
      if 'relevancy' not in keys and len(keys) != 1:
        raise _error(name, f"several arrays {keys}, none named 'relevancy'")
      matrix = data['relevancy' if 'relevancy' in keys else keys[0]]
  else:
    matrix = np.asarray(_load_pickle(path, allow_pickle, 'convert-relevancy'))
  if matrix.ndim != 2 or not np.issubdtype(matrix.dtype, np.number):
    raise _error(name, 'expected a 2-D numeric matrix, got '
                 f'{matrix.dtype}{list(matrix.shape)}')
  return matrix


# ------------------------------------------------------------- Kinetics ----


def load_label_map(path: PathLike) -> dict[str, int]:
  """Class name -> id from a JSON object, or from a text file with one name
  per line (line order gives the ids)."""
  name = os.fspath(path)
  with open(name, encoding='utf-8') as f:
    content = f.read()
  if name.endswith('.json'):
    mapping = json.loads(content)
    if not (isinstance(mapping, dict)
            and all(type(v) is int for v in mapping.values())):
      raise _error(name, 'expected a JSON object of class name -> integer id')
    return mapping
  names = [line.strip() for line in content.splitlines() if line.strip()]
  if len(set(names)) != len(names):
    raise _error(name, 'class names repeat')
  return {n: i for i, n in enumerate(names)}


def load_kinetics(path: PathLike, *,
                  label_map: Mapping[str, int] | PathLike | None = None,
                  video_id_format: str = KINETICS_VIDEO_ID_FORMAT,
                  trimmed: bool = True) -> list[ClipRecord]:
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
  rows = list(_read_csv(path, ('youtube_id', 'time_start', 'time_end')))
  labelled = bool(rows) and 'label' in rows[0][1]
  if isinstance(label_map, (str, os.PathLike)):
    label_map = load_label_map(label_map)
  elif label_map is None:
    names = sorted({row.get('label', '') for _, row in rows})
    label_map = {n: i for i, n in enumerate(names)}
  records = []
  for where, row in rows:
    t0, t1 = _span(row['time_start'], row['time_end'], where)
    times = {k: int(t) if t.is_integer() else t
             for k, t in (('time_start', t0), ('time_end', t1))}
    try:
      video_id = video_id_format.format(
          youtube_id=row['youtube_id'], label=row.get('label', ''), **times)
    except (KeyError, ValueError, IndexError) as e:
      raise _error(where,
                   f'video_id_format {video_id_format!r}: {e!r}') from None
    extra = {'youtube_id': row['youtube_id'], 'split': row.get('split', '')}
    label = None
    if labelled:
      if row['label'] not in label_map:
        raise _error(where, f"label {row['label']!r} is not in the label map")
      label, extra['label_name'] = label_map[row['label']], row['label']
    start, end = (0.0, t1 - t0) if trimmed else (t0, t1)
    records.append(ClipRecord(video_id, start, end, None, label, extra))
  return records


# ---------------------------------------------------- dispatcher and CLI ----

LOADERS = {
    'ego4d': load_ego4d,
    'ek100_cls': load_ek100_cls,
    'ek100_mir': load_ek100_mir,
    'kinetics': load_kinetics,
    'jsonl': load_jsonl,
}


def load_records(kind: str, path: PathLike, **kwargs) -> list[ClipRecord]:
  """Loads `path` with the loader for `kind`, a key of `LOADERS`."""
  if kind not in LOADERS:
    raise ValueError(f'unknown annotation kind {kind!r}; expected one of '
                     f'{sorted(LOADERS)}')
  return LOADERS[kind](path, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
  """One-time conversions of pickled annotations to formats safe to load."""
  parser = argparse.ArgumentParser(prog='python -m vidjax.data.annotations')
  commands = parser.add_subparsers(dest='command', required=True)
  for command, what in (('convert-ego4d', 'Ego4D narration pickle -> JSONL'),
                        ('convert-relevancy', 'EK-100 MIR relevancy -> .npy')):
    sub = commands.add_parser(command, help=what)
    sub.add_argument('src')
    sub.add_argument('dst')
    sub.add_argument('--allow-pickle', action='store_true',
                     help='required: you trust SRC (unpickling can run code)')
  args = parser.parse_args(argv)
  if not args.allow_pickle:
    parser.error(f'refusing to unpickle {args.src} without --allow-pickle '
                 '(unpickling can run code stored in the file)')
  if args.command == 'convert-ego4d':
    count = write_jsonl(load_ego4d(args.src, allow_pickle=True), args.dst)
    print(f'wrote {count} records to {args.dst}')
  else:
    matrix = load_relevancy(args.src, allow_pickle=True)
    with open(args.dst, 'wb') as f:  # np.save(name) would append '.npy'.
      np.save(f, matrix, allow_pickle=False)
    print(f'wrote {matrix.dtype}{list(matrix.shape)} to {args.dst}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
