"""Device mesh, shardings and global batch assembly.

One mesh with two axes covers every run:

* `data`: pure data parallelism; parameters are replicated along it.
* `fsdp`: the batch is split along it too, and large parameters (and their
  optimizer state) are split along their largest divisible dimension, so a
  model too big to replicate still fits (ZeRO-3 / FSDP).

The batch's leading axis is split over both axes, so every device sees
`global_batch / num_devices` examples. Code is written on global arrays
and XLA inserts the collectives (no `pmap`, no `shard_map`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)
# Arrays smaller than this stay replicated under FSDP: splitting biases and
# norms saves no memory worth the extra all-gathers.
DEFAULT_FSDP_MIN_SIZE = 2**18


def make_mesh(data: int = -1, fsdp: int = 1, *, devices=None) -> Mesh:
  """Builds the ('data', 'fsdp') mesh over all devices (of all processes).

  Args:
    data: size of the data-parallel axis; -1 takes what `fsdp` leaves.
    fsdp: size of the FSDP axis (1 = pure data parallelism).
    devices: defaults to `jax.devices()`.

  Returns:
    A `Mesh` whose axes are 'Auto' (classic sharding propagation), which
    `jax.make_mesh` no longer gives by default.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if fsdp < 1 or n % fsdp:
    raise ValueError(f"mesh: fsdp={fsdp} must divide the {n} devices")
  if data == -1:
    data = n // fsdp
  if data * fsdp != n:
    raise ValueError(
      f"mesh: data={data} x fsdp={fsdp} must equal the {n} devices; "
      "set data=-1 to use all of them"
    )
  auto = (jax.sharding.AxisType.Auto,) * 2
  return jax.make_mesh(
    (data, fsdp), BATCH_AXES, axis_types=auto, devices=devices
  )


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over ('data', 'fsdp'), the rest whole."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  """A full copy on every device."""
  return NamedSharding(mesh, P())


def fsdp_spec(
  shape: tuple[int, ...], fsdp_size: int, min_size: int = DEFAULT_FSDP_MIN_SIZE
) -> P:
  """Splits the largest dimension divisible by `fsdp_size`, else replicates.

  Args:
    shape: the array's shape.
    fsdp_size: size of the mesh's 'fsdp' axis.
    min_size: arrays with fewer elements stay replicated.

  Returns:
    A `PartitionSpec` naming 'fsdp' on at most one dimension.
  """
  if fsdp_size <= 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
    return P()
  # Largest first; ties go to the earliest dimension.
  for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
    if shape[dim] % fsdp_size == 0:
      spec = [None] * len(shape)
      spec[dim] = FSDP_AXIS
      return P(*spec)
  return P()


def param_shardings(
  tree: Any, mesh: Mesh, *, min_size: int = DEFAULT_FSDP_MIN_SIZE
) -> Any:
  """Shardings for a pytree of (abstract) arrays: replicated or FSDP.

  Args:
    tree: pytree whose leaves have `.shape` (arrays or ShapeDtypeStructs),
      e.g. an `nnx.State`, an optax state or the `jax.eval_shape` of an init.
    mesh: from `make_mesh`; with fsdp == 1 everything is replicated.
    min_size: leaves with fewer elements stay replicated.

  Returns:
    A pytree of `NamedSharding` with the structure of `tree`.
  """
  fsdp_size = mesh.shape[FSDP_AXIS]
  return jax.tree.map(
    lambda x: NamedSharding(mesh, fsdp_spec(x.shape, fsdp_size, min_size)), tree
  )


def abstract_sharded_state(
  init_fn: Callable[..., Any],
  mesh: Mesh,
  *args,
  min_size: int = DEFAULT_FSDP_MIN_SIZE,
) -> Any:
  """Shapes, dtypes and shardings of `init_fn(*args)`, computing nothing.

  The restore target for a checkpoint: restoring into it skips the init.

  Returns:
    A pytree of `jax.ShapeDtypeStruct` whose `.sharding` is set (see
    `param_shardings`).
  """
  abstract = jax.eval_shape(init_fn, *args)
  return with_shardings(
    abstract, param_shardings(abstract, mesh, min_size=min_size)
  )


def with_shardings(shapes: Any, shardings: Any) -> Any:
  """`jax.ShapeDtypeStruct`s of `shapes` (arrays or structs) placed on
  `shardings` (a pytree of the same structure)."""
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
    shapes,
    shardings,
  )


def create_sharded_state(
  init_fn: Callable[..., Any],
  mesh: Mesh,
  *args,
  min_size: int = DEFAULT_FSDP_MIN_SIZE,
  shardings: Any = None,
) -> tuple[Any, Any]:
  """Runs `init_fn(*args)` so its outputs are born sharded (MaxText style).

  The output is traced once with `jax.eval_shape` to decide each leaf's
  sharding (unless `shardings` are given), then the init is jitted with
  those `out_shardings`: no device ever holds a full copy of a parameter
  that is meant to be split.

  Args:
    init_fn: pure function returning a pytree of arrays (e.g. the state half
      of `nnx.split(model)`, or (params, opt_state)). Static pytree nodes
      such as an nnx `GraphDef` pass through.
    mesh: from `make_mesh`.
    *args: passed to `init_fn` (e.g. a PRNG key).
    min_size: see `param_shardings`.
    shardings: the output's shardings (same structure), if already known:
      the init is then traced only once, by `jax.jit`.

  Returns:
    (state, shardings): the sharded output and its pytree of shardings, to
    reuse as the train step's in/out shardings.
  """
  if shardings is None:
    abstract = abstract_sharded_state(init_fn, mesh, *args, min_size=min_size)
    shardings = jax.tree.map(lambda x: x.sharding, abstract)
  state = jax.jit(init_fn, out_shardings=shardings)(*args)
  return state, shardings


def host_to_global_batch(
  local_batch: Mapping[str, np.ndarray], mesh: Mesh
) -> dict[str, jax.Array]:
  """Assembles global arrays from this process's slice of the batch.

  Each process passes its own `global_batch / process_count` examples; the
  result is one `jax.Array` per key, split over the batch axes. Dtypes are
  kept (uint8 frames stay uint8 on the wire).

  Args:
    local_batch: dict of arrays with a leading batch axis, e.g. 'video'
      uint8[b, T, H, W, 3], 'tokens' int32[b, 77], 'label' int32[b].
    mesh: from `make_mesh`.

  Returns:
    dict of `jax.Array` with leading axis `b * jax.process_count()`.
  """
  sharding = batch_sharding(mesh)
  num_local = len(mesh.local_devices)
  out = {}
  for key, value in local_batch.items():
    value = np.asarray(value)
    if value.ndim == 0 or value.shape[0] % num_local:
      raise ValueError(
        f"batch['{key}'] has shape {value.shape}: its leading (batch) axis "
        f"must be divisible by the {num_local} local devices; change the "
        "batch size or the number of devices"
      )
    out[key] = jax.make_array_from_process_local_data(sharding, value)
  return out
