"""Grain's worker processes: started, watched, their blocks named, deaths told.

A pipeline with `data.workers > 0` has one `Workers`. In each worker, before
its first clip (`init_fn`), absl's flags are marked parsed (Grain reads them
there; outside an absl app they never were), and a thread starts that every
`WATCH_S` seconds

- ends the worker once its trainer is gone: a trainer killed with SIGKILL
  would otherwise leave its workers decoding for minutes. (Not
  PR_SET_PDEATHSIG: it follows the thread that started the worker, one of
  Grain's, which ends before the workers are stopped.)
- publishes the worker's pid and the chunk files it is reading
  (`vidjax.data.reads`) in a small /dev/shm block, for the stall warning.

Frames cross to the main process in /dev/shm blocks that each worker
reuses: a worker decodes each clip straight into a block of its own not in
use (`clip_array`, named `vidjax_<trainer pid>_<pipeline>_<worker
pid>_<n>`), and hands over a group's clips as one `Slot` (the blocks'
names, the group's shape and dtype, a few bytes pickled:
`stack_to_shared_memory`); the main process copies the frames out
(`receive`, keeping the blocks mapped) and marks each block free again in
its first byte. Blocks are made only while all of a worker's are in use, so
each worker keeps as many as it ever had in flight at once; a fresh block
per clip would cost both processes a page fault (and the worker the
zeroing) of every 4 KiB of frames: about a millisecond per 4-frame clip.
Decoding into the block, not into an array then stacked into one, saves
the worker a copy of the frames and an allocation per clip (about 2 % of
its time: `python -m benchmarks.pipeline`). The
pipeline's `close` unlinks the blocks. Python's
resource tracker, a process of the trainer's that outlives it, unlinks the
blocks left once the trainer and its workers are gone; a kill of the whole
process group (how SLURM cancels) takes the tracker too, so a janitor in a
session of its own (`start_janitor`) unlinks what the trainer left then,
Grain's semaphores included: nothing stays in /dev/shm.

Workers start lean: Grain's worker processes run `vidjax.data.lean_worker`
as their main module instead of the trainer's, which would import jax,
flax and all of vidjax into each of them (`LEAN`; see that module).

In the main process, `describe(index)` says what a worker is doing (as the
kernel sees it: sleeping, stopped, blocked on IO; and the files it reads),
and `died(error)` turns Grain's "terminated unexpectedly" into a
`DataWorkerDied` naming the worker, the signal or exit code, and whether
the kernel's OOM killer struck (the memory cgroup's `oom_kill` count).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
from multiprocessing import shared_memory, spawn
import os
import secrets
import signal
import threading
import time

from absl import flags
import numpy as np

from vidjax.base import errors, internals
from vidjax.data import reads

SHM_DIR = "/dev/shm"
PREFIX = "vidjax_"  # Of every /dev/shm block of vidjax's.
WATCH_S = (
  0.5  # How often a worker looks for its trainer and says what it reads.
)
STATUS_BYTES = 16384
# Arrays smaller than this cross from workers pickled, not through /dev/shm:
# a block per token array or label would cost more than the copy.
MIN_SHM_BYTES = 4096
# A block's frames start this far in (the flag byte, then XLA's alignment).
SLOT_HEADER = 64
IN_USE, FREE = 1, 0  # A block's first byte.
STATUS_READS = 8  # Reads in progress published per worker, oldest first.
# Process states in /proc/PID/stat, as the warning says them.
STATES = {
  "R": "running",
  "S": "sleeping",
  "D": "blocked in the kernel on IO: a stuck file system?",
  "T": "stopped: SIGCONT resumes it",
  "t": "stopped by a debugger",
  "Z": "dead",
  "X": "dead",
}


def mark_flags_parsed() -> None:
  """Grain reads absl flags in the trainer and in its workers; outside an
  absl app (notebooks, tests) they were never parsed, which raises
  UnparsedFlagAccessError. Their defaults are what we want.

  Process-wide: absl's global `flags.FLAGS` is marked parsed (flags
  defined later keep their defaults).
  """
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


# Grain's worker processes are named so; they start lean while LEAN is set.
GRAIN_WORKER = "grain-process-prefetch"
LEAN_MAIN = "vidjax.data.lean_worker"
LEAN = True
_preparation_data = spawn.get_preparation_data


def _lean_preparation_data(name: str) -> dict:
  """What a spawned process is told to run first: for Grain's workers,
  `LEAN_MAIN` instead of the trainer's main module."""
  data = _preparation_data(name)
  if LEAN and name.startswith(GRAIN_WORKER):
    data.pop("init_main_from_path", None)
    data["init_main_from_name"] = LEAN_MAIN
  return data


class Workers:
  """The worker processes of one pipeline, seen from the trainer."""

  def __init__(self, count: int):
    spawn.get_preparation_data = _lean_preparation_data  # Python's spawn.
    self.count = count
    self.trainer = os.getpid()
    self.prefix = f"{PREFIX}{self.trainer}_{secrets.token_hex(3)}_"
    self._oom_kills = oom_kills()
    start_janitor()

  def init_fn(self):
    """Grain's `worker_init_fn`: called with (index, count) in each worker."""
    return functools.partial(
      _init_worker, trainer=self.trainer, prefix=self.prefix
    )

  def status(self, index: int) -> dict | None:
    """{'pid', 'reads': [(path, start), ...]} as worker `index` last
    published it; None before it did."""
    try:
      with open(os.path.join(SHM_DIR, f"{self.prefix}w{index}"), "rb") as f:
        return json.loads(f.read(STATUS_BYTES).split(b"\0", 1)[0])
    except (OSError, ValueError):
      return None

  def describe(self, index: int) -> str:
    """'worker 1 of 2 (pid 4242, sleeping), reading FILE for 59 s'."""
    status = self.status(index)
    if status is None:
      return f"worker {index} of {self.count} (starting)"
    state = _stat(status["pid"])[0]
    return (
      f"worker {index} of {self.count} (pid {status['pid']}, "
      f"{STATES.get(state, 'gone')}), {reads.describe(status['reads'])}"
    )

  def kill(self) -> None:
    """SIGKILL to the workers still running (their clips are not needed);
    one still starting (no status yet) ends itself once it starts, seeing
    the pipeline's stop mark."""
    with contextlib.suppress(OSError):
      open(_stop_mark(self.prefix), "wb").close()
    for index in range(self.count):
      status = self.status(index)
      if status and _stat(status["pid"])[1] == self.trainer:
        try:
          os.kill(status["pid"], signal.SIGKILL)
        except ProcessLookupError:
          pass

  def died(
    self, error: BaseException, waiting_on: int
  ) -> errors.DataWorkerDied | None:
    """The error to raise for Grain's `error` if it says a worker died.

    Args:
      error: what Grain raised.
      waiting_on: the worker the pipeline was waiting on: the dead one,
        unless the processes say otherwise.
    """
    exit_code = internals.grain_worker_exit_code(error)
    if exit_code is None:
      return None
    pids = {i: s["pid"] for i in range(self.count) if (s := self.status(i))}
    dead = [i for i, pid in pids.items() if _stat(pid)[0] in (None, "Z", "X")]
    index = dead[0] if len(dead) == 1 else waiting_on
    before, now = self._oom_kills, oom_kills()
    new_oom_kills = None if None in (before, now) else now - before
    return errors.DataWorkerDied(
      f"data worker {index} of {self.count} (pid "
      f"{pids.get(index, 'unknown')}) died: "
      f"{describe_exit(exit_code, new_oom_kills)}",
      hint="the same command resumes from the last checkpoint"
      + (
        ""
        if new_oom_kills == 0
        else "; to use less memory, lower "
        "--config.data.workers, --config.data.threads or "
        "--config.data.worker_buffer"
      ),
    )

  def close(self) -> None:
    """Once the workers are stopped: unmaps and unlinks the blocks of this
    pipeline (also those of killed workers that never reached this
    process), and its workers' status."""
    with contextlib.suppress(OSError):
      os.unlink(_stop_mark(self.prefix))  # Not a block.
    for name in unmap(self.prefix):
      _unlink(name)
    try:
      names = os.listdir(SHM_DIR)
    except OSError:
      return  # Not Linux: Python's resource tracker unlinks them at exit.
    for name in names:
      if name.startswith(self.prefix):
        _unlink(name)


class Slot:
  """A group's array in a worker's /dev/shm blocks (what crosses pickled).

  Attributes:
    names: the blocks' names, one per row (a clip); each row starts at
      `SLOT_HEADER` in its block.
    shape, dtype: the whole array's, e.g. (group, T, H, W, 3), uint8.
  """

  __slots__ = ("names", "shape", "dtype")

  def __init__(self, names: tuple[str, ...], shape: tuple[int, ...], dtype):
    self.names, self.shape = tuple(names), tuple(shape)
    self.dtype = np.dtype(dtype)

  def __reduce__(self):
    return Slot, (self.names, self.shape, self.dtype.str)


# In the main process: the blocks mapped so far, by name (kept mapped, so
# a block's pages are faulted in once, not at every group).
_MAPPED: dict[str, shared_memory.SharedMemory] = {}
_MAPPED_LOCK = threading.Lock()


def receive(slot: Slot, out: np.ndarray) -> None:
  """Copies a `Slot`'s array into `out` (its shape) and frees its blocks
  for the worker to reuse."""
  for name, row in zip(slot.names, out, strict=True):
    with _MAPPED_LOCK:
      block = _MAPPED.get(name)
      if block is None:
        block = _MAPPED[name] = shared_memory.SharedMemory(name)
    view = _frames(block, row.shape, slot.dtype)
    row[...] = view
    del view  # No view left: the block can be closed.
    block.buf[0] = FREE


def unmap(prefix: str) -> list[str]:
  """Closes this process's mappings of the blocks named `prefix...`;
  returns their names."""
  with _MAPPED_LOCK:
    names = [name for name in _MAPPED if name.startswith(prefix)]
    for name in names:
      with contextlib.suppress(BufferError):  # A view left: unmapped at exit.
        _MAPPED.pop(name).close()
  return names


def _unlink(name: str) -> None:
  """Unlinks a /dev/shm block (and tells Python's resource tracker)."""
  try:
    block = shared_memory.SharedMemory(name)
  except FileNotFoundError:
    return
  block.close()
  block.unlink()


# The janitor: a small process of its own session (a kill of the trainer's
# process group, as SLURM cancels a job, does not reach it) that notes the
# /dev/shm names the trainer and its child processes map (Grain's
# semaphores, most of them its workers', Python's blocks) and,
# once the trainer is gone, unlinks those still there and every block named
# after the trainer. Python's resource tracker does the same, but is in the
# trainer's group and dies with it. It reads the memory maps (~1 ms for a
# process with jax) only when /dev/shm has a name it has not placed yet,
# each new name at most `tries` times, so it costs next to nothing while a
# run trains. Plain Python (-S, -I): nothing to import.
_JANITOR = """
import os, sys, time
trainer, prefix, shm, every = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
kinds, tries = ("sem.mp-", "psm_"), 3
seen, looked = set(), {}
while os.getppid() == trainer:
  new = [n for n in os.listdir(shm) if n.startswith(kinds) and n not in seen
         and looked.get(n, 0) < tries]
  if new:
    try:
      with open(f"/proc/{trainer}/maps") as f:
        maps = f.read()
    except OSError:
      break
    for pid in os.listdir("/proc"):  # Its workers' too: theirs are theirs.
      try:
        with open(f"/proc/{pid}/stat") as f:
          if int(f.read().rsplit(")", 1)[1].split()[1]) != trainer:
            continue
        with open(f"/proc/{pid}/maps") as f:
          maps += f.read()
      except (OSError, ValueError, IndexError):
        pass
    # By inode: glibc maps a semaphore under the temporary name it made it
    # with, then links it to its own.
    mapped = {tuple(line.split()[3:5]) for line in maps.splitlines()}
    for name in new:
      try:
        st = os.stat(os.path.join(shm, name))
      except OSError:
        continue
      dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
      if (dev, str(st.st_ino)) in mapped:
        seen.add(name)
      looked[name] = looked.get(name, 0) + 1
  time.sleep(every)
time.sleep(3 * every)  # The workers see their trainer gone and end.
for name in os.listdir(shm):
  if name.startswith(prefix) or name in seen:
    try:
      os.unlink(os.path.join(shm, name))
    except OSError:
      pass
"""
_janitor: list = []


def start_janitor() -> None:
  """Starts this process's /dev/shm janitor (once; Linux only)."""
  if _janitor or not os.path.isdir(f"/proc/{os.getpid()}"):
    return
  import subprocess
  import sys

  _janitor.append(
    subprocess.Popen(
      [
        sys.executable,
        "-S",
        "-I",
        "-c",
        _JANITOR,
        str(os.getpid()),
        f"{PREFIX}{os.getpid()}_",
        SHM_DIR,
        str(WATCH_S),
      ],
      stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True,
      close_fds=True,
    )
  )


def describe_exit(code: int, new_oom_kills: int | None) -> str:
  """How a process ended: its exit code (>= 0) or the signal (-code), and
  for SIGKILL whether the kernel's OOM killer struck meanwhile."""
  if code >= 0:
    return f"it exited with code {code}"
  try:
    name = signal.Signals(-code).name
  except ValueError:
    name = "a signal"
  how = f"killed by {name} (signal {-code})"
  if -code != signal.SIGKILL:
    return how
  if new_oom_kills:
    return (
      f"{how}: out of memory (the kernel's OOM killer killed "
      f"{new_oom_kills} process{'es' if new_oom_kills > 1 else ''} of "
      "this run's memory cgroup meanwhile)"
    )
  if new_oom_kills is None:
    return f"{how}, by hand or by the kernel's OOM killer (dmesg says which)"
  return (
    f"{how}, not by the kernel's OOM killer (this run's memory cgroup "
    "counts none)"
  )


def oom_kills() -> int | None:
  """The kernel's count of OOM kills in this process's memory cgroup (v2's
  memory.events, v1's memory.oom_control), or None where it says none."""
  try:
    with open("/proc/self/cgroup") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  files = []
  for line in lines:
    _, controllers, path = line.split(":", 2)
    if not controllers:  # cgroup v2
      root, name = "/sys/fs/cgroup", "memory.events"
    elif "memory" in controllers.split(","):
      root, name = "/sys/fs/cgroup/memory", "memory.oom_control"
    else:
      continue
    # In a container the cgroup is often mounted as the root.
    files += [
      os.path.join(root, path.lstrip("/"), name),
      os.path.join(root, name),
    ]
  for file in files:
    try:
      with open(file) as f:
        counts = dict(line.split() for line in f if line.strip())
      return int(counts["oom_kill"])
    except (OSError, ValueError, KeyError):
      continue
  return None


def _stat(pid: int) -> tuple[str | None, int | None]:
  """(state letter, parent pid) of a process; (None, None) if it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()  # After "(command)".
  except (OSError, IndexError):
    return None, None
  return fields[0], int(fields[1])


# ---------------------------------------------------------------------------
# In the workers.
# ---------------------------------------------------------------------------
_BLOCKS = itertools.count()  # This worker's blocks, numbered.


def _init_worker(index: int, count: int, *, trainer: int, prefix: str) -> None:
  mark_flags_parsed()
  del count
  _PREFIX.append(prefix)
  status = shared_memory.SharedMemory(
    f"{prefix}w{index}", create=True, size=STATUS_BYTES
  )
  threading.Thread(
    target=_watch,
    args=(trainer, status, _stop_mark(prefix)),
    daemon=True,
    name="vidjax-worker-watch",
  ).start()


def _stop_mark(prefix: str) -> str:
  """The file that tells a pipeline's workers to end (`Workers.kill`)."""
  return os.path.join(SHM_DIR, f"{prefix}stop")


def _watch(
  trainer: int, status: shared_memory.SharedMemory, stop_mark: str
) -> None:
  """Publishes what this worker reads; ends it once its trainer is gone
  or its pipeline is stopped."""
  while os.getppid() == trainer and not os.path.exists(stop_mark):
    publish(status, os.getpid(), reads.in_progress())
    time.sleep(WATCH_S)
  os._exit(1)


def publish(
  status: shared_memory.SharedMemory,
  pid: int,
  in_progress: list[tuple[str, float]],
) -> None:
  """Writes a worker's status block, as `Workers.status` reads it."""
  blob = json.dumps({"pid": pid, "reads": in_progress[:STATUS_READS]})
  blob = blob.encode()[: STATUS_BYTES - 1] + b"\0"
  status.buf[: len(blob)] = blob


# This worker's blocks by size, each in use (a clip's frames in it, not yet
# copied by the main process) or free, as its first byte says.
_POOL: dict[int, list[shared_memory.SharedMemory]] = {}
# In a worker: its pipeline's block prefix (`_init_worker`), and the blocks
# `clip_array` handed out, by the address of the array in them.
_PREFIX: list[str] = []
_CLIPS: dict[int, shared_memory.SharedMemory] = {}
_POOL_LOCK = threading.Lock()  # For the pool, `_CLIPS` and blocks' flags.


def clip_array(shape: tuple[int, ...], dtype) -> np.ndarray | None:
  """Where a worker decodes a clip: an array in a free /dev/shm block of its
  own, which `stack_to_shared_memory` hands over without a copy (and
  `release` frees if the read fails). None outside a worker, or for fewer
  than `MIN_SHM_BYTES`: the reader makes its own array."""
  dtype = np.dtype(dtype)
  nbytes = math.prod(shape) * dtype.itemsize
  if not _PREFIX or nbytes < MIN_SHM_BYTES:
    return None
  block = _free_block(nbytes)
  array = _frames(block, shape, dtype)
  with _POOL_LOCK:
    _CLIPS[array.ctypes.data] = block
  return array


def release(array: np.ndarray | None) -> None:
  """Frees the block of a `clip_array` that will not be handed over."""
  with _POOL_LOCK:
    block = array is not None and _CLIPS.pop(array.ctypes.data, None)
    if block:
      block.buf[0] = FREE


def _frames(
  block: shared_memory.SharedMemory, shape: tuple[int, ...], dtype
) -> np.ndarray:
  """The array of `shape` and `dtype` at a block's frames."""
  return np.ndarray(shape, dtype, block.buf, offset=SLOT_HEADER)


def _free_block(nbytes: int) -> shared_memory.SharedMemory:
  """A block of this worker for `nbytes` of frames, marked in use (by one
  reader thread: `data.threads` decode side by side in a worker)."""
  with _POOL_LOCK:
    blocks = _POOL.setdefault(nbytes, [])
    block = next((b for b in blocks if b.buf[0] == FREE), None)
    if block is None:
      block = shared_memory.SharedMemory(
        f"{_PREFIX[0]}{os.getpid()}_{next(_BLOCKS)}",
        create=True,
        size=SLOT_HEADER + nbytes,
      )
      blocks.append(block)
    block.buf[0] = IN_USE
  return block


def stack_to_shared_memory(values: list[dict]) -> dict:
  """A Grain `batch_fn` run in the workers: a group's clips (dicts of
  arrays) with each large array as a `Slot` of the /dev/shm blocks its
  rows were decoded into (`clip_array`), with no copy; arrays under
  `MIN_SHM_BYTES` stacked (pickled)."""
  out = {}
  for key in values[0]:
    parts = [np.asarray(v[key]) for v in values]
    first = parts[0]
    if (
      first.dtype.hasobject
      or first.dtype.kind in "US"
      or first.nbytes < MIN_SHM_BYTES
    ):
      out[key] = np.stack(parts)  # Pickled: a block would cost more.
      continue
    names = [_block_of(part).name for part in parts]
    out[key] = Slot(names, (len(parts),) + first.shape, first.dtype)
  return out


def _block_of(part: np.ndarray) -> shared_memory.SharedMemory:
  """The block a group's row crosses in: its own, if it was decoded into one
  (`clip_array`), else a free one it is copied into (an invalid clip's
  zeros)."""
  with _POOL_LOCK:
    block = _CLIPS.pop(part.ctypes.data, None)
  if block is None:
    block = _free_block(part.nbytes)
    _frames(block, part.shape, part.dtype)[...] = part
  return block
