"""Every private API vidjax uses, every match on a library's message text,
and the one way around a library's import cost (`import_flax_without_ipython`).

No public API does what these do (each says why). They are here, and only
here (tests/test_layers.py checks that no other module imports `jax._src`,
`grain._src` or Orbax's or TensorStore's internals, reads a library's
private attribute, or parses a library's error message), and each is pinned
by tests/test_internals.py against the installed versions: a JAX, Grain,
Orbax, TensorStore or PyTorch release that moves one fails there, loudly,
not silently in a run.

Libraries are imported inside the functions: importing this module starts
no runtime.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import sys
import threading

# ------------------------------------------------------------------ JAX


def saved_residuals(fun, *args) -> list:
  """[(aval, where)] of what `jax.grad(fun)(*args)` keeps for its backward
  pass (`where` says what made it, e.g. 'from the argument ...').

  `jax.ad_checkpoint.print_saved_residuals` only prints this list.
  """
  from jax._src import ad_checkpoint

  return ad_checkpoint.saved_residuals(fun, *args)


def cudnn_version() -> int | None:
  """cuDNN's version as JAX reads it (e.g. 91000 for 9.10), or None.

  JAX's cuDNN attention asks the same function while tracing; no public
  API tells the version.
  """
  try:
    from jax._src.cudnn import fused_attention_stablehlo

    return int(fused_attention_stablehlo.check_cudnn_version())
  except (RuntimeError, ImportError, AttributeError):
    return None


# JAX's cuDNN attention asks these while tracing, of the (absent) GPU.
_CUDNN_CHECKS = (
  "check_cudnn_version",
  "check_compute_capability",
  "is_cuda_compute_capability_equal",
)


@contextlib.contextmanager
def cudnn_checks_answered(compute_capability: tuple[int, int], version: int):
  """Within the block, JAX's cuDNN attention traces as on a GPU of
  `compute_capability` with cuDNN `version` (e.g. (9, 0), 91000), on any
  machine: its version and capability checks answer so.

  JAX has no public way to trace its cuDNN path for a GPU it does not see
  (`lower(lowering_platforms=("cuda",))` lowers, but tracing asks the
  device first). Not thread-safe: the module's functions are replaced for
  the whole process while the block runs.
  """
  from jax._src.cudnn import fused_attention_stablehlo as fused

  target = ".".join(map(str, compute_capability))
  answers = dict(
    check_cudnn_version=lambda: version,
    check_compute_capability=lambda c: (
      tuple(map(int, c.split("."))) <= compute_capability
    ),
    is_cuda_compute_capability_equal=lambda c: c == target,
  )
  saved = {name: getattr(fused, name) for name in _CUDNN_CHECKS}
  try:
    for name, answer in answers.items():
      setattr(fused, name, answer)
    yield
  finally:
    for name, original in saved.items():
      setattr(fused, name, original)


def cudnn_attention_calls(hlo_text: str) -> collections.Counter:
  """cuDNN fused-attention calls in lowered or compiled HLO text, by name.

  On one device they are `__cudnn$fmha*` custom calls. On a mesh JAX wraps
  each in custom partitioning: the lowered HLO holds a
  `CustomSPMDPartitioning` call naming a callback, which XLA's partitioner
  replaces with the cuDNN call at compile time; those count under the name
  of the callback's partition function (`_dot_product_attention*`), which
  JAX keeps only in a private table while the lowering is alive.
  """
  from jax._src import custom_partitioning

  counts = collections.Counter(re.findall(r"__cudnn\$fmha\w*", hlo_text))
  for key in re.findall(
    r'@CustomSPMDPartitioning\(.*backend_config = "(\w+)"', hlo_text
  ):
    info = custom_partitioning._sharding_callbacks.get(key.encode())
    name = getattr(getattr(info, "partition", None), "__name__", "")
    if name.startswith("_dot_product_attention"):
      counts[name] += 1
  return counts


_tracer_lock = threading.Lock()
_tracer_users = 0
_tracer_saved = None


@contextlib.contextmanager
def tracer_sharding_without_explanation():
  """Within the block, asking a JAX tracer for `.sharding` raises its
  AttributeError without the explanation JAX builds by scanning every
  operation traced so far.

  Flax asks at each random draw while a model is built under `jax.jit` or
  `nnx.eval_shape`, and discards the answer (getattr's default): the scans
  make construction quadratic in the model's size (a ViT-B CLIP's abstract
  build: ~8 s instead of ~1 s on 2 cores). Nothing else changes: the same
  exception type, hasattr and getattr as before. Nestable and
  thread-safe; where JAX no longer defines the attribute this way, nothing
  is done.
  """
  global _tracer_users, _tracer_saved
  from jax._src import core

  with _tracer_lock:
    _tracer_users += 1
    if _tracer_users == 1:
      original = vars(core.Tracer).get("sharding")
      if isinstance(original, property):
        _tracer_saved = original
        core.Tracer.sharding = property(_no_sharding)
  try:
    yield
  finally:
    with _tracer_lock:
      _tracer_users -= 1
      if _tracer_users == 0 and _tracer_saved is not None:
        core.Tracer.sharding = _tracer_saved
        _tracer_saved = None


def _no_sharding(tracer):
  # Python then asks `Tracer.__getattr__`, whose message is short.
  raise AttributeError("sharding")


# ----------------------------------------------------------------- Flax


def import_flax_without_ipython() -> None:
  """Imports `flax.nnx`; outside IPython, without importing IPython.

  Where IPython is installed (wherever Jupyter is), `flax.nnx` and
  treescope import it as they load, only to ask whether the process runs
  under IPython: about 0.6 CPU-second of every command's start. Outside
  IPython the answer is no either way. Inside it (a notebook) IPython is
  already imported, and flax loads as usual. Meant for a command's start,
  before anything else imports flax; afterwards IPython imports as usual.
  """
  if "flax.nnx" in sys.modules or "IPython" in sys.modules:
    import flax.nnx  # noqa: F401

    return
  sys.modules["IPython"] = None  # `import IPython` raises ImportError.
  try:
    import flax.nnx  # noqa: F401, F811
  finally:
    if "IPython" in sys.modules and sys.modules["IPython"] is None:
      del sys.modules["IPython"]


# ---------------------------------------------------------------- Orbax


def array_metadata_store(handler):
  """The array metadata store of Orbax's default jax.Array handler (or
  None), to give an `ArrayHandler` of our own the same one: Orbax takes
  it as a constructor argument but only keeps it privately."""
  return getattr(handler, "_array_metadata_store", None)


# -------------------------------------------------------------- logging


def is_basic_config_handler(handler) -> bool:
  """Whether `handler` is the one `logging.basicConfig()` adds to the root
  logger: absl calls it when a library logs before any set-up (Orbax does
  at import). Only its format tells it (a private attribute) from a
  handler someone else added."""
  return (
    type(handler) is logging.StreamHandler
    and handler.formatter is not None
    and handler.formatter._fmt == logging.BASIC_FORMAT
  )


# ------------------------------------------------- libraries' messages

# TensorStore's errors name the system's error code only in their text.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
# Grain's error when one of its worker processes dies.
_GRAIN_WORKER_DIED = re.compile(
  r"terminated unexpectedly with exit code (-?\d+)"
)
# torch's refusal of a pickle global under weights_only=True.
_PICKLE_GLOBAL = re.compile(r"GLOBAL (\S+)")


def os_error_code(error: BaseException) -> int | None:
  """The errno a TensorStore error (raised through Orbax) carries in its
  message, e.g. 28 (ENOSPC), or None."""
  match = _OS_ERROR_CODE.search(str(error))
  return int(match.group(1)) if match else None


def grain_worker_exit_code(error: BaseException) -> int | None:
  """The exit code of the worker process Grain's `error` says died (-9:
  killed by SIGKILL), or None if it says no worker died."""
  match = _GRAIN_WORKER_DIED.search(str(error))
  return int(match.group(1)) if match else None


def refused_pickle_global(error: BaseException) -> str | None:
  """The global (`module.name`) torch's weights_only unpickler refused, or
  None when the error names none (a damaged pickle)."""
  match = _PICKLE_GLOBAL.search(str(error))
  return match.group(1) if match else None


def is_closed_event_loop(error: BaseException | None) -> bool:
  """Whether `error` is asyncio's 'Event loop is closed' RuntimeError
  (TensorStore's writes still in flight after Orbax closed its loop)."""
  return isinstance(error, RuntimeError) and str(error) == (
    "Event loop is closed"
  )


def error_reason(error: BaseException) -> str:
  """The sentence of a library's (often long) error that says what is
  wrong: its last line (safetensors', torch's and zipfile's put it there),
  up to the first full stop; 'Check the documentation ...' lines skipped."""
  lines = [
    line.strip()
    for line in str(error).splitlines()
    if line.strip() and not line.startswith("Check the documentation")
  ]
  return lines[-1].split(". ")[0] if lines else type(error).__name__


# Warnings Orbax gives for every read-only look at a checkpoint directory,
# which vidjax makes on purpose (to find or check a checkpoint).
_ORBAX_READ_ONLY_WARNINGS = (
  "CheckpointManagerOptions.read_only=True",
  "Given directory is read only",
)


def is_orbax_read_only_warning(record) -> bool:
  """Whether a log record is Orbax's warning that a checkpoint directory is
  opened read-only."""
  return str(record.msg).startswith(_ORBAX_READ_ONLY_WARNINGS)


def is_orbax_item_metadata_warning(record) -> bool:
  """Whether a log record is Orbax's "Metadata file does not exist:
  STEP/state/_CHECKPOINT_METADATA", which reading one item of a step gives
  every time (the step's metadata is one level up, where Orbax wrote it)."""
  return str(record.msg).startswith("Metadata file does not exist")


# Grain's warning, as it loads, that it found no jax (its profiler hooks):
# a lean data worker keeps jax out on purpose (vidjax.data.lean_worker).
_GRAIN_NO_JAX_WARNING = "Failed to load jax profiler: "


def is_grain_no_jax_warning(record) -> bool:
  """Whether a log record is Grain's warning that it cannot load jax's
  profiler (said once by each data worker, which runs without jax)."""
  return str(record.msg).startswith(_GRAIN_NO_JAX_WARNING)


def is_not_found(error: BaseException) -> bool:
  """Whether TensorStore's `error` says files it wrote are gone (NOT_FOUND:
  the directory of a save deleted under it)."""
  return str(error).startswith("NOT_FOUND:")


# Orbax's error when the array metadata its save wrote is gone as it reads
# it back to finish the save (`base_pytree_checkpoint_handler`).
_ORBAX_NO_ARRAY_METADATA = "No ArrayMetadata found for process_index="


def is_orbax_metadata_gone(error: BaseException) -> bool:
  """Whether Orbax's `error` says the array metadata its save wrote has
  gone before the save finished (the directory of the save deleted)."""
  return str(error).startswith(_ORBAX_NO_ARRAY_METADATA)


def is_out_of_memory(error: BaseException) -> bool:
  """Whether XLA's `error` says the device ran out of memory."""
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def is_default_tiles_rejected(error: BaseException) -> bool:
  """Whether XLA's GPU compiler says its default Triton tiles fit no GEMM
  of a shape (compiling without a GPU: nothing autotunes;
  `vidjax.compile`)."""
  return "Couldn't find output tile sizes" in str(error)


def unknown_compile_option(error: BaseException) -> str | None:
  """The compile option XLA says it does not know (a flag a newer XLA
  dropped; `vidjax.compile`), or None."""
  found = re.search(r"No such compile option: '(\w+)'", str(error))
  return found.group(1) if found else None


def absl_flag_error(error: BaseException) -> str:
  """An absl flag parsing error without absl's 'flag ' prefix."""
  return str(error).removeprefix("flag ")
