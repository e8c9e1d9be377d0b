"""vidjax.search.embed and vidjax.search on a user's own videos, with the demo's
trained weights (its :debug trained `TRAINED_STEPS` steps): its two
held-out videos and eight new ones like them (two captioned 2 s moments
each, every caption it trained on among them), plus a file that is not a
video."""

import csv
import io
import json
import math
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import debug_runs
import limits
from video_fixtures import write_video
from vidjax import search, train
from vidjax.base import errors, rundir
from vidjax.data import synthetic
from vidjax.search import embed, towers

pytestmark = pytest.mark.xdist_group("demo_reference")  # Its corpus and step.
REPO = Path(__file__).resolve().parents[1]
CONFIG = f"{REPO}/configs/demo.py:debug"
STRIDE = "0.25"  # Windows of 2 s (the recipe's default) every 0.25 s.
NEW_VIDEOS = 8
# The demo's :debug at a constant learning rate, 32 steps of seed 2 (see
# `test_search_ranks_the_right_video_first`). At 16 steps it knows colours
# only.
TRAINED_STEPS = 32
SEED = 2
VIDEOS = [f"own{v}" for v in range(NEW_VIDEOS)] + ["vid006", "vid007"]


def _words(caption: str) -> tuple[str, str]:
  """'a red square moves left' -> ('red', 'square')."""
  _, colour, shape, *_ = caption.split()
  return colour, shape


@pytest.fixture(scope="module")
def own(tmp_path_factory):
  """(weights, SRC list, captioned moments [(video, start, end, caption)])."""
  config = debug_runs.load(
    "demo",
    *debug_runs.DEMO_REFERENCE,
    f"--config.total_steps={TRAINED_STEPS}",
    f"--config.seed={SEED}",
  )
  weights = debug_runs.prepare(
    config, tmp_path_factory.mktemp("demo_trained") / "run", tmp_path_factory
  )
  train.train_and_evaluate(config, weights)
  corpus = weights / "synthetic"
  root = tmp_path_factory.mktemp("own_videos")
  moments = []
  for line in (corpus / "val.jsonl").read_text().splitlines():
    row = json.loads(line)
    moments.append((row["video_id"], row["start"], row["end"], row["text"]))
  held_out = sorted({m[0] for m in moments})
  # New footage of the captions it trained on, as the full demo's held-out
  # videos mostly are (its 192 segments cover the 48 captions ~4 times; the
  # :debug corpus's 12 training segments cannot teach the 36 others).
  trained = sorted(
    {json.loads(x)["label"] for x in (corpus / "train.jsonl").open()}
  )
  rng = np.random.default_rng(7)
  # Every trained caption once, then random ones: as many queries as can be.
  extra = rng.choice(trained, 2 * NEW_VIDEOS - len(trained), replace=False)
  labels = list(rng.permutation(trained + list(extra)))
  for v in range(NEW_VIDEOS):  # As the demo's: two 2 s segments at 8 fps.
    parts = []
    for k in range(2):
      label = int(labels.pop())
      shape, colour, motion = np.unravel_index(label, (3, 4, 4))
      parts.append(
        synthetic.render_segment(rng, shape, colour, motion, 16, 96, 128)
      )
      moments.append(
        (f"own{v}", 2.0 * k, 2.0 * k + 2, synthetic.class_names()[label])
      )
    write_video(root / f"own{v}.mp4", np.concatenate(parts), fps=8, gop=32)
  (root / "broken.mp4").write_bytes(
    (corpus / "raw/vid000.mp4").read_bytes()[:3000]
  )
  listing = [corpus / f"raw/{v}.mp4" for v in held_out]
  listing += [root / f"own{v}.mp4" for v in range(NEW_VIDEOS)]
  listing.append(root / "broken.mp4")
  src = root / "videos.txt"
  src.write_text("".join(f"{p}\n" for p in listing))
  return weights, src, moments


def _embed(own, out, stride=float(STRIDE), **kw):
  weights, src, _ = own
  return embed.embed_videos(
    CONFIG,
    src,
    out,
    overrides=[f"init_from={weights}"],
    stride_s=stride,
    progress=False,
    **kw,
  )


@pytest.fixture(scope="module")
def clean(own, tmp_path_factory):
  """One uninterrupted run's INDEX and summary."""
  out = tmp_path_factory.mktemp("clean") / "index"
  return out, _embed(own, out)


def test_index_holds_rows_windows_and_provenance(own, clean):
  out, summary = clean
  weights, _, _ = own
  assert summary.embedded == VIDEOS
  ((broken, why),) = summary.failed
  assert broken.endswith("broken.mp4") and "not a video" in why
  assert "broken.mp4" in embed.report(summary)
  rows = np.load(out / embed.EMBEDDINGS)
  assert rows.dtype == np.float16 and rows.shape == (9 * 10, 64)
  np.testing.assert_allclose(
    np.linalg.norm(rows.astype(np.float32), axis=1), 1, atol=2e-3
  )
  with open(out / embed.WINDOWS, newline="") as f:
    table = list(csv.DictReader(f))
  assert [tuple(r.values()) for r in table[:2]] == [
    ("own0", "0", "2"),
    ("own0", "0.25", "2.25"),
  ]
  assert tuple(table[-1].values()) == ("vid007", "2", "4")
  info = json.loads((out / embed.INDEX_JSON).read_text())
  assert info["weights"] == str(weights) and info["recipe"] == CONFIG
  assert info["vidjax"] and info["windows"] == len(rows) == len(table)
  failed = [
    json.loads(x) for x in (out / embed.FAILED).read_text().splitlines()
  ]
  assert [f["video"] for f in failed] == [broken]


@pytest.fixture(scope="module")
def index(clean):
  """The clean INDEX opened once: its encoder loaded and traced once for
  the tests that query it."""
  return search.Index(clean[0])


def test_search_ranks_the_right_video_first(own, index):
  """Each distinct caption of the ten videos searched once: the rank of
  its first window in a video showing that caption (several may) is
  better than chance (the right windows anywhere among the 90).

  The model is weak, and how much of the captions it learns in 32 steps
  of 12 segments depends on its seed: over seeds 0-3, the mean rank of
  the first right window is 7.3, 2.5, 2.3 and 3.7 (p 0.75, 0.004, 0.002,
  0.06; the top window right for 0.21-0.36 of the 14 captions, chance
  0.14). The test trains seed 2, one that learns them: an index whose rows,
  windows or text tower do not match falls back to chance.
  """
  _, _, moments = own
  captions = sorted({m[3] for m in moments})
  shown_in = {c: {v for v, _, _, cc in moments if cc == c} for c in captions}
  hits = index.query(captions, top=len(index.videos))
  ranks = [
    next(i for i, h in enumerate(ranked) if h.video in shown_in[c])
    for c, ranked in zip(captions, hits)
  ]
  right = [np.isin(index.videos, list(shown_in[c])).sum() for c in captions]
  p = _ranks_at_most(sum(ranks), right, len(index.videos))
  print(
    f"top window in the right video for {np.mean(np.equal(ranks, 0)):.2f} "
    f"of {len(captions)} captions; mean rank of the first right one "
    f"{np.mean(ranks):.1f} of {len(index.videos)} (p {p:.2g})"
  )
  assert p < 0.01


def _ranks_at_most(total: int, right, windows: int) -> float:
  """P(the ranks of the first right window sum to `total` or less) when
  each query's `right[i]` right windows are anywhere among `windows`:
  rank r (0-based) has P = C(windows - 1 - r, k - 1) / C(windows, k)."""
  law = np.ones(1)
  for k in right:
    ranks = np.arange(windows - k + 1)
    pmf = np.array([math.comb(windows - 1 - r, k - 1) for r in ranks])
    law = np.convolve(law, pmf / math.comb(windows, k))
  return float(law[: total + 1].sum())


def _at_least(k: int, chances) -> float:
  """P(k or more right) when query i is right with probability chances[i]
  (Poisson binomial: the exact law of hits by chance)."""
  law = np.zeros(len(chances) + 1)
  law[0] = 1.0
  for q in chances:
    law[1:] = law[1:] * (1 - q) + law[:-1] * q
    law[0] *= 1 - q
  return float(law[k:].sum())


@pytest.mark.parametrize(
  "part, words",
  [(0, list(synthetic.COLOURS)), (1, list(synthetic.SHAPES))],
  ids=["colours", "shapes"],
)
def test_labels_beat_chance(own, index, part, words):
  _, _, moments = own
  centres = (index.starts + index.ends) / 2
  truth = []
  for v, t in zip(index.videos, centres):
    (caption,) = [c for vv, s, e, c in moments if vv == v and s <= t < e]
    truth.append(_words(caption)[part])
  best, score = index.label(words)
  accuracy = np.mean(np.array(words)[best] == np.array(truth))
  majority = max(truth.count(w) for w in words) / len(truth)
  print(
    f"labels {','.join(words)}: {accuracy:.2f} of {len(truth)} windows "
    f"right (chance {1 / len(words):.2f}; always the most common "
    f"{majority:.2f})"
  )
  assert accuracy > 1 / len(words) + 0.05 and np.all(np.abs(score) <= 1.0001)


def _command(own, out) -> list[str]:
  weights, src, _ = own
  return [
    sys.executable,
    "-m",
    "vidjax.embed",
    "--config",
    CONFIG,
    f"--config.init_from={weights}",
    "--videos",
    str(src),
    "--out",
    str(out),
    "--stride_s",
    STRIDE,
    "--quiet",
  ]


def test_kill_9_then_rerun_gives_the_clean_index(own, clean, tmp_path):
  out = tmp_path / "index"
  proc = subprocess.Popen(
    _command(own, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
  )
  first = out / embed.VIDEOS / "own0.npz"
  deadline = time.monotonic() + 900  # A loaded machine is slow to start it.
  while (
    not first.exists() and proc.poll() is None and time.monotonic() < deadline
  ):
    time.sleep(0.01)
  os.kill(proc.pid, signal.SIGKILL)
  output = proc.communicate()[0].decode()
  assert proc.returncode == -signal.SIGKILL, output  # Killed mid-index,
  assert first.exists() and not (out / embed.VIDEOS / "vid007.npz").exists()
  assert (out / rundir.LOCK_FILE).exists()  # its lock left behind.
  kept = first.stat().st_mtime_ns
  summary = _embed(own, out)  # Takes the dead run's lock over.
  assert "own0" in summary.already and "vid007" in summary.embedded
  assert first.stat().st_mtime_ns == kept
  for name in (embed.EMBEDDINGS, embed.WINDOWS):
    assert (out / name).read_bytes() == (clean[0] / name).read_bytes(), name


def test_a_rerun_with_other_windows_is_refused(own, clean):
  before = (clean[0] / embed.EMBEDDINGS).read_bytes()
  with pytest.raises(errors.WorkdirError, match="stride_s 0.25, now 0.5"):
    _embed(own, clean[0], stride=0.5)
  assert (clean[0] / embed.EMBEDDINGS).read_bytes() == before


def test_a_second_run_into_an_index_in_use_is_refused(own, tmp_path, capsys):
  out = tmp_path / "index"
  out.mkdir()
  lock = rundir.WorkdirLock(out)  # A live run (this process) holds it.
  lock.acquire()
  try:
    code = embed.main(_command(own, out)[3:])  # The command line's main.
  finally:
    lock.release()
  err = capsys.readouterr().err
  assert code == errors.EXIT_USAGE, err
  assert f"in use by another run: PID {os.getpid()}" in err
  assert "Traceback" not in err and sorted(os.listdir(out)) == []


def test_no_videos_or_a_full_disk_said_in_two_lines(
  tmp_path, capsys, monkeypatch
):
  # Said before the weights load (none here) and nothing written.
  (tmp_path / "empty").mkdir()
  (tmp_path / "store").mkdir()  # A chunk store with no videos yet.
  (tmp_path / "store" / "manifest.jsonl").write_text("")
  for src, said in (
    ("empty", "empty: no videos there"),
    ("nowhere", "nowhere: no such file or folder"),
    ("store", "a chunk store with no videos"),
  ):
    code = embed.main(
      ["--config", CONFIG, "--config.init_from=/no/weights"]
      + ["--videos", str(tmp_path / src), "--out", str(tmp_path / "index")]
    )
    err = capsys.readouterr().err
    assert code == errors.EXIT_USAGE and said in err, err
    assert "Traceback" not in err and not (tmp_path / "index").exists()

  def full(*args, **kwargs):
    raise OSError(28, "No space left on device", "INDEX/embeddings.npy")

  monkeypatch.setattr(embed, "embed_videos", full)
  code = embed.main(
    ["--config", CONFIG, "--videos", "SRC", "--out", str(tmp_path / "i")]
  )
  err = capsys.readouterr().err
  assert code == errors.EXIT_WRITE_FAILED, err
  assert err.splitlines() == [
    "vidjax.embed: error: could not write INDEX/embeddings.npy: No space "
    "left on device",
    "  hint: free space (or give a writable --out), then run the same "
    "command: the videos embedded so far are kept",
  ]


def test_a_moved_run_serves_its_vocabulary(tmp_path):
  # A run's config.json names its vocabulary by the path it had when it
  # trained: moved, the run's own file is found where the run is now, and
  # CLIP's file by its name is vidjax's copy.
  run = tmp_path / "moved" / "run"
  (run / "synthetic").mkdir(parents=True)
  synthetic.write_vocab(run / "synthetic" / "vocab.txt.gz")
  clip = "/gone/site-packages/open_clip/bpe_simple_vocab_16e6.txt.gz"
  for saved, found in (
    ("/old/place/run/synthetic/vocab.txt.gz", run / "synthetic/vocab.txt.gz"),
    (clip, ""),
    ("", ""),
    ("/gone/words.txt.gz", "/gone/words.txt.gz"),  # Said as not found.
  ):
    rundir.write_json(run / rundir.CONFIG_JSON, {"data": {"vocab": saved}})
    assert towers._run_vocab(str(run / "checkpoints" / "32")) == str(found)


def test_search_command_json_labels_and_page_in_chromium(
  own, clean, tmp_path, capsys
):
  _, _, moments = own
  page = tmp_path / "hits.html"
  query = moments[0][3]
  code = search.main(
    [
      str(clean[0]),
      query,
      "a blue circle moves up",
      "--top",
      "3",
      "--json",
      "--html",
      str(page),
      "--labels",
      "red,green,blue,yellow",
      "--csv",
      str(tmp_path / "l.csv"),
    ]
  )
  printed = capsys.readouterr()
  assert code == 0, printed.err
  out = json.loads(printed.out)
  hits = out["queries"][query]
  assert len(hits) == 3 and hits[0]["score"] >= hits[1]["score"]
  assert set(hits[0]) == {"row", "video", "start", "end", "score"}
  with open(tmp_path / "l.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 90 and set(rows[0]) == {
    "video",
    "start",
    "end",
    "label",
    "score",
  }
  assert set(out["videos"]) == set(VIDEOS)
  text = page.read_text()
  assert query in text and "own0" in text and "src='http" not in text
  # Each hit opens at its moment; the heading names no machine's paths.
  assert text.count("#t=") == 2 * 6 and str(clean[0]) not in text
  _check_thumbnails_render(page, tmp_path, count=6)


def test_a_thumbnail_is_a_jpeg_of_the_frame():
  # Made by PyAV's encoder (no image library installed with vidjax).
  import av

  rows, cols = np.mgrid[0:144, 0:256]
  image = np.stack([rows, cols, rows + cols], -1).astype(np.uint8)
  image[40:80, 50:120] = (255, 0, 0)
  data = search._jpeg(image)
  assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"  # SOI, EOI
  with av.open(io.BytesIO(data), format="mjpeg") as f:
    decoded = next(f.decode(video=0)).to_ndarray(format="rgb24")
  assert decoded.shape == image.shape
  assert np.abs(decoded.astype(int) - image).mean() < 3


# A script added to a copy of the page: each image drawn on a canvas, its
# size and pixel spread written into the DOM, which chromium then dumps.
_PROBE = """<script>
window.addEventListener('load', () => {
  const out = [...document.images].map(img => {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    if (!c.width) return [0, 0, 0];
    const g = c.getContext('2d'); g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let s = 0, s2 = 0, n = d.length / 4;
    for (let i = 0; i < d.length; i += 4) { s += d[i + 1]; s2 += d[i + 1] ** 2; }
    return [img.naturalWidth, img.naturalHeight, s2 / n - (s / n) ** 2];
  });
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script></body>"""


def _check_thumbnails_render(page: Path, tmp_path: Path, count: int) -> None:
  chromium = shutil.which("chromium") or shutil.which("chromium-browser")
  if chromium is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)")
  probe = tmp_path / "probe.html"
  probe.write_text(page.read_text().replace("</body>", _PROBE))
  dom = subprocess.run(
    [
      chromium,
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--virtual-time-budget=10000",
      "--dump-dom",
      probe.as_uri(),
    ],
    capture_output=True,
    text=True,
    timeout=limits.HANG_S,
  ).stdout
  found = dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]
  images = json.loads(found)
  assert len(images) == count, images
  for width, height, variance in images:
    assert height == search.THUMB_HEIGHT and width > 0
    assert variance > 20, images  # Decoded frames, not a blank.
  assert "a blue circle moves up" in dom
