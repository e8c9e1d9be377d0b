"""A small synthetic corpus of real H.264 videos, for the demo and the tests.

`prepare(config, workdir)` writes it into the workdir and points
`config.data` at it when `data.synthetic.enabled` and no data path is set:
paths set by the user always win.

Each video is a few segments; in each segment one coloured shape moves across
a textured background, e.g. "a red square moves left". The class label of a
segment is its (shape, colour, motion) triple: 3 x 4 x 4 = 48 classes. Videos
are encoded with libx264, then chunked with the chunker, so every part of the
real pipeline runs on them.

    make_corpus(root) ->
      root/raw/vid000.mp4 ...          sources
      root/chunks/...                  chunk store + manifest.jsonl
      root/{train,val}.jsonl           generic JSONL (video_id, start, end,
                                       text, label)
      root/...                         the same segments in the released
                                       layouts of EPIC-Kitchens-100 (action
                                       and retrieval CSVs, sentence CSVs,
                                       relevancy pickles) and LaViLa (list
                                       narrations): see
                                       `vidjax.data.synthetic.layouts`
      root/settings.json               the settings it was made with
      root/classes.json                class names by label id
      root/egtea, root/charades_ego, root/egomcq.json
                                       the benchmarks' layouts, EGTEA's
                                       cropped clips chunked with the rest:
                                       see `vidjax.data.synthetic.benchmark_files`
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil

from absl import logging
import av
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from vidjax.base import rundir
from vidjax.data import annotations, chunk
from vidjax.data.synthetic import benchmark_files, layouts

DATA_PATH_KEYS = ("root", "train_annotations", "eval_annotations")
SETTINGS = "settings.json"  # make_corpus's arguments, to tell a stale corpus.

SHAPES = ("square", "circle", "triangle")
COLOURS = {
  "red": (230, 40, 40),
  "green": (40, 200, 60),
  "blue": (50, 80, 240),
  "yellow": (240, 220, 40),
}
MOTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


def class_names() -> list[str]:
  """The 48 captions, indexed by label: shape-major, then colour, motion."""
  return [
    f"a {c} {s} moves {m}" for s in SHAPES for c in COLOURS for m in MOTIONS
  ]


def label_of(shape: int, colour: int, motion: int) -> int:
  return (shape * len(COLOURS) + colour) * len(MOTIONS) + motion


def _shape_mask(shape: str, size: int) -> np.ndarray:
  yy, xx = np.mgrid[0:size, 0:size] + 0.5
  if shape == "square":
    return np.ones((size, size), bool)
  if shape == "circle":
    return (yy - size / 2) ** 2 + (xx - size / 2) ** 2 <= (size / 2) ** 2
  return np.abs(xx - size / 2) <= yy / 2  # Triangle pointing up.


def render_segment(
  rng: np.random.Generator,
  shape: int,
  colour: int,
  motion: int,
  num_frames: int,
  height: int,
  width: int,
) -> np.ndarray:
  """uint8[num_frames, height, width, 3]: one shape crossing a texture."""
  base = rng.integers(40, 200, (height // 8 + 2, width // 8 + 2, 3))
  background = np.repeat(np.repeat(base, 8, 0), 8, 1)[:height, :width]
  background = (background * 0.5 + 40).astype(np.uint8)  # Muted, not black.
  size = max(8, min(height, width) // 3)
  mask = _shape_mask(SHAPES[shape], size)
  dx, dy = MOTIONS[list(MOTIONS)[motion]]
  # Start on one side, cross to the other along the motion axis.
  cx0 = (
    rng.uniform(0.3, 0.7) * (width - size)
    if dx == 0
    else (0 if dx > 0 else width - size)
  )
  cy0 = (
    rng.uniform(0.3, 0.7) * (height - size)
    if dy == 0
    else (0 if dy > 0 else height - size)
  )
  frames = np.empty((num_frames, height, width, 3), np.uint8)
  for k in range(num_frames):
    t = k / max(num_frames - 1, 1)
    x = int(round(cx0 + dx * t * (width - size)))
    y = int(round(cy0 + dy * t * (height - size)))
    frames[k] = background
    frames[k, y : y + size, x : x + size][mask] = list(COLOURS.values())[colour]
  return frames


def _write_h264(path: Path, frames: np.ndarray, fps: int) -> None:
  with av.open(str(path), "w") as out:
    stream = out.add_stream("libx264", rate=fps)
    stream.height, stream.width = frames.shape[1:3]
    stream.pix_fmt = "yuv420p"
    stream.codec_context.options = {"crf": "20", "preset": "veryfast"}
    for k, image in enumerate(frames):
      frame = av.VideoFrame.from_ndarray(image, format="rgb24")
      frame.pts = k
      out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def make_corpus(
  root: str | os.PathLike,
  *,
  num_videos: int = 48,
  segments_per_video: int = 2,
  segment_seconds: float = 3.0,
  fps: int = 8,
  height: int = 96,
  width: int = 128,
  val_fraction: float = 0.25,
  chunk_seconds: float = 2.0,
  seed: int = 0,
  progress: bool = True,
) -> Path:
  """Writes the corpus under `root`, unless it is there, complete, and made
  with the same settings (recorded in `root/settings.json`): a corpus made
  with other settings is made anew.

  Returns:
    `root` as a Path; `root/chunks` is the chunk store.
  """
  root = Path(root)
  settings = dict(
    num_videos=num_videos,
    segments_per_video=segments_per_video,
    segment_seconds=segment_seconds,
    fps=fps,
    height=height,
    width=width,
    val_fraction=val_fraction,
    chunk_seconds=chunk_seconds,
    seed=seed,
  )
  done = root / "classes.json"
  if done.exists():
    try:
      made_with = json.loads((root / SETTINGS).read_text())
    except (OSError, ValueError):  # Made before settings were recorded.
      made_with = None
    if made_with == settings:
      return root
    logging.info(
      "%s was made with other settings (%s): making it anew with %s",
      root,
      made_with,
      settings,
    )
    done.unlink()
  raw = root / "raw"
  for stale in (raw, root / "chunks"):  # Left by other settings, or a crash.
    shutil.rmtree(stale, ignore_errors=True)
  raw.mkdir(parents=True)
  rng = np.random.default_rng(seed)
  names = class_names()
  records = []
  seg_frames = int(round(segment_seconds * fps))
  # Split by video so no validation video is seen in training.
  num_val = max(1, int(round(num_videos * val_fraction)))
  egtea = benchmark_files.egtea_videos(num_videos, num_val)
  for v in range(num_videos):
    video_id = f"vid{v:03d}"
    parts = []
    for s in range(segments_per_video):
      shape, colour, motion = (
        int(rng.integers(n)) for n in (len(SHAPES), len(COLOURS), len(MOTIONS))
      )
      parts.append(
        render_segment(rng, shape, colour, motion, seg_frames, height, width)
      )
      label = label_of(shape, colour, motion)
      words = (list(COLOURS)[colour], SHAPES[shape], list(MOTIONS)[motion])
      records.append(
        annotations.ClipRecord(
          video_id,
          s * seg_frames / fps,
          (s + 1) * seg_frames / fps,
          text=names[label],
          label=label,
          extra={
            "verb": f"move-{words[2]}",
            "verb_class": motion,
            "noun": f"{words[0]} {words[1]}",
            "noun_class": shape * len(COLOURS) + colour,
            "words": words,
          },
        )
      )
    _write_h264(raw / f"{video_id}.mp4", np.concatenate(parts), fps)
    if video_id in egtea:
      benchmark_files.write_cropped_clips(
        raw, records[-len(parts) :], parts, fps, _write_h264
      )
  summary = chunk.chunk_videos(
    raw,
    root / "chunks",
    chunk.ChunkOptions(chunk_seconds=chunk_seconds, short_side=0, gop=8),
    progress=progress,
  )
  if summary["failed"]:
    raise RuntimeError(f"chunking the synthetic corpus failed: {summary}")
  val_ids = {f"vid{v:03d}" for v in range(num_videos - num_val, num_videos)}
  splits = {
    split: [r for r in records if (r.video_id in val_ids) == keep]
    for split, keep in (("train", False), ("val", True))
  }
  layouts.write_annotation_files(root, splits, fps, seed)
  benchmark_files.write_benchmark_files(root, splits, names, fps, egtea, seed)
  (root / SETTINGS).write_text(json.dumps(settings, indent=1))
  done.write_text(
    json.dumps(names, indent=1)
  )  # Written last: marks completion.
  return root


def write_vocab(path: str | os.PathLike) -> Path:
  """A tiny CLIP-format BPE vocabulary covering the captions' words.

  Each caption word gets merges that build it from its letters, so it
  tokenizes to one id; anything else falls back to byte tokens. Written as
  gzip text in the format of CLIP's `bpe_simple_vocab_16e6.txt.gz`.
  """
  import gzip

  words = sorted({w for name in class_names() for w in name.split()})
  merges, seen = [], set()
  for word in words:
    pieces = list(word[:-1]) + [word[-1] + "</w>"]
    while len(pieces) > 1:  # Merge left to right: ((r e) d</w>).
      pair = (pieces[0], pieces[1])
      if pair not in seen:
        seen.add(pair)
        merges.append(pair)
      pieces = [pieces[0] + pieces[1]] + pieces[2:]
  path = Path(path)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("#version: 0.2 - vidjax synthetic captions\n")
    f.write("\n".join(f"{a} {b}" for a, b in merges) + "\n")
  return path


def prepare(
  config: ml_collections.ConfigDict, workdir: str | os.PathLike
) -> bool:
  """Points `config.data` at the synthetic corpus when no data is given.

  Only when `data.synthetic.enabled` and none of `data.root`,
  `data.train_annotations`, `data.eval_annotations` is set: a path set by the
  user always wins. The corpus goes to WORKDIR/synthetic; process 0 writes
  it, the others wait, then find it complete (shared workdir) or write their
  own copy (per-machine workdir). `data.vocab`, when unset, becomes the
  corpus's own small vocabulary.

  Returns:
    Whether the synthetic corpus is used.
  """
  spec = config.data.synthetic
  if not spec.enabled:
    return False
  given = [f"data.{k}" for k in DATA_PATH_KEYS if config.data[k]]
  if given:
    logging.info(
      "data: %s given, so the synthetic corpus is not used", ", ".join(given)
    )
    return False
  root = rundir.path(workdir, rundir.SYNTHETIC)

  def make():
    make_corpus(
      root,
      num_videos=spec.num_videos,
      segments_per_video=spec.segments_per_video,
      segment_seconds=spec.segment_seconds,
      height=spec.height,
      width=spec.width,
      seed=spec.seed,
      progress=jax.process_index() == 0,
    )
    if not config.data.vocab and not (root / "vocab.txt.gz").exists():
      write_vocab(root / "vocab.txt.gz")

  if jax.process_index() == 0:
    make()
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("vidjax:synthetic corpus")
    if jax.process_index() != 0:
      make()
  layouts.use_corpus(config, root)
  logging.info(
    "data: the synthetic corpus in %s (set data.root and the "
    "annotation paths to train on your own videos)",
    root,
  )
  return True
