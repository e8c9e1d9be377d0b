"""Every moment of your own videos embedded: a searchable INDEX.

    python -m vidjax.embed --config configs/NAME.py[:ARG] \\
        --config.init_from=WEIGHTS --videos SRC --out INDEX \\
        [--window_s S] [--stride_s S] [--config.KEY=VALUE ...]

SRC is a video, a folder of videos (searched recursively) or a `.txt` list,
as `python -m vidjax.data.chunk` takes them, chunked on the way into
INDEX/chunks; or a chunk store already (a folder with manifest.jsonl), read
as it is. Each video is cut into windows of `--window_s` seconds every
`--stride_s` (defaults: `default_window_s`, and half of it), and each window
is read as the recipe reads an evaluation clip (its frames, sampling, size,
centre crop and normalisation: `vidjax.data.pipeline`) and embedded by the
video tower over all local devices. WEIGHTS: anything `init_from` loads (a
vidjax run, AVION's or OpenAI's CLIP). Only video-text (CLIP) recipes embed.

INDEX holds (`Index` in `vidjax.search` reads it):

    embeddings.npy   float16[N, D], L2-normalised: one row per window
    windows.csv      video,start,end: row i of it is row i of embeddings.npy
    index.json       what made it: weights, recipe and overrides, vidjax
                     version, window_s and stride_s, the chunk store, counts
    config.json      the resolved config (the text tower's, for search)
    videos/<id>.npz  each video's rows, written whole once it is embedded
    failed.jsonl     the videos that could not be read, with the reason
    chunks/          the chunk store, when SRC was not one
    vidjax.lock      the run writing it now

A rerun with the same command skips the videos already embedded (a kill,
even `kill -9`, loses at most the video under way) and rewrites the two
index files from every video's rows; a rerun with other weights or windows
is refused. A second run into an INDEX in use is refused (exit 2,
`vidjax.base.rundir`'s lock), and so is a SRC without videos, before the
weights load. A full disk or a read-only INDEX is said in two lines (exit
74; the rerun keeps what was embedded). Videos that cannot be read (chunking fails, or a
window does not decode) are skipped and named at the end (exit 1). An hour
of video at 1 s stride is 3600 rows: 3600 x D x 2 bytes (1.8 MB at D=256).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import dataclasses
import io
import json
import math
import os
from pathlib import Path
import sys
import time

import numpy as np

import vidjax
from vidjax import config as config_lib
from vidjax.base import errors, rundir, whole_files
from vidjax.data import chunk as chunk_lib
from vidjax.search.towers import Encoder, load_encoder

EMBEDDINGS = "embeddings.npy"
WINDOWS = "windows.csv"
INDEX_JSON = "index.json"
VIDEOS = "videos"
FAILED = "failed.jsonl"
CHUNKS = "chunks"
# A window of a recipe that samples `num_frames` over a clip's span
# (segment sampling: the CLIP recipes): about the length of the narrated
# moments they train on (AVION's 4-frame clips cover about 2 s).
SEGMENT_WINDOW_S = 2.0
NOMINAL_FPS = 30.0  # Stride sampling's frames at a usual frame rate.
# What an INDEX's rows depend on: a rerun must give the same.
SETTINGS = ("weights", "recipe", "overrides", "window_s", "stride_s")


def default_window_s(data) -> float:
  """Seconds per window for `config.data`: `SEGMENT_WINDOW_S` for segment
  sampling; the span of `num_frames` frames `stride` apart at 30 fps for
  stride sampling (VideoMAE's 16 x 4: 2.13 s)."""
  if data.sampling == "stride":
    return data.num_frames * data.stride / NOMINAL_FPS
  return SEGMENT_WINDOW_S


def windows(
  duration: float, window_s: float, stride_s: float
) -> list[tuple[float, float]]:
  """(start, end) seconds of a video's windows: every `stride_s`, each
  `window_s` long, the last one ending at the video's end (one window of
  the whole video when it is shorter than `window_s`). Times in ms."""
  if duration <= window_s:
    return [(0.0, round(duration, 3))]
  count = math.floor((duration - window_s) / stride_s + 1e-9) + 1
  out = [
    (round(k * stride_s, 3), round(k * stride_s + window_s, 3))
    for k in range(count)
  ]
  if out[-1][1] < duration - 1e-3:  # The tail gets a window too.
    out.append((round(duration - window_s, 3), round(duration, 3)))
  return out


# ---------------------------------------------------------------------------
# The INDEX directory.
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Summary:
  """What `embed_videos` did. `failed`: (video or file, reason) pairs."""

  index: Path
  embedded: list[str]
  already: list[str]
  failed: list[tuple[str, str]]
  windows: int  # Rows of the index.
  seconds: float  # Embedding time of this run (chunking not counted).
  video_seconds: float  # Video duration embedded by this run.


def _settings(config, spec, overrides, window_s, stride_s) -> dict:
  """What the rows depend on (`SETTINGS`): the weights, the recipe and
  the other overrides as given ("KEY=VALUE"), the windows."""
  given = (o.removeprefix("--").removeprefix("config.") for o in overrides)
  return {
    "weights": os.path.abspath(config.init_from) if config.init_from else "",
    "recipe": spec,
    "overrides": sorted(o for o in given if not o.startswith("init_from=")),
    "window_s": window_s,
    "stride_s": stride_s,
  }


def _check_settings(index: Path, settings: dict) -> None:
  """A rerun must make the rows the INDEX already has."""
  try:
    made = json.loads((index / INDEX_JSON).read_text())
  except FileNotFoundError:
    return
  except ValueError:
    made = {}
  differ = [k for k in SETTINGS if made.get(k) != settings[k]]
  if differ:
    raise errors.WorkdirError(
      f"{index} was made with other settings: "
      + "; ".join(f"{k} {made.get(k)!r}, now {settings[k]!r}" for k in differ),
      hint="use another --out, or delete that index to make it anew",
    )


def _check_videos(videos: str | os.PathLike) -> None:
  """Refuses a SRC without videos (a missing path, an empty folder or
  store, two videos with one id) before anything else is done."""
  src = Path(videos)
  if (src / chunk_lib.MANIFEST).is_file():
    if not chunk_lib.read_manifest(src):
      raise errors.PathError(
        f"--videos {videos}: a chunk store with no videos in its "
        f"{chunk_lib.MANIFEST}",
        hint="chunk videos into it first (python -m vidjax.data.chunk), or "
        "give the videos themselves",
      )
    return
  chunk_lib.sources(src)


def _store(videos: str, index: Path, progress: bool) -> tuple[Path, list, list]:
  """(chunk store, its video ids of SRC, failures) for SRC; chunks SRC into
  INDEX/chunks unless it is a store already."""
  src = Path(videos)
  if (src / chunk_lib.MANIFEST).is_file():
    return src.resolve(), sorted(chunk_lib.read_manifest(src)), []
  store = index / CHUNKS
  summary = chunk_lib.chunk_videos(src, store, progress=progress)
  failed = [
    (f["source"], f["error"].removeprefix(f"{f['source']}: "))
    for f in summary["failed"]
  ]
  wanted = {p.stem for p in chunk_lib.find_videos(src)}
  done = chunk_lib.read_manifest(store)
  return store, sorted(v for v in done if v in wanted), failed


def _write_part(index: Path, video_id: str, rows: np.ndarray, spans) -> None:
  (index / VIDEOS).mkdir(exist_ok=True)
  with whole_files.replaced(index / VIDEOS / f"{video_id}.npz", "wb") as f:
    np.savez(
      f,
      embeddings=rows.astype(np.float16),
      start=np.array([s for s, _ in spans], np.float64),
      end=np.array([e for _, e in spans], np.float64),
    )


def assemble(index: Path) -> int:
  """Rewrites embeddings.npy and windows.csv from every video's rows (in
  video id order); returns the rows."""
  parts = (
    sorted((index / VIDEOS).glob("*.npz")) if (index / VIDEOS).is_dir() else []
  )
  rows, table = [], io.StringIO()
  writer = csv.writer(table, lineterminator="\n")
  writer.writerow(("video", "start", "end"))
  for part in parts:
    with np.load(part) as blob:
      rows.append(blob["embeddings"])
      for start, end in zip(blob["start"], blob["end"]):
        writer.writerow((part.stem, f"{start:g}", f"{end:g}"))
  dim = rows[0].shape[1] if rows else 0
  matrix = np.concatenate(rows) if rows else np.zeros((0, dim), np.float16)
  with whole_files.replaced(index / EMBEDDINGS, "wb") as f:
    np.save(f, matrix)
  with whole_files.replaced(index / WINDOWS) as f:
    f.write(table.getvalue())
  return len(matrix)


# ---------------------------------------------------------------------------
# Embedding.
# ---------------------------------------------------------------------------
def embed_videos(
  config,
  videos: str | os.PathLike,
  out: str | os.PathLike,
  *,
  overrides=(),
  window_s: float | None = None,
  stride_s: float | None = None,
  progress: bool = True,
  encoder: Encoder | None = None,
) -> Summary:
  """Embeds the windows of every video of `videos` into the INDEX `out`.

  Args:
    config: a recipe, "configs/NAME.py[:ARG]" (with `overrides`,
      "KEY=VALUE" strings, `init_from` among them), or its loaded
      ConfigDict with `init_from` set.
    videos: SRC (see the module docstring).
    out: the INDEX directory (created; resumed if it holds videos).
    window_s, stride_s: windows (None: `default_window_s`, half of it).
    progress: a progress bar over the windows, with an ETA.
    encoder: the model to embed with, e.g. `towers.make_encoder` of a run in a
      notebook (None: `load_encoder(config)`, the weights of `init_from`).

  Returns:
    A `Summary`; the index is in `out` (module docstring).

  Raises:
    errors.UserError: a bad config, weights, SRC, or an INDEX that is in
      use or was made with other settings (nothing embedded).
  """
  if isinstance(config, (str, os.PathLike)):
    spec = os.fspath(config)
    path, _, arg = spec.partition(":")
    spec = os.path.abspath(path) + (f":{arg}" if arg else "")
    config = config_lib.load_config(spec, list(overrides))
  else:
    spec, overrides = "(a ConfigDict)", ()
  config = config.copy_and_resolve_references()
  window_s = float(window_s or default_window_s(config.data))
  stride_s = float(stride_s or window_s / 2)
  if not (window_s > 0 and stride_s > 0):
    raise errors.ConfigError(
      f"--window_s {window_s} and --stride_s {stride_s} must be positive"
    )
  if encoder is not None:
    config = encoder.config
  settings = _settings(config, spec, overrides, window_s, stride_s)
  _check_videos(videos)  # Before the weights load and the index is made.
  with rundir.claim(out) as index:
    _check_settings(index, settings)
    if encoder is None:
      encoder = load_encoder(config)
    store, ids, failed = _store(os.fspath(videos), index, progress)
    if not ids and not failed:
      raise errors.PathError(
        f"--videos {videos}: no videos there",
        hint="give a video, a folder or a .txt list of videos (.mp4, .mkv, "
        ".mov, ...), or a chunk store",
      )
    done = {p.stem for p in (index / VIDEOS).glob("*.npz")}
    todo = [v for v in ids if v not in done]
    rundir.write_config(config, index)
    rundir.write_json(
      index / INDEX_JSON,
      {**settings, "vidjax": vidjax.__version__, "store": os.fspath(store)},
      indent=1,
    )
    start = time.perf_counter()
    embedded, seconds, more_failed = embed_windows(
      encoder, store, todo, index, window_s, stride_s, progress
    )
    elapsed = time.perf_counter() - start
    failed += more_failed
    rows = assemble(index)
    written = len(list((index / VIDEOS).glob("*.npz")))
    rundir.write_json(
      index / INDEX_JSON,
      {
        **settings,
        "vidjax": vidjax.__version__,
        "store": os.fspath(store),
        "description": encoder.description,
        "dim": int(config.model.embed_dim),
        "num_frames": int(config.data.num_frames),
        "size": config.data.size,
        "videos": written,
        "windows": rows,
      },
      indent=1,
    )
    with whole_files.replaced(index / FAILED) as f:
      for name, reason in failed:
        f.write(json.dumps({"video": name, "error": reason}) + "\n")
  return Summary(
    index,
    embedded,
    sorted(set(ids) & done),
    failed,
    rows,
    elapsed,
    seconds,
  )


def embed_windows(
  encoder, store, todo, index, window_s, stride_s, progress=True
):
  """Embeds the videos `todo`, writing each one's rows once complete.

  Returns:
    (videos embedded, their seconds of video, [(video, reason)] failed).
  """
  from vidjax.data import pipeline, video
  from vidjax.data.annotations import records as records_lib
  from vidjax.report import console

  spans = {}
  for vid in todo:
    info = video.video_info(store, vid)
    spans[vid] = windows(
      info.num_frames / float(info.frame_rate), window_s, stride_s
    )
  records = [
    records_lib.ClipRecord(vid, s, e) for vid in todo for s, e in spans[vid]
  ]
  if not records:
    return [], 0.0, []
  config = encoder.config.copy_and_resolve_references()
  config.data.update(
    root=os.fspath(store), eval_clips=1, eval_crops=1, max_skip_fraction=1.0
  )
  owner = [i for i, vid in enumerate(todo) for _ in spans[vid]]
  remaining = collections.Counter(owner)
  rows = {i: [] for i in range(len(todo))}
  bad: dict[int, int] = collections.Counter()
  embedded, failed, seconds = [], [], 0.0
  batches = pipeline.make_pipeline(
    config,
    encoder.mesh,
    train=False,
    batch_size=config.eval.batch_size,
    records=records,
  )
  element = 0
  with (
    console.ProgressBar(
      len(records), desc="embed", unit="window", enabled=progress
    ) as bar,
    contextlib.closing(batches),
  ):
    for batch in batches:
      emb = np.asarray(encoder.video(batch["video"]))
      valid = np.asarray(batch["valid"])
      for row in range(len(emb)):
        if element >= len(records):
          break  # Padding.
        v = owner[element]
        rows[v].append(emb[row])
        bad[v] += not valid[row]
        remaining[v] -= 1
        element += 1
        if remaining[v]:
          continue
        vid = todo[v]
        if bad[v]:
          files = sorted(f for f in batches.failures if vid in f) or [vid]
          failed.append(
            (
              vid,
              f"{bad[v]} of {len(spans[vid])} windows could not be read "
              f"({', '.join(files[:3])})",
            )
          )
        else:
          _write_part(index, vid, np.stack(rows[v]), spans[vid])
          embedded.append(vid)
          seconds += spans[vid][-1][1]
        del rows[v]
      bar.update(min(element, len(records)))
  return embedded, seconds, failed


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.embed",
    description=__doc__.split("\n\n")[0],
    epilog="--config.KEY=VALUE overrides any key of the recipe; "
    "--config.init_from=WEIGHTS is required.",
  )
  parser.add_argument("--config", required=True, help="configs/NAME.py[:ARG]")
  parser.add_argument(
    "--videos",
    required=True,
    help="a video, a folder, a .txt list or a chunk store",
  )
  parser.add_argument("--out", required=True, help="the INDEX directory")
  parser.add_argument(
    "--window_s",
    type=float,
    default=None,
    help="seconds per window (default: the recipe's clip, e.g. 2 s)",
  )
  parser.add_argument(
    "--stride_s",
    type=float,
    default=None,
    help="seconds between window starts (default: half a window)",
  )
  parser.add_argument("--quiet", action="store_true", help="no progress bar")
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  overrides, rest = config_lib.split_overrides(argv)
  args = _parser().parse_args(rest)
  try:
    summary = embed_videos(
      args.config,
      args.videos,
      args.out,
      overrides=overrides,
      window_s=args.window_s,
      stride_s=args.stride_s,
      progress=not args.quiet,
    )
  except errors.UserError as e:
    print(f"vidjax.embed: error: {e.describe()}", file=sys.stderr)
    return e.exit_code
  except OSError as e:  # A full disk, a read-only INDEX: two lines.
    error = errors.refused_write(
      e,
      args.out,
      hint="free space (or give a writable --out), then run the same "
      "command: the videos embedded so far are kept",
    )
    if error is None:
      raise  # A bug: its traceback.
    print(f"vidjax.embed: error: {error.describe()}", file=sys.stderr)
    return error.exit_code
  except KeyboardInterrupt:
    print(
      "vidjax.embed: stopped; the videos embedded so far are kept: run the "
      "same command to go on",
      file=sys.stderr,
    )
    return errors.EXIT_PREEMPTED
  print(report(summary))
  return errors.EXIT_FAILED if summary.failed else errors.EXIT_FINISHED


def report(summary: Summary) -> str:
  """The closing lines: what was embedded, how fast, what failed."""
  rate = (
    f" in {summary.seconds:.1f} s ({summary.video_seconds / 3600:.3f} h of "
    f"video: {summary.seconds / max(summary.video_seconds, 1e-9) * 3600:.0f}"
    " s per hour)"
    if summary.embedded
    else ""
  )
  lines = [
    f"indexed {len(summary.embedded)} videos{rate}, "
    f"{len(summary.already)} already in the index; {summary.windows} "
    f"windows in {summary.index}"
  ]
  if summary.failed:
    lines.append(
      f"skipped {len(summary.failed)} unreadable video"
      f"{'s' if len(summary.failed) > 1 else ''} (listed in "
      f"{summary.index / FAILED}):"
    )
    lines += [f"  {name}: {why}" for name, why in summary.failed]
  return "\n".join(lines)
