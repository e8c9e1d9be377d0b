"""Indexing speed: `vidjax.search.embed`'s windows per second against the
evaluation step's clips per second, on the same model in the same run.

    python -m benchmarks.embed [--config configs/clip_vitb16_ego4d.py]
        [--videos 12] [--stride_s 1] [--batch N] [--smoke]
        [--config.KEY=VALUE ...]

Both read the same synthetic corpus of real H.264 chunks with the recipe's
reader settings (`config.data`) and the same parameters (random: speed does
not depend on them): the evaluation (`vidjax.steps`' eval step over the
corpus's held-out and training clips, with their captions, through
`vidjax.data.pipeline`) and the indexing (`vidjax.search.embed.embed_windows`:
the windows of the same videos, the video tower only, each video's rows
written to disk). Each runs once to compile, then once timed. The index
should not be loader-bound where the evaluation is not: its rate is meant
to be at least 90% of the evaluation's (it reads no text and runs one
tower, so it is usually faster).

Then the text side of a search: `vidjax.evaluation.zeroshot`'s classifier over the
text tower, for one query alone and per query in batches of `--queries`,
and the cosine scoring against an index of an hour of video at
`--stride_s`.

`--smoke`: the demo's `:debug` model on 4 tiny videos (seconds).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import statistics
import tempfile
import time

import jax
import numpy as np

from benchmarks import SMOKE_HELP, SMOKE_NOTE
from vidjax import config as config_lib, sharding, steps as steps_lib, tasks
from vidjax.data import checks, pipeline, synthetic
from vidjax.data.annotations import annotation_files
from vidjax.evaluation import zeroshot
from vidjax.search import embed, towers

REPO = Path(__file__).resolve().parents[1]


def eval_rate(config, mesh, steps, state, rest, tokenizer, records) -> float:
  """Clips per second of one evaluation pass (pipeline + eval step)."""
  batches = pipeline.make_pipeline(
    config,
    mesh,
    train=False,
    batch_size=config.eval.batch_size,
    tokenizer=tokenizer,
    records=records,
  )
  start, clips, out = time.perf_counter(), 0, None
  try:
    for batch in batches:
      out = steps.eval(state["params"], rest, batch)
      clips += int(np.asarray(batch["valid"]).sum())
    jax.block_until_ready(out)
  finally:
    batches.close()
  return clips / (time.perf_counter() - start)


def embed_rate(encoder, store, videos, workdir, window_s, stride_s) -> tuple:
  """(windows per second, windows) of `embed.embed_windows` over `videos`."""
  for part in (Path(workdir) / embed.VIDEOS).glob("*.npz"):
    part.unlink()
  start = time.perf_counter()
  embedded, _, failed = embed.embed_windows(
    encoder, store, videos, Path(workdir), window_s, stride_s, progress=False
  )
  seconds = time.perf_counter() - start
  assert not failed and len(embedded) == len(videos), failed
  windows = sum(
    len(np.load(p)["start"]) for p in (Path(workdir) / embed.VIDEOS).glob("*")
  )
  return windows / seconds, windows


def text_ms(encoder, queries: list[str], repeats: int = 5) -> float:
  """Median milliseconds per query of embedding `queries` at once."""
  times = []
  for _ in range(repeats + 1):  # The first compiles.
    start = time.perf_counter()
    zeroshot.class_embeddings(
      encoder.encode_tokens,
      encoder.tokenizer,
      queries,
      ("{}",),
      batch_size=encoder.text_batch,
    )
    times.append(time.perf_counter() - start)
  return statistics.median(times[1:]) / len(queries) * 1e3


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.embed", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("--config", default=None)
  parser.add_argument("--videos", type=int, default=12)
  parser.add_argument("--stride_s", type=float, default=1.0)
  parser.add_argument("--window_s", type=float, default=None)
  parser.add_argument("--queries", type=int, default=64)
  parser.add_argument(
    "--batch",
    type=int,
    default=0,
    help="clips per batch, both (0: the "
    "recipe's eval.batch_size; a CPU wants a few)",
  )
  parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
  args, overrides = parser.parse_known_args(argv)
  spec = args.config or (
    f"{REPO}/configs/demo.py:debug"
    if args.smoke
    else f"{REPO}/configs/clip_vitb16_ego4d.py"
  )
  config = config_lib.load_config(spec, overrides)
  if args.batch:
    config.eval.batch_size = args.batch
  num_videos = 4 if args.smoke else args.videos
  with tempfile.TemporaryDirectory(prefix="vidjax-bench-embed-") as tmp:
    root = synthetic.make_corpus(
      Path(tmp) / "corpus",
      num_videos=num_videos,
      segment_seconds=2.0,
      progress=False,
    )
    if not config.data.vocab:
      config.data.vocab = os.fspath(
        synthetic.write_vocab(root / "vocab.txt.gz")
      )
    config.data.update(
      root=os.fspath(root / "chunks"),
      format="jsonl",
      eval_clips=1,
      eval_crops=1,
    )
    records = annotation_files.load_annotations(
      config.data, os.fspath(root / "train.jsonl")
    ) + annotation_files.load_annotations(
      config.data, os.fspath(root / "val.jsonl")
    )
    config_lib.validate(config, jax.device_count())
    tokenizer = checks.load_tokenizer(config)
    mesh = sharding.make_mesh(fsdp=config.fsdp)
    state, rest, steps = steps_lib.build_state_and_steps(
      config, tasks.get_task(config.task), mesh
    )
    encoder = towers.make_encoder(
      config, mesh, state["params"], rest, tokenizer, "random parameters"
    )
    window_s = args.window_s or embed.default_window_s(config.data)
    videos = sorted({r.video_id for r in records})
    index = Path(tmp) / "index"
    index.mkdir()
    rates = {}
    for _ in range(2):  # The first pass compiles.
      rates["eval"] = eval_rate(
        config, mesh, steps, state, rest, tokenizer, records
      )
      rates["embed"], windows = embed_rate(
        encoder, root / "chunks", videos, index, window_s, args.stride_s
      )
    one = text_ms(encoder, ["a red square moves left"])
    many = text_ms(
      encoder, [f"query number {k}" for k in range(args.queries)], repeats=2
    )
  dim = int(config.model.embed_dim)
  hour = (
    np.random.default_rng(0)
    .standard_normal((int(3600 / args.stride_s), dim))
    .astype(np.float32)
  )
  start = time.perf_counter()
  hour @ np.ones((dim, 1), np.float32)
  score_ms = (time.perf_counter() - start) * 1e3
  ratio = rates["embed"] / rates["eval"]
  per_hour = 3600 / args.stride_s / rates["embed"]
  verdict = "" if args.smoke or ratio >= 0.9 else " (BELOW 90%)"
  print(
    (f"--smoke ({SMOKE_NOTE})\n" if args.smoke else "")
    + f"{spec}: {jax.device_count()} {jax.devices()[0].platform} devices, "
    f"{config.data.num_frames} frames of {config.data.size} px, "
    f"D={dim}\n"
    f"  eval step    {rates['eval']:8.3g} clips/s ({len(records)} clips)\n"
    f"  embed        {rates['embed']:8.3g} windows/s ({windows} windows of "
    f"{window_s:g} s every {args.stride_s:g} s): {ratio:.0%} of the "
    f"evaluation's rate{verdict}\n"
    f"  per hour of video: {per_hour:.0f} s to embed at {args.stride_s:g} s "
    f"stride ({3600 / args.stride_s:.0f} windows, "
    f"{3600 / args.stride_s * dim * 2 / 1e6:.1f} MB float16)\n"
    f"  text         {one:8.1f} ms for one query, {many:.2f} ms per query "
    f"in batches of {args.queries}; scoring an hour's windows {score_ms:.2f} ms"
  )
  return {
    "eval_clips_per_s": rates["eval"],
    "embed_windows_per_s": rates["embed"],
    "ratio": ratio,
    "seconds_per_hour": per_hour,
    "text_ms_one": one,
    "text_ms_batched": many,
  }


if __name__ == "__main__":
  main()
