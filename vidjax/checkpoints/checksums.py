"""A checkpoint's files and their checksums: written at commit, checked at restore.

`write(step_dir)` records the size and CRC-32 of every file of a checkpoint
step in `step_dir/checksums.json`. `vidjax.checkpoints.checkpoint.Checkpointer` calls it
once every process's files are written and before Orbax commits the step
(renames it into place), so a committed step always has its list; process 0
writes it. `verify(step_dir)` reads every listed file once and says what is
wrong: a missing file, a size that differs (a truncated file), contents that
differ (a flipped byte). A step without the list (written before vidjax
kept one) is used unverified, with one line saying so.

Orbax rewrites one file while committing (`_CHECKPOINT_METADATA`, the
commit time): it is only required to exist. Files added after the list was
written (Orbax's `commit_success.txt`) are not checked.

    python -m vidjax.checksums WORKDIR/checkpoints/STEP   # checks one step
    python -m vidjax.checksums WORKDIR   # each of its steps
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import zlib

from absl import logging

from vidjax.base import whole_files

MANIFEST = "checksums.json"
# Rewritten by Orbax while it commits the step: only its presence is checked.
PRESENCE_ONLY = ("_CHECKPOINT_METADATA",)
_CHUNK = 8 << 20  # Bytes read at a time.
_MAX_PROBLEMS = 3  # Named in a report; the rest are counted.


def _files(step_dir: str) -> list[str]:
  """Every file under `step_dir`, as sorted relative POSIX paths."""
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.relpath(os.path.join(root, name), step_dir)
      out.append(path.replace(os.sep, "/"))
  return sorted(p for p in out if p != MANIFEST)


def _crc32(path: str) -> int:
  """CRC-32 of a file's bytes, read in chunks (zlib releases the GIL)."""
  crc, buffer = 0, bytearray(_CHUNK)
  view = memoryview(buffer)
  with open(path, "rb", buffering=0) as f:
    while n := f.readinto(buffer):
      crc = zlib.crc32(view[:n], crc)
  return crc


def _map(fn, items: list) -> list:
  """fn over items on a few threads (the files of a step are read in parallel)."""
  workers = min(8, os.cpu_count() or 1, len(items) or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(fn, items))


def write(step_dir) -> dict:
  """Writes `step_dir/checksums.json`: {path: [size, crc32]} of every file.

  Returns:
    {"algorithm": "crc32", "files": {relative path: [bytes, crc32 or None]}}
    (None: presence only, see `PRESENCE_ONLY`).
  """
  step_dir = os.fspath(step_dir)
  files = _files(step_dir)
  paths = [os.path.join(step_dir, f) for f in files]
  crcs = _map(
    lambda p: None if os.path.basename(p) in PRESENCE_ONLY else _crc32(p), paths
  )
  manifest = {
    "algorithm": "crc32",
    "files": {
      f: [os.path.getsize(p), crc] for f, p, crc in zip(files, paths, crcs)
    },
  }
  # Whole, and on disk before Orbax commits the step.
  with whole_files.replaced(os.path.join(step_dir, MANIFEST), sync=True) as f:
    json.dump(manifest, f, indent=0)
  return manifest


def _problem(
  step_dir: str, name: str, size: int, crc: int | None
) -> str | None:
  path = os.path.join(step_dir, name)
  try:
    actual = os.path.getsize(path)
    if crc is None:
      return None
    if actual != size:
      truncated = " (truncated)" if actual < size else ""
      return f"{name} has {actual} bytes, {size} when saved{truncated}"
    if _crc32(path) != crc:
      return f"{name} has changed since it was saved (its checksum differs)"
  except FileNotFoundError:
    return f"{name} is missing"
  except OSError as e:
    return f"{name} does not read ({e.strerror or e})"
  return None


def is_array_data(name: str) -> bool:
  """Whether a step's file (relative path) holds array bytes: Orbax's
  OCDBT data files, `state/d/*` and `state/ocdbt.process_<i>/d/*`; the
  others are metadata (manifests, JSON), small."""
  return "d" in name.split("/")[:-1]


def verify(step_dir, part: str | None = None) -> str | None:
  """What is wrong with a checkpoint step's files, or None if nothing is.

  Reads every file listed in `checksums.json` once (several at a time). A
  step without the list is not verified (an info line says so, unless
  `part` is 'arrays').

  Args:
    step_dir: a checkpoint step's directory.
    part: 'metadata' or 'arrays' (`is_array_data`) for those files only;
      None: every file.

  Returns:
    None if intact (or unverifiable), else one line naming the damaged files
    and what is wrong, e.g. "state/_METADATA is missing".
  """
  step_dir = os.fspath(step_dir)
  try:
    with open(os.path.join(step_dir, MANIFEST), encoding="utf-8") as f:
      listed = json.load(f)["files"]
  except FileNotFoundError:
    if part == "arrays":
      return None
    logging.info(
      "%s has no %s (saved before vidjax kept checksums): "
      "used without verifying its files",
      step_dir,
      MANIFEST,
    )
    return None
  except OSError as e:
    return f"{MANIFEST} does not read ({e.strerror or e})"
  except (ValueError, KeyError, TypeError) as e:
    return f"{MANIFEST} does not read ({e})"
  if part is not None:
    arrays = part == "arrays"
    listed = {n: v for n, v in listed.items() if is_array_data(n) == arrays}
  # Largest first: the threads finish together.
  names = sorted(listed, key=lambda n: -listed[n][0])
  problems = [
    p for p in _map(lambda n: _problem(step_dir, n, *listed[n]), names) if p
  ]
  if not problems:
    return None
  problems.sort()
  more = len(problems) - _MAX_PROBLEMS
  return "; ".join(problems[:_MAX_PROBLEMS]) + (
    f"; and {more} more damaged files" if more > 0 else ""
  )


def step_dirs(path: str) -> list[str] | None:
  """The checkpoint steps a path names, oldest first, or None if none.

  A step (it has `checksums.json` or Orbax's `_CHECKPOINT_METADATA`) names
  itself; a checkpoints folder its finished steps (directories named by
  their step number); a run directory those of its `checkpoints/`.
  """
  if not os.path.isdir(path):
    return None
  if any(
    os.path.exists(os.path.join(path, n)) for n in (MANIFEST, *PRESENCE_ONLY)
  ):
    return [path]
  folder = path
  if os.path.isdir(os.path.join(path, "checkpoints")):
    folder = os.path.join(path, "checkpoints")
  steps = sorted(
    (n for n in os.listdir(folder) if n.isdigit()), key=int
  )  # Orbax's unfinished steps have longer names.
  steps = [os.path.join(folder, n) for n in steps]
  return [s for s in steps if os.path.isdir(s)] or None


def main(argv: list[str]) -> int:
  """`python -m vidjax.checksums PATH...`: 0 if every step is intact, 1 if
  one is damaged, 2 if a path names no checkpoint step."""
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.checksums",
    description="Checks checkpoint steps' files against the checksums "
    "recorded when each step was saved. Exit status: 0 every step intact "
    "(or saved without checksums, said), 1 a step damaged, 2 a path that "
    "names no checkpoint step.",
  )
  parser.add_argument(
    "paths",
    nargs="+",
    metavar="PATH",
    help="a checkpoint step (WORKDIR/checkpoints/STEP), a checkpoints "
    "folder or a run directory (each of its steps)",
  )
  args = parser.parse_args(argv[1:])
  damaged = 0
  for path in args.paths:
    steps = step_dirs(path)
    if steps is None:
      what = (
        "does not exist"
        if not os.path.exists(path)
        else (
          "is not a checkpoint step, a checkpoints folder or a run directory"
        )
      )
      parser.exit(
        2,
        f"{parser.prog}: error: {path} {what}\n  hint: give "
        "WORKDIR/checkpoints/STEP, WORKDIR/checkpoints or WORKDIR\n",
      )
    for step_dir in steps:
      if not os.path.exists(os.path.join(step_dir, MANIFEST)):
        print(
          f"{step_dir}: no {MANIFEST} (saved before vidjax kept "
          "checksums), not verified"
        )
        continue
      problem = verify(step_dir)
      print(f"{step_dir}: {problem or 'intact'}")
      damaged += problem is not None
  return int(damaged > 0)
