"""Text search and zero-shot labels over an INDEX of `python -m vidjax.embed`.

    python -m vidjax.search INDEX "someone opens the fridge" ["query" ...]
        [--top 10] [--json] [--html PAGE.html] [--templates "{}"]
    python -m vidjax.search INDEX --labels "cut,wash,open" [--csv OUT.csv]
    python -m vidjax.search INDEX --labels LABELS.txt     (one label a line)

A query is embedded by the text tower of the model that made the index
(its config.json and weights), through the text-prompt classifier of
`vidjax.evaluation.zeroshot` (each query a class of one text, put into every template,
averaged, normalised), and scored by cosine against every window: the table
lists the best `--top` windows with video, start, end and score; `--json`
prints them as JSON. Several queries embed the index once.

`--labels` gives every window the best of the labels (the same classifier,
one class per label) and writes a CSV `video,start,end,label,score`
(default INDEX/labels.csv), then prints per video the label of most of its
windows and its share of them.

`--html PAGE.html` writes a page that opens from disk in any browser: each
query and its hits, each with the middle frame of the window (inlined as
JPEG), the video, the times and the score, linked to the moment (the source
video, else its chunk, at the window's start: `#t=SECONDS`, relative to the
page).

Exit status: 0 done; 1 a damaged INDEX (its file and line named); 2 refused:
the arguments (an empty query, labels that are not UTF-8, an output path in
a missing folder: before the index and the model load), a missing INDEX or
one whose chunk store is gone (with `--html`); 74 an output not written.

    from vidjax.search import Index
    index = Index("INDEX")
    hits = index.query(["a red square moves left"], top=5)[0]
    labels = index.label(["red", "green"])       # per window
"""

from __future__ import annotations

import argparse
import base64
import collections
import csv
import dataclasses
import functools
import html
import json
import os
from pathlib import Path
import sys
import urllib.parse

import numpy as np

from vidjax.base import errors
from vidjax.data import chunk as chunk_lib
from vidjax.evaluation import zeroshot
from vidjax.search import embed, towers

DEFAULT_TEMPLATES = ("{}",)
CONFIG_JSON = "config.json"  # The model's config, as vidjax.embed wrote it.
REMAKE = (
  "rerun the python -m vidjax.embed command that made it (it rewrites the "
  "index files from INDEX/videos/)"
)
LABELS_CSV = "labels.csv"
THUMB_HEIGHT = 144  # Pixels of a thumbnail's height on the page.


@dataclasses.dataclass(frozen=True)
class Hit:
  """One window found: its row in the index, video, seconds and score."""

  row: int
  video: str
  start: float
  end: float
  score: float


class Index:
  """An INDEX directory (`vidjax.search.embed`): rows, windows and the model.

  Attributes:
    path: the directory.
    embeddings: float32[N, D], L2-normalised (stored as float16).
    videos: str[N]; starts, ends: float64[N] seconds.
    info: index.json (weights, recipe, windows, vidjax version, ...).
  """

  def __init__(self, path: str | os.PathLike, encoder=None):
    """`encoder`: the model, if already loaded (`vidjax.search.towers.Encoder`);
    None loads the index's (its config.json and weights) when needed."""
    self.path = Path(path)
    try:
      self.info = json.loads((self.path / embed.INDEX_JSON).read_text())
      with open(self.path / embed.WINDOWS, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
      matrix = np.load(self.path / embed.EMBEDDINGS)
      if encoder is None and not (self.path / CONFIG_JSON).is_file():
        raise FileNotFoundError(f"no {CONFIG_JSON} (the model's config)")
    except FileNotFoundError as e:
      raise errors.PathError(
        f"{self.path}: not a complete index ({e})",
        hint="make it with python -m vidjax.embed ... --out "
        f"{self.path} (a rerun completes an interrupted one)",
      ) from None
    except (OSError, ValueError, EOFError) as e:  # Damaged: say which file.
      raise errors.DataFileError(
        f"{self.path}: a file of the index does not read ({e})", hint=REMAKE
      ) from None
    if matrix.ndim != 2 or not np.issubdtype(matrix.dtype, np.floating):
      raise errors.DataFileError(
        f"{self.path / embed.EMBEDDINGS}: {matrix.dtype}{list(matrix.shape)}, "
        "not one float row per window",
        hint=REMAKE,
      )
    if len(rows) != len(matrix):
      raise errors.DataFileError(
        f"{self.path}: {len(rows)} windows but {len(matrix)} embeddings",
        hint=REMAKE,
      )
    self.embeddings = matrix.astype(np.float32)
    self.videos, self.starts, self.ends = _windows(
      self.path / embed.WINDOWS, rows
    )
    self._encoder = encoder

  @property
  def store(self) -> str:
    """The chunk store the windows were read from: index.json's, else the
    index's own `chunks/` (an index moved with its chunks).

    Raises:
      errors.PathError: neither holds a manifest.
    """
    made = self.info.get("store") or ""
    for store in (made, self.path / embed.CHUNKS):
      if store and (Path(store) / chunk_lib.MANIFEST).is_file():
        return os.fspath(store)
    raise errors.PathError(
      f"{self.path}: its chunk store {made or '(not named)'} is gone (the "
      "thumbnails are read from it)",
      hint="move the store back, or make the index again with python -m "
      "vidjax.embed (search without --html needs no store)",
    )

  def __len__(self) -> int:
    return len(self.embeddings)

  @property
  def encoder(self) -> towers.Encoder:
    """The model that made the index (loaded on first use)."""
    if self._encoder is None:
      import ml_collections

      config = ml_collections.ConfigDict(
        json.loads((self.path / CONFIG_JSON).read_text())
      )
      self._encoder = towers.load_encoder(config)
    return self._encoder

  @functools.cached_property
  def manifest(self) -> dict[str, dict]:
    """The chunk store's manifest entries by video id."""
    return chunk_lib.read_manifest(self.store)

  def text_classes(self, classes, templates=DEFAULT_TEMPLATES) -> np.ndarray:
    """float32[C, D]: `zeroshot.class_embeddings` of `classes` (each a text
    or a list of texts) by the index's text tower."""
    encoder = self.encoder
    return zeroshot.class_embeddings(
      encoder.encode_tokens,
      encoder.tokenizer,
      list(classes),
      tuple(templates),
      batch_size=encoder.text_batch,
    )

  def scores(self, classes, templates=DEFAULT_TEMPLATES) -> np.ndarray:
    """float32[N, C]: every window's cosine with each class."""
    return zeroshot.logits(
      self.embeddings, self.text_classes(classes, templates)
    )

  def query(
    self, queries, top: int = 10, templates=DEFAULT_TEMPLATES
  ) -> list[list[Hit]]:
    """The `top` windows of each query (a str or a list of them), best first."""
    queries = [queries] if isinstance(queries, str) else list(queries)
    scores = self.scores(queries, templates)
    out = []
    for q in range(len(queries)):
      best = np.argsort(-scores[:, q], kind="stable")[:top]
      out.append([self._hit(int(i), scores[i, q]) for i in best])
    return out

  def label(
    self, labels, templates=DEFAULT_TEMPLATES
  ) -> tuple[np.ndarray, np.ndarray]:
    """(int[N] the best label of each window, float32[N] its score)."""
    scores = self.scores(list(labels), templates)
    best = scores.argmax(1)
    return best, scores[np.arange(len(best)), best]

  def _hit(self, row: int, score) -> Hit:
    return Hit(
      row,
      str(self.videos[row]),
      float(self.starts[row]),
      float(self.ends[row]),
      float(score),
    )

  def thumbnail(self, hit: Hit, height: int = THUMB_HEIGHT) -> bytes:
    """JPEG bytes of the middle frame of a hit's window."""
    from vidjax.data import video

    store = self.store
    info = video.video_info(store, hit.video)
    fps = float(info.frame_rate)
    frame = min(int((hit.start + hit.end) / 2 * fps), info.num_frames - 1)
    width = max(2, round(info.width * height / info.height / 2) * 2)
    image = video.read_clip(store, hit.video, [frame], size=(height, width))[0]
    return _jpeg(image)


def _windows(path: Path, rows: list[dict]) -> tuple[np.ndarray, ...]:
  """(str[N] videos, float64[N] starts, float64[N] ends) of windows.csv's
  rows, each checked: a video id that is a plain name, numbers for times."""
  videos, starts, ends = [], [], []
  for line, row in enumerate(rows, 2):
    try:
      vid = row["video"]
      start, end = float(row["start"]), float(row["end"])
    except (KeyError, TypeError, ValueError) as e:
      missing = isinstance(e, KeyError)
      raise errors.DataFileError(
        f"{path}:{line}: "
        + (f"no column {e}" if missing else f"not a window: {row}"),
        hint=REMAKE,
      ) from None
    if not vid or vid in (".", "..") or "/" in vid or "\\" in vid:
      raise errors.DataFileError(
        f"{path}:{line}: video {vid!r} is not a video id (a file name in "
        "the chunk store): nothing was read",
        hint=REMAKE,
      )
    videos.append(vid)
    starts.append(start)
    ends.append(end)
  return np.array(videos, dtype=str), np.array(starts), np.array(ends)


def _jpeg(image: np.ndarray) -> bytes:
  """A JPEG of `image` (uint8[H, W, 3] RGB, even H and W), by the MJPEG
  encoder of PyAV's own FFmpeg: no image library needed."""
  import av

  encoder = av.CodecContext.create("mjpeg", "w")
  encoder.width, encoder.height = image.shape[1], image.shape[0]
  encoder.pix_fmt = "yuvj420p"  # Full-range YUV 4:2:0, as JPEG files are.
  encoder.options = {"qmin": "2", "qmax": "2"}  # Its finest quantiser.
  frame = av.VideoFrame.from_ndarray(image, format="rgb24")
  packets = encoder.encode(frame.reformat(format="yuvj420p"))
  return b"".join(bytes(p) for p in packets + encoder.encode(None))


# ---------------------------------------------------------------------------
# Outputs.
# ---------------------------------------------------------------------------
def table(query: str, hits: list[Hit]) -> str:
  """A query's hits as a text table."""
  width = max([len("video")] + [len(h.video) for h in hits])
  lines = [f"query: {query}", f"  {'video':<{width}}  start    end   score"]
  lines += [
    f"  {h.video:<{width}} {h.start:6.1f} {h.end:6.1f}  {h.score:.4f}"
    for h in hits
  ]
  return "\n".join(lines)


def moment_link(index: Index, hit: Hit, page_dir: Path) -> str:
  """A URL that opens a hit at its moment: the source video the chunk
  store's manifest names (else the chunk holding the start), relative to
  the page's folder, with a media fragment `#t=SECONDS`."""
  store = Path(index.store)
  entry = index.manifest.get(hit.video, {})
  source = entry.get("source")
  if source and os.path.isfile(source):
    path, at = Path(source), hit.start
  else:
    length = float(entry.get("chunk_seconds") or 0)
    k = int(hit.start // length) if length > 0 else 0
    path = store / hit.video / chunk_lib.chunk_name(k, length or 1)
    at = hit.start - k * length
  relative = os.path.relpath(path.resolve(), page_dir.resolve())
  return f"{urllib.parse.quote(Path(relative).as_posix())}#t={at:g}"


def write_html(index: Index, queries, results, path) -> Path:
  """A page of every query's hits with inlined thumbnails (no server); each
  hit links to its moment (`moment_link`). The heading names the index and
  the weights by their last path part (the page may be shared)."""
  path = Path(path)
  weights = index.info.get("weights") or ""
  weights = Path(weights).name if weights else index.info.get("description", "")
  parts = [
    "<!doctype html>\n<html><head><meta charset='utf-8'>"
    f"<title>vidjax search: {html.escape(index.path.name)}</title><style>"
    "body{font-family:sans-serif;margin:2em}"
    ".hits{display:flex;flex-wrap:wrap;gap:12px}"
    ".hit{border:1px solid #ccc;padding:6px;font-size:13px}"
    ".hit img{display:block;height:"
    f"{THUMB_HEIGHT}px}}</style></head><body>",
    f"<h1>{html.escape(index.path.resolve().name)}</h1>",
    f"<p>{len(index)} windows; weights {html.escape(weights)}</p>",
  ]
  for query, hits in zip(queries, results):
    parts.append(
      f"<h2 class='query'>{html.escape(query)}</h2><div class='hits'>"
    )
    for rank, hit in enumerate(hits, 1):
      image = base64.b64encode(index.thumbnail(hit)).decode("ascii")
      link = html.escape(moment_link(index, hit, path.parent), quote=True)
      parts.append(
        f"<div class='hit'><a href='{link}'>"
        f"<img alt='{html.escape(hit.video)}' "
        f"src='data:image/jpeg;base64,{image}'></a>"
        f"<b>{rank}.</b> <span class='video'>{html.escape(hit.video)}</span>"
        f" <a href='{link}'>{hit.start:.1f}-{hit.end:.1f} s</a>, score "
        f"{hit.score:.3f}</div>"
      )
    parts.append("</div>")
  parts.append("</body></html>\n")
  from vidjax.base import whole_files

  with whole_files.replaced(path) as f:
    f.write("\n".join(parts))
  return path


def read_labels(spec: str) -> list[str]:
  """`--labels`: a file of one label a line, or labels separated by commas."""
  if os.path.isfile(spec):
    try:
      with open(spec, encoding="utf-8-sig") as f:
        labels = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as e:
      raise errors.ConfigError(
        f"--labels {spec}: not UTF-8 text (byte {e.start}: {e.reason})",
        hint="save it as UTF-8, one label a line",
      ) from None
    except OSError as e:
      raise errors.ConfigError(
        f"--labels {spec}: {e.strerror or e}", hint="give a readable file"
      ) from None
    where = spec
  else:
    labels = [label.strip() for label in spec.split(",") if label.strip()]
    where = "--labels"
  if not labels:
    raise errors.ConfigError(
      f"{where}: no labels",
      hint='give them as --labels "cut,wash,open" or a file of one a line',
    )
  return labels


def write_labels(index: Index, labels, best, score, path) -> dict:
  """Writes the labels CSV; returns the per-video summary
  {video: (label of most windows, its share, windows)}."""
  from vidjax.base import whole_files

  with whole_files.replaced(path) as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(("video", "start", "end", "label", "score"))
    for i in range(len(index)):
      writer.writerow(
        (
          index.videos[i],
          f"{index.starts[i]:g}",
          f"{index.ends[i]:g}",
          labels[best[i]],
          f"{score[i]:.4f}",
        )
      )
  summary = {}
  for vid in dict.fromkeys(index.videos.tolist()):
    counts = collections.Counter(best[index.videos == vid].tolist())
    label, n = counts.most_common(1)[0]
    summary[vid] = (
      labels[label],
      n / sum(counts.values()),
      sum(counts.values()),
    )
  return summary


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="python -m vidjax.search", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("index", help="an INDEX made by python -m vidjax.embed")
  parser.add_argument("queries", nargs="*", help="texts to search for")
  parser.add_argument("--top", type=int, default=10, help="hits per query")
  parser.add_argument("--json", action="store_true", help="print JSON")
  parser.add_argument("--html", help="write a page of the hits here")
  parser.add_argument(
    "--labels", help='"a,b,c" or a file of one label a line: label windows'
  )
  parser.add_argument(
    "--csv", help=f"where --labels writes (default INDEX/{LABELS_CSV})"
  )
  parser.add_argument(
    "--templates",
    default=",".join(DEFAULT_TEMPLATES),
    help="prompt templates, comma-separated, each with {} (e.g. "
    "'#C C {}' for Ego4D-trained models)",
  )
  return parser


def _writable(flag: str, path) -> None:
  """Refuses an output path whose folder is missing or not writable, or
  that is a folder: said before the model loads."""
  path = Path(path)
  folder = path.parent
  if path.is_dir():
    problem = "is a folder"
  elif not folder.is_dir():
    problem = f"has no folder {folder}"
  elif not os.access(folder, os.W_OK):
    problem = f"cannot be written (the folder {folder} is not writable)"
  else:
    return
  raise errors.ConfigError(
    f"{flag} {path}: {problem}", hint="give a file in a writable folder"
  )


def _written(flag: str, write, *args):
  """`write(*args)`; a refused write (a full disk, no permission) as a
  `WriteError` naming the flag."""
  try:
    return write(*args)
  except OSError as e:
    raise errors.WriteError(
      f"{flag}: could not write {e.filename or args[-1]}: {e.strerror or e}",
      hint="free space or give a writable path",
    ) from None


def check_args(args) -> list[str] | None:
  """Everything the command line alone decides, before the index and the
  model load: the queries, --top, --templates, the labels (read) and the
  output paths. Returns the labels (None without --labels).

  Raises:
    errors.ConfigError: the first problem, in the user's words.
  """
  if not args.queries and not args.labels:
    raise errors.ConfigError(
      "nothing to do: give queries, or --labels",
      hint='python -m vidjax.search INDEX "a query" [--top 10]',
    )
  blank = [i for i, q in enumerate(args.queries, 1) if not q.strip()]
  if blank:
    raise errors.ConfigError(
      f"query {blank[0]} is empty: a query is a text to search for",
      hint='python -m vidjax.search INDEX "someone opens the fridge"',
    )
  if args.top < 1:
    raise errors.ConfigError(f"--top {args.top}: must be 1 or more")
  templates = [t.strip() for t in args.templates.split(",") if t.strip()]
  if any(t.count("{}") != 1 for t in templates) or not templates:
    raise errors.ConfigError(
      f"--templates {args.templates!r}: each template holds {{}} once"
    )
  args.templates = templates
  if args.html:
    _writable("--html", args.html)
  if args.csv:
    _writable("--csv", args.csv)
  return read_labels(args.labels) if args.labels else None


def main(argv: list[str] | None = None) -> int:
  """The command line; exit status 0 done, 1 a damaged index, 2 refused (the
  arguments, a missing index), 74 an output that could not be written."""
  args = _parser().parse_args(argv)
  try:
    labels = check_args(args)
    templates = args.templates
    index = Index(args.index)
    if args.html:
      _ = index.store  # The thumbnails' store, said before the model loads.
    csv_path = args.csv or index.path / LABELS_CSV
    if labels and not args.csv:
      _writable("--labels' CSV", csv_path)
    out: dict = {}
    if args.queries:
      results = index.query(args.queries, args.top, templates)
      out["queries"] = {
        q: [dataclasses.asdict(h) for h in hits]
        for q, hits in zip(args.queries, results)
      }
      if args.html:
        out["html"] = os.fspath(
          _written(
            "--html", write_html, index, args.queries, results, args.html
          )
        )
      if not args.json:
        for q, hits in zip(args.queries, results):
          print(table(q, hits))
    if labels:
      best, score = index.label(labels, templates)
      summary = _written(
        "--csv", write_labels, index, labels, best, score, csv_path
      )
      out["labels_csv"] = os.fspath(csv_path)
      out["videos"] = {
        v: {"label": lab, "share": share, "windows": n}
        for v, (lab, share, n) in summary.items()
      }
      if not args.json:
        print(f"labels of {len(index)} windows in {csv_path}; per video:")
        for v, (lab, share, n) in summary.items():
          print(f"  {v}: {lab} ({share:.0%} of {n} windows)")
    if args.json:
      print(json.dumps(out, indent=1))
    elif args.html:
      print(f"page: {out['html']}")
  except errors.UserError as e:
    print(f"vidjax.search: error: {e.describe()}", file=sys.stderr)
    return e.exit_code
  return errors.EXIT_FINISHED
