"""Pins of vidjax.base.internals: each private API and each library message it
reads, against the installed libraries. A JAX, Grain, Orbax, TensorStore,
absl, asyncio or torch release that moves one fails here, by name.

The messages are made by the libraries themselves where a test can make
them (TensorStore's, asyncio's, absl's, safetensors', Orbax's warnings,
torch's); Grain's worker death is read from Grain's own source.
"""

import asyncio
import importlib.util
import logging
from pathlib import Path
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidjax.base import internals


def test_saved_residuals_lists_what_the_backward_pass_keeps():
  residuals = internals.saved_residuals(
    lambda x: jnp.sin(x).sum(), jnp.ones((3, 4))
  )
  assert residuals and all(isinstance(where, str) for _, where in residuals)
  assert {aval.shape for aval, _ in residuals} == {(3, 4)}


def test_cudnn_checks_are_answered_and_restored():
  from jax._src.cudnn import fused_attention_stablehlo as fused

  before = {name: getattr(fused, name) for name in internals._CUDNN_CHECKS}
  assert all(map(callable, before.values()))
  assert internals.cudnn_version() is None  # No GPU here.
  with internals.cudnn_checks_answered((9, 0), 91000):
    assert internals.cudnn_version() == 91000
    assert fused.check_compute_capability("8.0")
    assert not fused.check_compute_capability("10.0")
    assert fused.is_cuda_compute_capability_equal("9.0")
  assert {n: getattr(fused, n) for n in before} == before


def test_cudnn_calls_are_counted_in_hlo_text():
  from jax._src import custom_partitioning

  assert callable(custom_partitioning._sharding_callbacks.get)
  text = 'custom_call_target="__cudnn$fmhaSoftmax" ... __cudnn$fmhaSoftmax'
  assert internals.cudnn_attention_calls(text) == {"__cudnn$fmhaSoftmax": 2}


def test_tracer_sharding_is_still_a_property_raising_attribute_error():
  from jax._src import core

  original = vars(core.Tracer)["sharding"]
  assert isinstance(original, property)
  seen = []

  def f(x):
    seen.append(getattr(x, "sharding", "absent"))
    with internals.tracer_sharding_without_explanation():
      with internals.tracer_sharding_without_explanation():  # Nested.
        seen.append(getattr(x, "sharding", "absent"))
        with pytest.raises(AttributeError, match="use `jax.typeof"):
          x.sharding  # noqa: B018  (Tracer.__getattr__'s short message)
        assert vars(core.Tracer)["sharding"] is not original
    return x

  jax.jit(f)(jnp.ones(2))
  assert seen == ["absent", "absent"]
  assert vars(core.Tracer)["sharding"] is original


def test_orbax_array_handler_keeps_its_metadata_store():
  import orbax.checkpoint as ocp

  handler = ocp.type_handlers.get_type_handler(jax.Array)
  assert internals.array_metadata_store(handler) is not None


def test_tensorstore_errors_carry_the_os_error_code(tmp_path):
  import tensorstore as ts

  (tmp_path / "file").write_text("not a directory")
  spec = {
    "driver": "zarr",
    "kvstore": {"driver": "file", "path": str(tmp_path / "file" / "x/")},
  }
  with pytest.raises(ValueError) as error:
    ts.open(spec, create=True, dtype=ts.uint8, shape=[2]).result()
  assert internals.os_error_code(error.value) == 20  # ENOTDIR
  assert internals.os_error_code(ValueError("no code")) is None


def test_grain_says_a_worker_died_with_its_exit_code():
  grain = Path(importlib.util.find_spec("grain").origin).parent
  sources = [
    p.read_text()
    for p in grain.rglob("*.py")
    if not p.name.endswith("_test.py")
  ]
  assert any("terminated unexpectedly with exit code " in s for s in sources)
  error = RuntimeError(
    "Worker process was terminated unexpectedly with exit code -9. Search "
    "the logs above for the source of the crash."
  )
  assert internals.grain_worker_exit_code(error) == -9
  assert internals.grain_worker_exit_code(RuntimeError("other")) is None


def test_asyncio_says_its_loop_is_closed():
  loop = asyncio.new_event_loop()
  loop.close()
  with pytest.raises(RuntimeError) as error:
    loop.call_soon(print)
  assert internals.is_closed_event_loop(error.value)
  assert not internals.is_closed_event_loop(RuntimeError("other"))
  assert not internals.is_closed_event_loop(None)


def test_absl_flag_errors_lose_their_prefix():
  from absl import flags

  values = flags.FlagValues()
  flags.DEFINE_integer("steps", 1, "", flag_values=values)
  with pytest.raises(flags.Error) as error:
    values(["prog", "--steps=many"])
  assert str(error.value).startswith("flag --steps=many: ")
  assert internals.absl_flag_error(error.value).startswith("--steps=many: ")


def test_safetensors_errors_give_their_reason(tmp_path):
  import safetensors
  import safetensors.numpy

  path = tmp_path / "cut.safetensors"
  safetensors.numpy.save_file({"a": np.ones(10, np.float32)}, path)
  path.write_bytes(path.read_bytes()[:40])
  with pytest.raises(safetensors.SafetensorError) as error:
    safetensors.safe_open(path, "numpy")
  assert internals.error_reason(error.value).startswith(
    "Error while deserializing header"
  )


def test_orbax_warns_of_read_only_directories(tmp_path):
  import orbax.checkpoint as ocp

  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger("absl")
  logger.addHandler(handler)
  try:
    ocp.CheckpointManager(
      tmp_path, options=ocp.CheckpointManagerOptions(read_only=True)
    ).close()
  finally:
    logger.removeHandler(handler)
  warnings = [r for r in records if r.levelno >= logging.WARNING]
  assert warnings and all(map(internals.is_orbax_read_only_warning, warnings))


def test_the_handler_of_logging_basic_config_is_recognised(monkeypatch):
  root = logging.getLogger()
  monkeypatch.setattr(root, "handlers", [])
  logging.basicConfig()
  (made,) = root.handlers
  assert internals.is_basic_config_handler(made)
  assert not internals.is_basic_config_handler(logging.StreamHandler())
  own = logging.StreamHandler()
  own.setFormatter(logging.Formatter("%(message)s"))
  assert not internals.is_basic_config_handler(own)


def test_tensorstore_says_not_found_for_files_gone(tmp_path):
  import tensorstore as ts

  spec = {
    "driver": "zarr3",
    "kvstore": {"driver": "file", "path": str(tmp_path)},
  }
  with pytest.raises(ValueError) as error:
    ts.open(spec, open=True).result()
  assert internals.is_not_found(error.value)
  assert not internals.is_not_found(ValueError("INVALID_ARGUMENT: no"))


def test_orbax_says_its_array_metadata_is_gone_so():
  """The message of Orbax's ValueError when a save's array metadata has
  gone before the save finished (a race, not made here: read in the
  installed Orbax's source)."""
  import inspect

  from orbax.checkpoint._src.handlers import base_pytree_checkpoint_handler

  source = inspect.getsource(base_pytree_checkpoint_handler)
  assert "f'No ArrayMetadata found for process_index={process_index}" in source
  error = ValueError(
    "No ArrayMetadata found for process_index=0 in the checkpoint "
    "directory: /run/checkpoints/1.orbax-checkpoint-tmp/state. But input "
    "PyTree contains at least one jax.Array param_info: ..."
  )
  assert internals.is_orbax_metadata_gone(error)
  assert not internals.is_orbax_metadata_gone(ValueError("No space left"))


def test_xla_out_of_memory_is_recognised():
  # XLA's status code for an allocation that does not fit (not made here:
  # a CPU does not run out).
  error = RuntimeError(
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0GiB."
  )
  assert internals.is_out_of_memory(error)
  assert not internals.is_out_of_memory(RuntimeError("INTERNAL: other"))


def test_default_triton_tiles_rejected_is_recognised():
  # XLA's GPU compiler without autotuning (a GPU target compiled on a CPU:
  # configs/demo.py's float32 step at jax 0.10.2).
  error = RuntimeError(
    "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.308 "
    "= f32[308,64]{1,0} dot(%bitcast.702, %parameter_1.17)"
  )
  assert internals.is_default_tiles_rejected(error)
  assert not internals.is_default_tiles_rejected(RuntimeError("INTERNAL"))


def test_flax_imports_ipython_and_the_command_start_does_not():
  """The reason for `import_flax_without_ipython` (Flax and treescope
  import IPython as they load), and what it does: flax loads without it,
  and IPython still imports afterwards."""
  pytest.importorskip("IPython")
  plain = "import sys, flax.nnx; print('IPython' in sys.modules)"
  quick = (
    "import sys; from vidjax.base import internals; "
    "internals.import_flax_without_ipython(); "
    "print('flax.nnx' in sys.modules, 'IPython' in sys.modules); "
    "import IPython; print(IPython.version_info >= (7,))"
  )
  outputs = [
    subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    for code in (plain, quick)
  ]
  assert outputs == [["True"], ["True", "False", "True"]], (
    "flax.nnx no longer imports IPython? Then drop the work-around"
  )


def test_grains_no_jax_warning_is_recognised_and_kept_from_workers():
  """Grain warns as it loads without jax (what every lean data worker
  does); the record is recognised, and a worker's start says nothing."""
  plain = (
    "import logging, sys; from vidjax.base import internals; records = []; "
    "handler = logging.Handler(); handler.emit = records.append; "
    "logging.getLogger('absl').addHandler(handler); "
    "sys.modules['jax'] = None; import grain; "
    "print(sum(map(internals.is_grain_no_jax_warning, records)))"
  )
  worker = "import vidjax.data.lean_worker, grain, grain.python"
  runs = [
    subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    for code in (plain, worker)
  ]
  assert runs[0].stdout.split() == ["1"], runs[0].stderr
  assert "jax" not in runs[1].stderr, runs[1].stderr


class Opaque:
  """A class a pickle can only build by running code."""


@pytest.mark.parity
def test_torch_names_the_global_it_refuses(tmp_path):
  torch = pytest.importorskip("torch")

  path = tmp_path / "state.pt"
  torch.save({"state": Opaque()}, path)
  with pytest.raises(pickle.UnpicklingError) as error:
    torch.load(path, weights_only=True)
  assert internals.refused_pickle_global(error.value).endswith(".Opaque")
  assert internals.refused_pickle_global(ValueError("damaged")) is None
