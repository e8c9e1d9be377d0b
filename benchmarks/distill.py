"""Distillation from a frozen CLIP against VideoMAE at equal CPU time, and
the decode cost of their clips.

    python -m benchmarks.distill [--teacher WORKDIR] [--teacher-steps 300]
        [--cpu-seconds 240] [--probes 4] [--clips 48] [--rounds 4]
        [--workdir DIR] [--smoke]

Training (the small-scale evidence for `configs/umt_vitb_k400_pretrain.py`):
the same tiny student ViT (the :debug backbone, 4 frames of 64 px, one from
each of 4 segments of a clip, tubelets of 1, the same initial weights:
checked) is trained on the demo's synthetic corpus, in this process, for
the same CPU seconds (the first, compiling step and the probes not
counted; decoding in the data threads counted) by

  distill   UMT's masked alignment (`vidjax.tasks.distill`) to the demo's
            trained CLIP (`--teacher`, else `configs/demo.py` trained for
            `--teacher-steps` into the workdir, once), 80% of each frame
            masked, the last 2 layers aligned;
  videomae  VideoMAE's pixel reconstruction (`vidjax.tasks.mae`), 90% tube
            masking, a 1-layer decoder.

At `--probes` points of the budget each encoder is frozen and probed: a
linear probe (ridge regression on one-hot targets over the mean of its
normalised tokens) fitted on the training clips predicts the colour, the
shape and the motion (up, down, left, right) of the held-out clips (unseen
videos). Printed: steps, CPU seconds, the three accuracies (and chance),
their mean, and the mean accuracy gained over the common start per CPU
minute.

Decoding: `read_clip` on real footage (`benchmarks.footage`, the loader's),
one process pinned to a core (`benchmarks.loader.measure`), the clips of
the two recipes: VideoMAE's 16 frames at stride 4, and UMT's 8 frames, one
from each of 8 segments of a whole 10-second Kinetics clip, with the
default chunks and with `--profile sparse`'s (GOP 2, no B-frames): frames
decoded per delivered frame, clips and delivered frames per CPU second.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import shutil
import tempfile
import time

from flax import nnx
import jax
import numpy as np

from benchmarks import SMOKE_HELP, SMOKE_NOTE, footage, loader
from vidjax import augment, config as config_lib, models, tasks, train
from vidjax.base import rundir
from vidjax.checkpoints import checkpoint_reader
from vidjax.data import (
  annotations,
  chunk,
  pipeline,
  video,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = {
  "distill": "umt_vitb_k400_pretrain.py:debug",
  "videomae": "videomae_vitb_k400_pretrain.py:debug",
}
# The demo's corpus (96 videos, 2 captioned segments of 3 s each) at the
# :debug recipes' clips; one student for both.
STUDENT = (
  "--config.data.synthetic.num_videos=96",
  "--config.data.synthetic.segment_seconds=3.0",
  "--config.data.num_frames=4",
  "--config.data.sampling=segment",  # The same clips for both (UMT's).
  "--config.data.size=64",
  "--config.data.hflip=0.0",
  "--config.model.tubelet=1",
  "--config.model.drop_path=0.0",
  "--config.optim.schedule=constant",
  "--config.optim.lr=1e-3",
  "--config.optim.warmup_steps=0",
  "--config.total_steps=1000000",
  "--config.checkpoint.every_steps=1000000",
  "--config.log.plots=false",
  "--config.device_memory_gib=-1",
)
SMOKE_CORPUS = ("--config.data.synthetic.num_videos=8",)


# ------------------------------------------------------------ training


def teacher_run(args, work: Path) -> Path:
  """The demo's trained CLIP: `--teacher`, or trained here once."""
  if args.teacher:
    return Path(args.teacher).resolve()
  workdir = work / f"teacher_demo_{args.teacher_steps}"
  ckpts = workdir / "checkpoints"
  if ckpts.is_dir() and checkpoint_reader.latest_complete_step(ckpts):
    return workdir
  spec = str(CONFIGS / "demo.py") + (":debug" if args.smoke else "")
  config = config_lib.load_config(
    spec,
    (
      f"--config.total_steps={args.teacher_steps}",
      "--config.log.plots=false",
    ),
  )
  print(f"training the teacher: {spec} for {args.teacher_steps} steps ...")
  train.train_and_evaluate(config, workdir)
  return workdir


def student_config(method: str, teacher: Path, smoke: bool):
  overrides = STUDENT + (SMOKE_CORPUS if smoke else ())
  if method == "distill":
    overrides += (f"--config.model.teacher.source={teacher}",)
  return config_lib.load_config(str(CONFIGS / RECIPES[method]), overrides)


def _encode_fn(config):
  """(params, rest, eval batch) -> float32[B, D]: the frozen encoder's
  normalised tokens, averaged."""
  model = nnx.eval_shape(
    lambda: models.build_model(config.model, rngs=nnx.Rngs(0))
  )
  graphdef = nnx.graphdef(model)
  task = tasks.get_task(config.task)
  normalise = augment.make_augment(
    {"dtype": "float32", **task.augment_config(config, train=False)}
  )

  @jax.jit
  def encode(params, rest, batch):
    batch = normalise(batch, jax.random.key(0))
    encoder = nnx.merge(graphdef, params, rest).encoder
    return encoder(batch["video"]).mean(axis=1), batch["index"], batch["valid"]

  return encode


def _features(run, config, encode, records) -> np.ndarray:
  """Every record's features, in the records' order."""
  batches = pipeline.make_pipeline(
    config, run.mesh, train=False, batch_size=16, records=records
  )
  rows = {}
  try:
    while True:
      try:
        batch = batches.next_batch()
      except StopIteration:
        break
      out = jax.tree.map(
        np.asarray, encode(run.state["params"], run.rest, batch)
      )
      for feature, index, valid in zip(*out):
        if valid:
          rows[int(index)] = feature
  finally:
    batches.close()
  return np.stack([rows[i] for i in range(len(records))])


# What a probe predicts of a clip, from its caption ('a red square moves
# left'): the word at this position.
ATTRIBUTES = {"colour": 1, "shape": 2, "motion": -1}


def _labels(records) -> dict[str, list[str]]:
  """Each clip's colour, shape and motion."""
  words = [r.text.split() for r in records]
  return {name: [w[i] for w in words] for name, i in ATTRIBUTES.items()}


def probe_accuracy(train_x, train_y, test_x, test_y, ridge=1.0) -> float:
  """A linear probe: ridge regression on one-hot targets over standardised
  features, then the argmax; its accuracy on the held-out clips."""
  classes = sorted(set(train_y) | set(test_y))
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  x = np.c_[(train_x - mean) / std, np.ones(len(train_x))]
  y = np.eye(len(classes))[[classes.index(c) for c in train_y]]
  w = np.linalg.solve(x.T @ x + ridge * np.eye(x.shape[1]), x.T @ y)
  z = np.c_[(test_x - mean) / std, np.ones(len(test_x))]
  guess = np.array(classes)[np.argmax(z @ w, axis=1)]
  return float(np.mean(guess == np.array(test_y)))


def train_and_probe(method, config, workdir: Path, budget: float, probes: int):
  """Trains for `budget` CPU seconds, probing at `probes` points.

  Returns:
    (rows: [{'step', 'cpu_s', 'colour', 'shape'}], the initial encoder's
    parameters as host arrays).
  """
  run = train.setup(config, workdir, splits=("train", "eval"))
  encode = _encode_fn(run.config)
  train_records = run.train_records
  eval_records = _eval_records(run.config)
  labels = _labels(train_records), _labels(eval_records)
  start = jax.tree.map(np.asarray, run.state["params"]["encoder"])
  key = jax.random.key(config.seed)
  rows, step, spent = [], 0, 0.0

  def probe():
    train_x = _features(run, run.config, encode, train_records)
    test_x = _features(run, run.config, encode, eval_records)
    row = {"step": step, "cpu_s": spent}
    for name in ATTRIBUTES:
      row[name] = probe_accuracy(
        train_x, labels[0][name], test_x, labels[1][name]
      )
      row[f"chance_{name}"] = 1 / len(set(labels[1][name]))
    rows.append(row)
    print(
      f"  {method:9s} step {step:5d}  {spent:6.1f} CPU s  colour "
      f"{row['colour']:.3f}  shape {row['shape']:.3f}  motion "
      f"{row['motion']:.3f}",
      flush=True,
    )

  probe()
  marks = list(np.linspace(budget / probes, budget, probes))
  batches = run.train_batches
  try:
    clock = None
    while marks:
      batch = batches.next_batch()
      run.state, _ = run.steps.train(run.state, run.rest, batch, key)
      step += 1
      if clock is None:  # The first step compiled: not counted.
        jax.block_until_ready(run.state)
        clock = time.process_time()
      elif step % 4 == 0:  # Queued steps, then counted.
        jax.block_until_ready(run.state)
        spent = time.process_time() - clock
        if spent >= marks[0]:
          marks.pop(0)
          probe()
          clock = time.process_time() - spent  # The probe not counted.
  finally:
    batches.close()
  return rows, start


def _eval_records(config):
  """The held-out clips (the corpus's val.jsonl: unseen videos)."""
  return annotations.load_records(
    config.data.format, config.data.eval_annotations
  )


# ------------------------------------------------------------ decoding


def decode_cost(args, work: Path) -> list[dict]:
  """read_clip's cost on the two recipes' clips (module docstring)."""
  source = footage.prepare_source(work, args.seconds, 568, 320)
  rows = []
  for profile in ("default", "sparse"):
    opts = chunk.ChunkOptions(**chunk.encode.PROFILES[profile])
    store = footage.store_for(source, opts, work)
    info = video.video_info(store, source.stem)
    shapes = {
      "8 sparse (UMT)": footage.sample_clips(
        "8seg", args.clips, info, args.seed
      ),
      "16x4 (VideoMAE)": footage.sample_clips(
        "16x4", args.clips, info, args.seed
      ),
    }
    for shape, clips in shapes.items():
      runner = loader.Runner(shape, "read_clip", str(source), str(store), 224)
      result = loader.measure([runner], clips, args.rounds, args.core)[shape]
      frames = len(clips[0][0])
      rows.append(
        {
          "profile": profile,
          "clip": shape,
          "decoded_per_delivered": result["decoded_per_delivered"],
          "clips_per_s": result["clips_per_s"],
          "frames_per_s": result["clips_per_s"] * frames,
        }
      )
  return rows


# ------------------------------------------------------------------ main


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.distill",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  parser.add_argument("--teacher", default="", help="a trained CLIP run")
  parser.add_argument("--teacher-steps", type=int, default=300)
  parser.add_argument("--cpu-seconds", type=float, default=240)
  parser.add_argument("--probes", type=int, default=4)
  parser.add_argument("--clips", type=int, default=48, help="decoded clips")
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--seconds", type=float, default=60, help="footage")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
  parser.add_argument(
    "--workdir",
    default=os.path.join(tempfile.gettempdir(), "vidjax_bench_distill"),
  )
  parser.add_argument("--skip-decode", action="store_true")
  parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
  args = parser.parse_args(argv)
  if args.smoke:
    vars(args).update(
      teacher_steps=2, cpu_seconds=2, probes=1, clips=2, rounds=1, seconds=4
    )
    print(f"--smoke ({SMOKE_NOTE})", flush=True)
  work = Path(args.workdir).resolve()
  work.mkdir(parents=True, exist_ok=True)
  teacher = teacher_run(args, work)

  results, starts = {}, {}
  stamp = time.strftime("%Y%m%d_%H%M%S")
  corpus = None
  for method in RECIPES:
    config = student_config(method, teacher, args.smoke)
    workdir = work / f"{method}_{stamp}"
    if corpus is not None:  # The first run's, the same corpus.
      shutil.copytree(corpus, workdir / rundir.SYNTHETIC)
    print(f"{method}: {args.cpu_seconds:g} CPU seconds ...", flush=True)
    results[method], starts[method] = train_and_probe(
      method, config, workdir, args.cpu_seconds, args.probes
    )
    corpus = workdir / rundir.SYNTHETIC
  same = jax.tree.all(
    jax.tree.map(np.array_equal, starts["distill"], starts["videomae"])
  )
  print(f"\nthe same start (initial encoder weights equal): {same}")
  print(
    f"{'method':9s} {'steps':>6s} {'CPU s':>7s} {'colour':>7s} {'shape':>7s}"
    f" {'motion':>7s} {'mean':>6s} {'gain/CPU-min':>13s}"
  )
  for method, rows in results.items():
    first, last = rows[0], rows[-1]
    mean = np.mean([last[a] for a in ATTRIBUTES])
    gain = mean - np.mean([first[a] for a in ATTRIBUTES])
    print(
      f"{method:9s} {last['step']:6d} {last['cpu_s']:7.1f} "
      f"{last['colour']:7.3f} {last['shape']:7.3f} {last['motion']:7.3f} "
      f"{mean:6.3f} {60 * gain / max(last['cpu_s'], 1e-9):+13.4f}"
    )
  start = results["distill"][0]
  print(
    "chance: "
    + ", ".join(f"{a} {start[f'chance_{a}']:.3f}" for a in ATTRIBUTES)
    + "; at the start (both): "
    + ", ".join(f"{a} {start[a]:.3f}" for a in ATTRIBUTES)
  )
  decoding = [] if args.skip_decode else decode_cost(args, work)
  if decoding:
    print(
      f"\n{'chunks':8s} {'clip':16s} {'decoded/delivered':>18s} "
      f"{'clips/CPU-s':>12s} {'frames/CPU-s':>13s}"
    )
    for row in decoding:
      print(
        f"{row['profile']:8s} {row['clip']:16s} "
        f"{row['decoded_per_delivered']:18.2f} {row['clips_per_s']:12.1f} "
        f"{row['frames_per_s']:13.0f}"
      )
  return {"training": results, "same_start": same, "decoding": decoding}


if __name__ == "__main__":
  main()
