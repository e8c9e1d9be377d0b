"""The command line on your own videos: the README's path, and every mistake.

One module-scoped corpus of videos made here, chunked with the chunker's
command line, serves all tests. Four mistakes run as commands (at once),
the others through `main.run` in this process; only the README's own-data
path trains, once (relative paths, as in the README), and its workdir then
serves the resume test.
"""

import gzip
import json
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import limits
from video_fixtures import write_video
from vidjax.base import errors, rundir
from vidjax.data import synthetic
from vidjax.report import plot

# The module's fixtures (a chunked corpus, ten refused runs, one training)
# are made once: its tests stay in one test process.
pytestmark = pytest.mark.xdist_group("cli")

REPO = Path(__file__).resolve().parents[1]
VIDEOS = {  # id -> (fps, width, height); two 2-second segments each.
  "bikes": (25, 128, 96),
  "car": (30, 160, 96),
  "garden": (24, 128, 80),
  "street": (25, 128, 96),
  "kitchen": (30, 128, 96),
  "park": (25, 144, 96),
}
EVAL_VIDEOS = ("kitchen", "park")
VOCAB = "vocab.txt.gz"


def _segments(video_id):
  return [(s * 2.0, s * 2.0 + 2.0) for s in range(2)]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
  """Six videos of moving shapes, chunked; captions in train/val.jsonl."""
  root = tmp_path_factory.mktemp("own")
  (root / "videos").mkdir()
  rng = np.random.default_rng(0)
  rows = {"train": [], "val": []}
  for v, (video_id, (fps, width, height)) in enumerate(VIDEOS.items()):
    frames = []
    for start, end in _segments(video_id):
      shape, colour, motion = v % 3, (v + int(start)) % 4, (v + int(start)) % 4
      frames.append(
        synthetic.render_segment(
          rng, shape, colour, motion, int((end - start) * fps), height, width
        )
      )
      label = synthetic.label_of(shape, colour, motion)
      split = "val" if video_id in EVAL_VIDEOS else "train"
      rows[split].append(
        {
          "video_id": video_id,
          "start": start,
          "end": end,
          "text": synthetic.class_names()[label],
          "label": label,
        }
      )
    write_video(
      root / "videos" / f"{video_id}.mp4",
      np.concatenate(frames),
      fps=fps,
      gop=30,
    )
  # README step 1: chunk.
  subprocess.run(
    [
      sys.executable,
      "-m",
      "vidjax.data.chunk",
      str(root / "videos"),
      str(root / "chunks"),
      "--short-side",
      "64",
      "--chunk-seconds",
      "2",
    ],
    check=True,
    cwd=REPO,
    capture_output=True,
  )
  for split, split_rows in rows.items():  # README step 2: annotations.
    _write_jsonl(root / f"{split}.jsonl", split_rows)
  write_vocab(root / VOCAB)
  return root


def write_vocab(path):
  """A BPE vocabulary in CLIP's format, larger than demo.py's text model
  holds (CLIP's own is found only where OpenCLIP is installed): every
  pair of lower-case letters, 1190 tokens."""
  letters = "abcdefghijklmnopqrstuvwxyz"
  merges = [f"{a} {b}" for a in letters for b in letters]
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "\n".join(merges) + "\n")


def vocab_size(path) -> int:
  from vidjax.data import tokenizer

  return tokenizer.Tokenizer(path).vocab_size


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _paths(root, train="train.jsonl", val="val.jsonl"):
  return [
    f"--config.data.root={root / 'chunks'}",
    f"--config.data.train_annotations={root / train}",
    f"--config.data.eval_annotations={root / val}",
    f"--config.data.vocab={root / VOCAB}",
  ]


def _main(config, workdir, *args):
  return [
    sys.executable,
    "-m",
    "vidjax.main",
    "--config",
    str(REPO / "configs" / config),
    "--workdir",
    str(workdir),
    *args,
  ]


# Small enough for 8 CPU devices and 8 training clips.
CPU_RUN = [
  "--config.total_steps=2",
  "--config.batch_size=8",
  "--config.eval.batch_size=8",
  "--config.log.every_steps=1",
  "--config.checkpoint.every_steps=1000",
]


@pytest.fixture(scope="module")
def trained(own, tmp_path_factory):
  """README step 3: train on the own videos (with one bad row, one bad chunk),
  as the README says: `--workdir runs/mine`, relative, as are the data paths
  here, from the directory the command starts in."""
  root = tmp_path_factory.mktemp("trained")
  # A row naming a video that is not there (a capital letter), allowed below.
  rows = [
    json.loads(line) for line in (own / "train.jsonl").read_text().splitlines()
  ]
  _write_jsonl(root / "train.jsonl", rows + [dict(rows[0], video_id="Bikes")])
  shutil.copy(own / "val.jsonl", root / "val.jsonl")
  shutil.copy(own / VOCAB, root / VOCAB)
  # A truncated chunk: its reads fail while training.
  shutil.copytree(own / "chunks", root / "chunks")
  bad_chunk = root / "chunks" / "garden" / "2.mp4"
  bad_chunk.write_bytes(bad_chunk.read_bytes()[:600])
  # Trained as installed without the `[plots]` extra: matplotlib cannot
  # be imported (README step 5 draws the plots afterwards).
  (root / "no_plots").mkdir()
  (root / "no_plots" / "sitecustomize.py").write_text(NO_MATPLOTLIB)
  env = dict(
    _ENV, PYTHONPATH=f"{root / 'no_plots'}{os.pathsep}{_ENV['PYTHONPATH']}"
  )
  result = subprocess.run(
    _own_command(),
    cwd=root,
    env=env,
    capture_output=True,
    text=True,
    timeout=limits.HANG_S,
  )
  return root, root / "runs/mine", bad_chunk, result


# A Python where matplotlib is not installed (its import fails as then).
NO_MATPLOTLIB = """
import sys

class NoMatplotlib:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] == "matplotlib":
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoMatplotlib())
"""


def _own_command(*overrides):
  """The README's own-videos command, from the `trained` directory."""
  return _main(
    "own_videos.py:captions,cpu",
    "runs/mine",
    *_paths(Path(".")),
    *CPU_RUN,
    "--config.data.max_bad_row_fraction=0.2",
    *overrides,
  )


# From another directory than the repository's, vidjax as the tests see it.
_ENV = dict(
  os.environ,
  PYTHONPATH=os.pathsep.join(
    [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
  ),
)


@pytest.mark.slow
def test_own_videos_from_chunks_to_plots(trained, monkeypatch):
  root, workdir, bad_chunk, result = trained
  err = result.stderr
  assert result.returncode == 0, err[-3000:]
  assert "Traceback" not in err
  # The paths given win, and the vocabulary size comes from the file.
  config = json.loads((workdir / "config.json").read_text())
  assert config["data"]["root"] == str(root / "chunks")
  assert config["data"]["train_annotations"] == str(root / "train.jsonl")
  assert config["model"]["text"]["vocab_size"] == vocab_size(root / VOCAB)
  assert not (workdir / "synthetic").exists()
  # Before training: the bad row, named with a suggestion; the summary.
  assert re.search(
    r"warning: data check: train train.jsonl: 1 of 9 rows is bad \(11\.1%\)"
    r".*; left out, training goes on: up to 2 bad rows are allowed here "
    r"\(data.max_bad_row_fraction=0.2 of the rows, at least 2\)"
    r"\n.*'Bikes' is not in the chunk store \(did you "
    r"mean 'bikes'\?\)",
    err,
  )
  assert json.loads((workdir / "bad_rows_train.jsonl").read_text())["row"] == 9
  assert re.search(
    r"8 devices \(cpu\); batch 8 = 1 per device; [\d.]+M "
    r"parameters, from scratch\n  data: 8 train clips, 4 eval "
    r"clips; 1 steps per epoch",
    err,
  )
  # Read failures: the first of the file while it happens, counts at the end.
  assert err.count(f"cannot read a clip: {bad_chunk}") == 1
  assert re.search(
    rf"clip reads failed in 1 file during training.*\n  "
    rf"{re.escape(str(bad_chunk))}: \d+ failed read",
    err,
  )
  assert re.search(r"eval at step 2:\n  t2v_r1 +\d\.\d{4} \|", err)
  assert f"finished at step 2. Results in {workdir}" in err
  final = [r for r in plot.monitor.read_metrics(workdir) if "eval/t2v_r1" in r]
  assert final[-1]["step"] == 2 and final[-1]["eval/chance_r1"] == 0.25
  # Without matplotlib: no plots, and how to get them.
  assert (
    "no plots: matplotlib is not installed. pip install 'vidjax[plots]', "
    f"then `python -m vidjax.plot {workdir}` draws them" in err
  )
  assert not (workdir / "plots").exists()
  # README step 5: plots, from the same directory.
  monkeypatch.chdir(root)
  assert plot.main(["runs/mine"]) == 0
  assert (workdir / "plots" / "eval.png").exists()
  assert (workdir / "log.txt").read_text().count("eval at step 2") == 1


def test_a_resume_that_does_not_fit_changes_nothing(trained, monkeypatch):
  """The same command (its relative paths) again, with another model or
  another batch size (the saved data position and step count are in its
  batches): refused with the reason before the workdir is touched; `--mode
  eval` evaluates it (at another batch size too)."""
  root, workdir, _, _ = trained
  monkeypatch.chdir(root)
  before = {
    p: (p.stat().st_mtime_ns, p.stat().st_size) for p in workdir.rglob("*")
  }
  for override, pattern in [
    (
      "--config.model.width=96",
      r"error: the checkpoint .*checkpoints/2 was "
      r"saved by another model: changed config: model.width 64 -> 96\. \d+ "
      r"arrays differ, e.g. params\.",
    ),
    *[  # Larger, smaller, a whole number of transfers or not: all refused.
      (
        f"--config.batch_size={batch}",
        rf"error: the checkpoint .*checkpoints/2 was trained with "
        rf"batch_size=8, this run has batch_size={batch}: .*\n *"
        r"hint: resume with --config.batch_size=8, or start a new --workdir "
        r"from these weights with --config.init_from=.*checkpoints/2",
      )
      for batch in (16, 24)
    ],
  ]:
    code, stderr = _in_process(_own_command(override))
    assert code == 2 and re.search(pattern, stderr), stderr
    _assert_short(stderr)
  after = {
    p: (p.stat().st_mtime_ns, p.stat().st_size) for p in workdir.rglob("*")
  }
  assert after == before
  # `--mode eval` from the same relative paths evaluates the checkpoint.
  assert _in_process(_own_command("--mode=eval", "--config.batch_size=16")) == (
    errors.EXIT_FINISHED,
    "",
  )
  final = [r for r in plot.monitor.read_metrics(workdir) if "eval/t2v_r1" in r]
  assert [r["step"] for r in final] == [2, 2]
  assert not (workdir / rundir.LOCK_FILE).exists()
  # With one more step, the same command resumes from the checkpoint of
  # step 2 (in a copy of the run, which the test above reads as it was).
  shutil.copytree(workdir, root / "runs/resumed")
  command = _own_command("--config.total_steps=3")
  command[6] = "runs/resumed"
  assert _in_process(command) == (errors.EXIT_FINISHED, "")
  resumed = root / "runs/resumed"
  losses = [
    r["step"] for r in plot.monitor.read_metrics(resumed) if "train/loss" in r
  ]
  assert losses == [1, 2, 3]  # Steps 1 and 2 were not run again.
  assert (resumed / "checkpoints" / "3").is_dir()


def _bad_rows(own):
  rows = [
    json.loads(line) for line in (own / "train.jsonl").read_text().splitlines()
  ]
  caption = dict(rows[2])
  caption["caption"] = caption.pop("text")
  return rows[:2] + [
    dict(rows[0], video_id="Bikes"),  # Case.
    dict(rows[1], start=1200.0, end=3400.0),  # Milliseconds.
    caption,
  ]  # A key other than 'text'.


def _mistakes(own, tmp):
  """name -> (command, exit code, patterns stderr must match)."""
  bad = _write_jsonl(tmp / "bad.jsonl", _bad_rows(own))
  rows = [
    json.loads(line) for line in (own / "train.jsonl").read_text().splitlines()
  ]
  no_labels = _write_jsonl(
    tmp / "no_labels.jsonl",
    [  # 'class', not 'label'.
      {("class" if k == "label" else k): v for k, v in json.loads(line).items()}
      for line in (own / "train.jsonl").read_text().splitlines()
    ],
  )
  in_ms = _write_jsonl(
    tmp / "in_ms.jsonl",
    [  # Milliseconds, every row.
      dict(r, start=r["start"] * 1000, end=r["end"] * 1000) for r in rows
    ],
  )
  val = [
    json.loads(line) for line in (own / "val.jsonl").read_text().splitlines()
  ]
  unlabelled_val = _write_jsonl(
    tmp / "unlabelled_val.jsonl",
    val[:2] + [{k: v for k, v in val[2].items() if k != "label"}] + val[3:],
  )
  csv = tmp / "train.csv"  # A CSV where JSON Lines are expected.
  csv.write_text("video_id,start,end,label\nbikes,0,2,1\n")
  broken = tmp / "broken.jsonl"
  broken.write_text((own / "train.jsonl").read_text() + "{'video_id': 1\n")
  unreadable = tmp / "unreadable"
  shutil.copytree(own / "chunks", unreadable / "chunks")
  for chunk in (unreadable / "chunks").glob("*/*.mp4"):
    chunk.write_bytes(b"garbage" * 10)
  for name in ("train.jsonl", "val.jsonl", VOCAB):
    shutil.copy(own / name, unreadable)
  own_paths = _paths(own)
  vocab = own / VOCAB
  demo = "demo.py:debug"
  return {
    "unknown_key": (
      _main(demo, tmp / "a", "--config.optim.learning_rate=1e-3"),
      2,
      [
        r"error: unknown config key 'optim.learning_rate'",
        r"hint: 'optim' has: .*\blr\b",
      ],
    ),
    "unknown_flag": (
      _main(demo, tmp / "c", "--wokdir=x"),
      2,
      [r"error: Unknown command line flag 'wokdir'"],
    ),
    "batch": (
      _main(demo, tmp / "d", "--config.batch_size=12"),
      2,
      [r"'batch_size' = 12 is not divisible by the 8 devices"],
    ),
    "absurd_size": (  # Refused before anything is built (it hung in XLA).
      _main(demo, tmp / "huge", "--config.data.num_frames=1000000000000"),
      2,
      [
        r"'data.num_frames' = 1000000000000 is out of range: integer "
        r"settings are at most 2147483647"
      ],
    ),
    "paths": (
      _main(
        "own_videos.py:cpu", tmp / "e", "--config.data.root=/no/such/chunks"
      ),
      2,
      [
        r"data.root = '/no/such/chunks' \(not found\)",
        r"data.train_annotations = '' \(unset\)",
      ],
    ),
    # demo.py with your own data: your paths win; its small text model
    # does not hold CLIP's vocabulary, and says what to set.
    "vocab_size": (
      _main(demo, tmp / "g", *own_paths),
      2,
      [
        rf"has {vocab_size(vocab)} tokens but model.text.vocab_size is 1024",
        rf"hint: set --config.model.text.vocab_size={vocab_size(vocab)}",
      ],
    ),
    "bad_rows": (
      _main("own_videos.py:cpu", tmp / "h", *_paths(own, train=str(bad))),
      1,
      [
        r"train bad.jsonl: 3 of 5 rows are bad \(60\.0%; the limit "
        r"is data.max_bad_row_fraction=0.01\)",
        r"'Bikes' is not in the chunk store \(did you mean 'bikes'\?\)",
        r"1200-3400 s but 'bikes' has 4.0 s \(milliseconds\?\)",
        r"no caption in 'text' \(it has 'caption': the caption goes "
        r"under 'text'\)",
        r"hint: .*--config.data.max_bad_row_fraction=0.6",
      ],
    ),
    "no_labels": (
      _main(
        "own_videos.py:labels,cpu",
        tmp / "i",
        *_paths(own, train=str(no_labels)),
      ),
      1,
      [
        r"none of its 8 rows is usable",
        r"8 rows without a "
        r"label, e.g. row 1: no 'label' \(it has 'class': the "
        r"class goes under 'label'\)",
      ],
    ),
    "no_usable_rows": (
      _main(
        "own_videos.py:labels,cpu", tmp / "m", *_paths(own, train=str(in_ms))
      ),
      1,
      [
        r"train in_ms.jsonl: none of its 8 rows is usable",
        r"8 spans outside their video, e.g. row 1: 0-2000 s "
        r"but 'bikes' has 4.0 s \(milliseconds\?\); row 2: "
        r"2000-4000 s but 'bikes' has 4.0 s \(milliseconds"
        r"\?\); row 3",
        r"hint: fix these rows in the file \(see docs/own_videos\.md "
        r"for the format\)\n$",
      ],
    ),
    "unlabelled_eval": (
      _main(
        "own_videos.py:labels,cpu",
        tmp / "n",
        *_paths(own, val=str(unlabelled_val)),
      ),
      1,
      [
        r"eval unlabelled_val.jsonl: 1 of 4 rows cannot be "
        r"scored",
        r"\n  1 row without a label, e.g. row 3: "
        r"no 'label'\n",
      ],
    ),
    "csv_as_jsonl": (
      _main(
        "own_videos.py:labels,cpu", tmp / "o", *_paths(own, train=str(csv))
      ),
      1,
      [
        rf"{re.escape(str(csv))}:1: not JSON \(Expecting value "
        r"at column 1\): expected one JSON object per line; "
        r"this line looks like CSV",
        r"hint: data.format='jsonl' reads JSON Lines, one JSON "
        r"object per line: \{\"video_id\": \"bikes\", .*"
        r"set --config.data.format \(jsonl, ego4d, ek100_cls, "
        r"ek100_mir, kinetics, kinetics_list, egomcq, egtea, charades_ego, "
        r"charades_ego_trimmed\)",
      ],
    ),
    "typed_int": (
      _main(demo, tmp / "p", "--config.batch_size=eight"),
      2,
      [
        r"error: .*demo.py:debug: --config.batch_size=eight: "
        r"batch_size takes an integer, e.g. "
        r"--config.batch_size=\d+\n$"
      ],
    ),
    "typed_float": (
      _main(demo, tmp / "q", "--config.data.hflip=yes"),
      2,
      [
        r"--config.data.hflip=yes: data.hflip takes a number, "
        r"e.g. --config.data.hflip=0\n$"
      ],
    ),
    "broken_file": (
      _main("own_videos.py:cpu", tmp / "j", *_paths(own, train=str(broken))),
      1,
      [rf"{re.escape(str(broken))}:9: not JSON"],
    ),
    # Every chunk unreadable: the first batch stops, each file named once.
    "unreadable": (
      _main("own_videos.py:cpu", tmp / "l", *_paths(unreadable), *CPU_RUN),
      1,
      [
        r"error: (\d+) of \1 clip reads failed \(100%\), in 8 "
        r"files:\n(  \S+/chunks/(bikes|car|garden|street)/[02]\.mp4: "
        r"\d+ failed reads?\n){8}  hint: re-chunk or remove"
      ],
    ),
    "eval_no_checkpoint": (
      _main(demo, tmp / "k", "--mode=eval"),
      2,
      [r"has no checkpoint to evaluate", r"hint: .*--config.init_from"],
    ),
  }


# Run as real commands: the flags, and one mistake of each kind (config,
# rows, reads) from the command line's exit code down to its last line.
ON_THE_COMMAND_LINE = ("unknown_key", "unknown_flag", "bad_rows", "unreadable")


def _in_process(command):
  """(exit code, stderr) for the mistake in a `_main` command, from
  `main.run` (what the command line runs after its flags), without
  starting Python and JAX again."""
  from vidjax import main

  config, workdir, args = command[4], command[6], command[7:]
  overrides = [arg for arg in args if arg.startswith("--config.")]
  modes = [arg.split("=", 1)[1] for arg in args if arg.startswith("--mode=")]
  assert len(overrides) + len(modes) == len(args), args  # No other flags.
  try:
    main.run(config, workdir, *modes, overrides=overrides)
  except errors.UserError as e:
    return e.exit_code, f"error: {e.describe()}\n"
  return errors.EXIT_FINISHED, ""


@pytest.fixture(scope="module")
def mistakes(own, tmp_path_factory):
  tmp = tmp_path_factory.mktemp("mistakes")
  cases = _mistakes(own, tmp)
  procs = {
    n: subprocess.Popen(
      cases[n][0],
      cwd=REPO,
      text=True,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
    )
    for n in ON_THE_COMMAND_LINE
  }
  results = {
    n: _in_process(cases[n][0]) for n in cases if n not in ON_THE_COMMAND_LINE
  }
  for name, proc in procs.items():
    _, err = limits.communicate(proc, f"the {name} run's end")
    results[name] = (proc.returncode, err)
  return cases, results, tmp


def _assert_short(stderr):
  assert "Traceback" not in stderr
  error = stderr[stderr.rindex("error: ") :]
  assert len(error.splitlines()) <= 12, error


@pytest.mark.parametrize(
  "name",
  [
    "unknown_key",
    "unknown_flag",
    "batch",
    "absurd_size",
    "paths",
    "vocab_size",
    "bad_rows",
    "no_labels",
    "no_usable_rows",
    "unlabelled_eval",
    "csv_as_jsonl",
    "typed_int",
    "typed_float",
    "broken_file",
    "unreadable",
    "eval_no_checkpoint",
  ],
)
def test_mistake_exits_with_one_message(mistakes, name):
  cases, results, tmp = mistakes
  _, code, patterns = cases[name]
  returncode, stderr = results[name]
  assert returncode == code, stderr[-3000:]
  for pattern in patterns:
    assert re.search(pattern, stderr), f"{pattern!r} not in:\n{stderr[-3000:]}"
  _assert_short(stderr)
  if name in (
    "no_usable_rows",
    "unlabelled_eval",
    "csv_as_jsonl",
    "typed_int",
    "typed_float",
  ):  # The message and its hint in a few lines.
    assert len(stderr[stderr.rindex("error: ") :].splitlines()) <= 4, stderr
  # Refused before the workdir is written, but for the list of bad rows.
  workdir = Path(cases[name][0][cases[name][0].index("--workdir") + 1])
  written = (
    sorted(p.name for p in workdir.iterdir()) if workdir.exists() else []
  )
  if name == "unreadable":  # Accepted, then failed reading.
    assert "config.json" in written
  else:
    assert written == (
      ["bad_rows_train.jsonl"]
      if name in ("bad_rows", "no_labels", "no_usable_rows")
      else ["bad_rows_eval.jsonl"]
      if name == "unlabelled_eval"
      else []
    )


def test_readme_installs_little_for_the_demo_and_dev_for_the_tests():
  readme = (REPO / "README.md").read_text()
  commands = re.findall(r"^pip install .*$", readme, flags=re.M)
  assert commands[0].startswith("pip install -e . && python -m vidjax.main")
  assert commands[1] == 'pip install -e ".[dev]" && python -m pytest -q'
  assert os.access(REPO / ".ci/run", os.X_OK)  # Runs it: test_readme.py.


@pytest.mark.parametrize("variant", ["captions", "labels", "labels,cpu"])
def test_own_videos_variants_build(variant):
  from flax import nnx

  from vidjax import config as config_lib, models
  from vidjax.config import defaults

  config = config_lib.load_config(
    str(REPO / f"configs/own_videos.py:{variant}")
  )
  config_lib.validate(config, num_devices=8)
  labels = "labels" in variant
  assert defaults.needs_text(config.task) is not labels
  if labels:
    assert config.model.num_classes == 0  # From the labels, at start-up.
    config.model.num_classes = 5
  else:
    assert config.model.text.vocab_size == 0  # From the vocabulary file.
    config.model.text.vocab_size = 49408
  model = nnx.eval_shape(
    lambda: models.build_model(config.model, rngs=nnx.Rngs(0))
  )
  assert model is not None
  with pytest.raises(Exception, match="unknown variant 'caption'"):
    config_lib.load_config(str(REPO / "configs/own_videos.py:caption"))


def test_help_exits_0():
  result = subprocess.run(
    [sys.executable, "-m", "vidjax.main", "--help"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=limits.HANG_S,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert "--workdir" in result.stdout + result.stderr
