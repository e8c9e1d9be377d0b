"""Test set-up: JAX on CPU with 8 fake devices, so sharding code is exercised.

The flag must be set before jax is imported anywhere, hence at the top of
conftest (pytest imports it before any test module).

Compiling dominates the suite's time. Many tests compile the same small
steps (the `:debug` recipes in-process, then again in the command-line
subprocesses they start): JAX's persistent compilation cache, in a
directory new to each test session and shared by the test processes
(pytest-xdist) and their subprocesses, compiles each of them once.
"""

import atexit
import gc
from importlib import metadata
import os
import shutil
import tempfile

# LLVM's optimisation level 0: tiny models compile ~30% faster, and run
# their few steps about as fast. Eigen on one thread, and each program's
# code generated as one piece, not split for threads (~10% less compile
# time): two test processes and their subprocesses already keep the cores
# busy.
_FLAGS = (
  "--xla_force_host_platform_device_count=8"
  " --xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
  " --xla_cpu_parallel_codegen_split_count=1"
)
# jaxlib 0.10 can still use XLA's older CPU emitters for fused operations,
# which compile the tests' small programs a third faster than the new
# ones. (0.11 has only the new ones: XLA refuses the flag there.)
if tuple(map(int, metadata.version("jaxlib").split(".")[:2])) < (0, 11):
  _FLAGS += " --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAGS}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="vidjax-tests-jax-cache-")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.environ.update(
    JAX_COMPILATION_CACHE_DIR=_cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
  )

import pytest  # noqa: E402

from vidjax.main import GC_THRESHOLDS  # noqa: E402  (no jax: light)

# The command line's collection thresholds, for the runs and traces made in
# the test processes too: at Python's defaults the collector took ~20% of
# their CPU.
gc.set_threshold(*GC_THRESHOLDS)


def _has_gpu() -> bool:
  import jax

  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def _has_gpu_compiler() -> bool:
  """Whether JAX's CUDA plugin is installed (`vidjax.compile`)."""
  from vidjax.compile import __main__ as command

  return command.plugin_installed()


def pytest_collection_modifyitems(config, items):
  """Runs the slow tests first; skips `gpu` tests unless JAX sees a GPU,
  `gpu_compile` tests without the [gpu-compile] extra.

  Order: the `:debug` runs' group, then the other groups (each a unit one
  process runs whole: shared runs or expensive fixtures) and the `slow`
  tests, then the rest. The two test processes take work in this order
  (pytest-xdist's `loadgroup`, `--no-loadscope-reorder`), so the long units
  start at once and the short tests fill the end, leaving neither process
  idle.

  The default platform here is CPU; run GPU tests with `JAX_PLATFORMS=cuda,cpu`.
  """

  def rank(item):
    group = item.get_closest_marker("xdist_group")
    if group and group.args == ("debug_runs",):
      return 0
    return 1 if group or item.get_closest_marker("slow") else 2

  items.sort(key=rank)  # Stable: collection order within a rank.

  for marker, available, reason in (
    (
      "gpu_compile",
      _has_gpu_compiler,
      'needs XLA\'s GPU compiler: pip install -e ".[gpu-compile]"',
    ),
    ("gpu", _has_gpu, "needs an NVIDIA GPU (run with JAX_PLATFORMS=cuda,cpu)"),
  ):
    marked = [item for item in items if marker in item.keywords]
    if marked and not available():
      for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish():
  """What the session made is left out of the collections at its end.

  pytest's unraisableexception plugin ends each test process with five
  `gc.collect()` passes over the whole heap, seconds each with JAX's
  caches of a whole session: frozen objects are not visited.
  """
  gc.freeze()


class SmallDisk:
  """A tmpfs of its own (32 MiB), to fill up: what a full disk does."""

  def __init__(self, path):
    self.path = path
    self._filler = path / "filler"

  def leave_free(self, nbytes: int) -> None:
    """Fills the disk until only `nbytes` are free."""
    stat = os.statvfs(self.path)
    with open(self._filler, "ab") as f:
      f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - nbytes))

  def free_up(self) -> None:
    self._filler.unlink()


@pytest.fixture
def small_disk(tmp_path):
  """A `SmallDisk` mounted for the test; skipped where mounting is refused."""
  import subprocess

  path = tmp_path / "disk"
  path.mkdir()
  mount = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(path)],
    capture_output=True,
    text=True,
  )
  if mount.returncode:
    pytest.skip(
      "a full disk is a tmpfs mounted by the test, which needs root "
      f"(mount said: {mount.stderr.strip() or mount.returncode})"
    )
  try:
    yield SmallDisk(path)
  finally:
    subprocess.run(
      ["umount", "--lazy", str(path)], check=False, capture_output=True
    )
