"""The input pipeline when the machine misbehaves: a read that never returns,
a data worker killed, the trainer killed; and resuming with other workers.

The training runs are the demo's `:debug` reference (`debug_runs`): each
interrupted run is resumed with another `data.workers` and its losses are
compared with the uninterrupted run's, step by step.
"""

import os
from pathlib import Path
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import debug_runs
import limits
from test_train import losses
from vidjax import train
from vidjax.base import errors
from vidjax.checkpoints import checkpoint_reader
from vidjax.data import pipeline, workers

REPO = Path(__file__).resolve().parents[1]
STEPS = debug_runs.DEMO_REFERENCE_STEPS
# No evaluation before the end: only the training reads are blocked or cut.
OVERRIDES = (
  *debug_runs.DEMO_REFERENCE,
  f"--config.total_steps={STEPS}",
  "--config.eval.every_steps=1000",
)
wait_for = limits.wait_for


def _stat(pid) -> list[str]:
  """/proc/PID/stat's fields after the command: state, parent, ..."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return ["gone", ""]


def alive(pid: int) -> bool:
  return _stat(pid)[0] not in ("gone", "Z")


def workers_of(pid: int) -> list[int]:
  """The live Grain workers (spawned by multiprocessing) of process `pid`."""

  def spawned(child):
    try:
      with open(f"/proc/{child}/cmdline", "rb") as f:
        return b"spawn_main" in f.read()
    except OSError:
      return False

  return [
    int(p)
    for p in os.listdir("/proc")
    if p.isdigit() and _stat(p)[1] == str(pid) and alive(p) and spawned(p)
  ]


def blocks_of(pid: int) -> list[str]:
  """The /dev/shm blocks of process `pid`'s pipelines (named after it)."""
  return [
    n
    for n in os.listdir(workers.SHM_DIR)
    if n.startswith(f"{workers.PREFIX}{pid}_")
  ]


@pytest.mark.slow
@pytest.mark.xdist_group("demo_reference")
def test_a_stuck_read_and_a_killed_worker_each_stop_after_saving_the_last_step(
  tmp_path, tmp_path_factory, monkeypatch
):
  """One run, stopped twice, resumed with another number of workers each
  time; its losses are the uninterrupted run's.

  1. (0 workers, the real command) After the first steps every chunk
     becomes a FIFO nobody writes, as on a stuck mount: the warning names
     the file the pipeline waits on; SIGTERM then saves the last step and
     exits 75, although a thread stays stuck in the read.
  2. (resumed with 2 workers) Worker 1 is killed with SIGKILL: the last
     completed step is saved and the error says which worker and how.
  3. (resumed with 1 worker) A few more steps.
  """
  reference = debug_runs.demo_reference(tmp_path_factory)
  config = debug_runs.load("demo", *OVERRIDES, "--config.data.workers=0")
  workdir = debug_runs.prepare(config, tmp_path / "run", tmp_path_factory)
  saved = lambda: checkpoint_reader.latest_complete_step(
    workdir / "checkpoints"
  )
  log = lambda: (
    (workdir / "log.txt").read_text() if (workdir / "log.txt").exists() else ""
  )
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "vidjax.main",
      "--config",
      str(debug_runs.CONFIGS / "demo.py:debug"),
      "--workdir",
      str(workdir),
      *OVERRIDES,
      "--config.data.stall_warn_s=1",
    ],
    cwd=REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  chunks = sorted((workdir / "synthetic" / "chunks").glob("*/*.mp4"))
  try:
    wait_for(lambda: losses(workdir) or proc.poll() is not None, "a step")
    for chunk in chunks:
      chunk.rename(chunk.with_suffix(".real"))
      os.mkfifo(chunk)
    stall = wait_for(
      lambda: (
        re.search(
          r"no training batch for \d+ s: waiting on this process, reading "
          r"(\S+\.mp4) for \d+ s",
          log(),
        )
        or proc.poll() is not None
      ),
      "the stall warning",
    )
    assert isinstance(stall, re.Match), log()[-3000:]
    assert Path(stall.group(1)) in chunks
    proc.send_signal(signal.SIGTERM)
    assert limits.wait(proc) == errors.EXIT_PREEMPTED, log()[-3000:]
  finally:
    proc.kill()
    for chunk in chunks:
      chunk.unlink(missing_ok=True)
      chunk.with_suffix(".real").rename(chunk)
  stopped = saved()
  assert stopped == max(losses(workdir)) < STEPS - 4, log()[-3000:]
  assert f"stopped at step {stopped}" in log()

  pipes, killed = [], []  # The resumed run's pipeline; its worker 1 killed.
  make_pipeline = pipeline.make_pipeline
  monkeypatch.setattr(
    pipeline,
    "make_pipeline",
    lambda *a, **k: pipes.append(make_pipeline(*a, **k)) or pipes[-1],
  )

  def kill_worker_1():
    killed.append(
      wait_for(lambda: pipes and pipes[0].workers.status(1), "worker 1")["pid"]
    )
    os.kill(killed[0], signal.SIGKILL)

  threading.Thread(target=kill_worker_1, daemon=True).start()
  with pytest.raises(errors.DataWorkerDied) as died:
    train.train_and_evaluate(
      debug_runs.load("demo", *OVERRIDES, "--config.data.workers=2"), workdir
    )
  monkeypatch.undo()
  assert re.fullmatch(
    rf"data worker 1 of 2 \(pid {killed[0]}\) died: "
    r"killed by SIGKILL \(signal 9\).*",
    str(died.value),
  )
  assert saved() == max(losses(workdir)) > stopped

  total = saved() + 3
  train.train_and_evaluate(
    debug_runs.load(
      "demo",
      *OVERRIDES,
      "--config.data.workers=1",
      f"--config.total_steps={total}",
    ),
    workdir,
  )
  resumed, expected = losses(workdir), losses(reference)
  assert sorted(resumed) == list(range(1, total + 1))
  np.testing.assert_allclose(
    [resumed[s] for s in sorted(resumed)],
    [expected[s] for s in sorted(resumed)],
    rtol=1e-5,
  )


_TRAINER = """
import sys, time
from vidjax import config as config_lib, sharding
from vidjax.data import pipeline
from vidjax.data.synthetic import layouts
config = config_lib.load_config(sys.argv[1] + ":debug", ["--config.data.workers=1"])
layouts.use_corpus(config, sys.argv[2])
batches = pipeline.make_pipeline(config, sharding.make_mesh(), train=True,
                                 batch_size=8)
next(batches)
print("ready", flush=True)
time.sleep(600)
"""


def _start_trainer(tmp_path, tmp_path_factory, **popen) -> subprocess.Popen:
  """`_TRAINER` on the demo's synthetic corpus (it prints "ready" once its
  worker and blocks are up)."""
  config = debug_runs.load("demo")
  corpus = debug_runs.prepare(config, tmp_path, tmp_path_factory) / "synthetic"
  command = [
    sys.executable,
    "-c",
    _TRAINER,
    str(debug_runs.CONFIGS / "demo.py"),
  ]
  return subprocess.Popen(
    [*command, str(corpus)],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
    **popen,
  )


@pytest.mark.slow
def test_a_killed_trainer_takes_its_workers_and_blocks_with_it(
  tmp_path, tmp_path_factory
):
  """kill -9 of a trainer: its worker ends, and its /dev/shm blocks (named
  after its pid, so other runs' are not counted) are unlinked."""
  proc = _start_trainer(tmp_path, tmp_path_factory)
  try:
    assert proc.stdout.readline() == "ready\n"
    pids = workers_of(proc.pid)
    assert len(pids) == 1 and blocks_of(proc.pid)
    proc.kill()
    proc.wait()
    wait_for(
      lambda: not any(map(alive, pids)) and not blocks_of(proc.pid),
      "the workers and blocks to go",
    )
  finally:
    proc.kill()


def _mapped(*pids: int) -> set[str]:
  """The /dev/shm names these processes map, by inode: a semaphore is mapped
  under the temporary name glibc made it with, then linked to its own."""
  inodes = set()
  for pid in pids:
    with open(f"/proc/{pid}/maps") as f:
      inodes |= {tuple(line.split()[3:5]) for line in f}
  names = set()
  for name in os.listdir(workers.SHM_DIR):
    try:
      st = os.stat(os.path.join(workers.SHM_DIR, name))
    except OSError:
      continue
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    if (dev, str(st.st_ino)) in inodes:
      names.add(name)
  return names


def _semaphores(names: set[str]) -> set[str]:
  return {n for n in names if n.startswith("sem.mp-")}


@pytest.mark.slow
def test_a_process_group_killed_at_once_leaves_nothing_in_dev_shm(
  tmp_path, tmp_path_factory
):
  """SIGKILL to the trainer's whole process group at once (how SLURM
  cancels: its workers and Python's resource tracker die with it): the
  janitor unlinks its blocks and semaphores (this trainer's only: named
  after its pid, or mapped by it or its workers, whose semaphores most are)."""
  # Its own group, as a job step's.
  proc = _start_trainer(tmp_path, tmp_path_factory, start_new_session=True)
  try:
    assert proc.stdout.readline() == "ready\n"
    left = lambda: (
      {
        n
        for n in _mapped(proc.pid, *workers_of(proc.pid))
        if n.startswith(("sem.mp-", "psm_"))
      }
      | set(blocks_of(proc.pid))
    )

    def running():  # Its semaphores and blocks, once it has both.
      names = left()
      return names if _semaphores(names) and blocks_of(proc.pid) else None

    first = wait_for(running, "its semaphores and blocks")
    # The janitor notes a name at its next look (every WATCH_S): the names a
    # trainer makes after its last look before the kill are its blind spot.
    # Those it has had four looks at must go.
    time.sleep(4 * workers.WATCH_S)
    names = first & left()
    assert _semaphores(names) and blocks_of(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(
      lambda: (
        not any(os.path.exists(os.path.join(workers.SHM_DIR, n)) for n in names)
        and not blocks_of(proc.pid)
      ),
      "the janitor to unlink them",
    )
  finally:
    proc.kill()


def test_a_worker_killed_for_memory_is_said_so():
  """SIGKILL with new OOM kills in the memory cgroup is the OOM killer's."""
  assert "out of memory" in workers.describe_exit(-9, 1)
  assert "not by the kernel's OOM killer" in workers.describe_exit(-9, 0)
  assert "dmesg" in workers.describe_exit(-9, None)
  assert workers.describe_exit(-11, None) == "killed by SIGSEGV (signal 11)"
  assert workers.describe_exit(3, 0) == "it exited with code 3"
  assert workers.oom_kills() is None or workers.oom_kills() >= 0


def test_a_stopped_worker_and_its_read_are_named():
  """What the stall warning says of a worker stopped (SIGSTOP) in a read."""
  stopped = subprocess.Popen(["sleep", "60"])
  os.kill(stopped.pid, signal.SIGSTOP)
  pool = workers.Workers(1)
  try:
    wait_for(lambda: _stat(stopped.pid)[0] == "T", "SIGSTOP")
    status = workers.shared_memory.SharedMemory(  # As worker 0 makes it.
      f"{pool.prefix}w0", create=True, size=workers.STATUS_BYTES
    )
    workers.publish(
      status, stopped.pid, [("/store/v/15.mp4", time.time() - 75)]
    )
    status.close()
    assert re.fullmatch(
      rf"worker 0 of 1 \(pid {stopped.pid}, stopped: SIGCONT resumes it\), "
      r"reading /store/v/15.mp4 for 7[56] s",
      pool.describe(0),
    )
  finally:
    stopped.kill()
    pool.close()
  assert not blocks_of(os.getpid())
