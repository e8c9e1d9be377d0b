"""What checkpoint checksums cost: a recipe's train state saved, verified, restored.

    python -m benchmarks.checkpoint [--config configs/clip_vitb16_ego4d.py] \
        [--dir /tmp/vidjax_bench_checkpoint] [--rounds 3] [--smoke]

The train state of the recipe (parameters and optimizer state, float32, as
`vidjax.steps` builds it) filled with random values (they do not compress,
as trained weights barely do) is saved by `vidjax.checkpoints.checkpoint.Checkpointer`
into `--dir` (a disk like the one runs write to) and then:

  save           the whole save, checksums included, waited for;
  checksums      of which listing the checksums (files in the page cache);
  restore        the baseline: a restore with the files evicted from the
                 page cache first (`posix_fadvise`), as at a run's start;
  verify         reading and checking every file, evicted first;
  + restore      the restore right after (the files are now cached): what
                 a resumed run paid while it verified before restoring;
  resume         what a resumed run pays now: the restore of
                 `checkpoint_reader.RunCheckpoints`, which verifies the
                 metadata files first and the arrays' files beside the
                 restore, as it reads them (evicted first).

The three take turns `--rounds` times; medians are printed.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import time

import jax
import numpy as np

from benchmarks import SMOKE_HELP, SMOKE_NOTE
from vidjax import config as config_lib, sharding, steps as steps_lib, tasks
from vidjax.checkpoints import checkpoint, checkpoint_reader, checksums
from vidjax.report import console


def _evict(directory: str) -> None:
  """Drops a directory's files from the page cache (clean pages only)."""
  for root, _, names in os.walk(directory):
    for name in names:
      fd = os.open(os.path.join(root, name), os.O_RDONLY)
      try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
      finally:
        os.close(fd)


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.checkpoint",
    description=__doc__.splitlines()[0],
  )
  parser.add_argument("--config", default="configs/clip_vitb16_ego4d.py")
  parser.add_argument("--dir", default="/tmp/vidjax_bench_checkpoint")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
  args = parser.parse_args(argv)
  # Orbax's notes on every read-only open (a restore) kept off the figures.
  console.setup_console()  # Process-wide: not for library use.
  if args.smoke:
    args.config, args.rounds = "configs/demo.py:debug", 1
    print(f"--smoke ({SMOKE_NOTE})", flush=True)
  config = config_lib.load_config(args.config, [])
  mesh = sharding.make_mesh()
  target = steps_lib.build_state_and_steps(
    config, tasks.get_task(config.task), mesh, abstract=True
  )[0]
  rng = np.random.default_rng(0)
  state = jax.tree.map(
    lambda x: jax.device_put(
      rng.standard_normal(x.shape, np.float32).astype(x.dtype), x.sharding
    ),
    target,
  )
  size = sum(x.nbytes for x in jax.tree.leaves(state))
  arrays = len(jax.tree.leaves(state))
  shutil.rmtree(args.dir, ignore_errors=True)
  with checkpoint.Checkpointer(
    args.dir, every_steps=1, async_save=False
  ) as ckpt:
    save_s, _ = _timed(functools.partial(ckpt.save, 1, state))
  step_dir = os.path.join(args.dir, "1")
  on_disk = sum(
    os.path.getsize(os.path.join(r, n))
    for r, _, names in os.walk(step_dir)
    for n in names
  )
  list_s, _ = _timed(lambda: checksums.write(step_dir))
  del state
  restore = lambda: jax.block_until_ready(
    checkpoint_reader.restore_checkpoint(args.dir, target, step=1).state
  )

  def resume():
    with checkpoint_reader.RunCheckpoints(args.dir) as ckpts:
      assert ckpts.verify(1, "metadata") is None
      return jax.block_until_ready(ckpts.restore(1, target).state)

  times = {"restore": [], "verify": [], "warm": [], "resume": []}
  for _ in range(args.rounds):
    _evict(step_dir)
    times["restore"].append(_timed(restore)[0])
    _evict(step_dir)
    verify_s, problem = _timed(lambda: checksums.verify(step_dir))
    assert problem is None, problem
    times["verify"].append(verify_s)
    times["warm"].append(_timed(restore)[0])
    _evict(step_dir)
    times["resume"].append(_timed(resume)[0])
  shutil.rmtree(args.dir, ignore_errors=True)
  restore_s, verify_s, warm_s, resume_s = (
    float(np.median(times[k])) for k in ("restore", "verify", "warm", "resume")
  )

  gb = on_disk / 1e9
  print(
    f"{args.config}: train state {size / 1e9:.2f} GB in memory, "
    f"{gb:.2f} GB on disk, {arrays} arrays; {os.cpu_count()} CPUs; "
    f"medians of {args.rounds} rounds"
  )
  print(
    f"save        {save_s:6.2f} s  (checksums {list_s:.2f} s of it, "
    f"{gb / list_s:.2f} GB/s)"
  )
  print(f"restore     {restore_s:6.2f} s  baseline, files not cached")
  print(
    f"verify      {verify_s:6.2f} s  ({gb / verify_s:.2f} GB/s), "
    "files not cached"
  )
  print(f"+ restore   {warm_s:6.2f} s  files cached by verify")
  print(
    f"resume      {resume_s:6.2f} s  verified as the restore reads, files "
    "not cached"
  )
  print(
    f"resume: {resume_s:.2f} s instead of {restore_s:.2f} s "
    f"({resume_s / restore_s:.2f}x; verifying first, then restoring: "
    f"{verify_s + warm_s:.2f} s, {(verify_s + warm_s) / restore_s:.2f}x)"
  )


if __name__ == "__main__":
  main()
