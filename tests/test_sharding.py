"""Tests for vidjax.sharding on 8 fake CPU devices."""

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from vidjax import sharding


def _batches(n, b=8):
  rng = np.random.default_rng(0)
  return [
    {
      "video": rng.integers(0, 256, (b, 2, 4, 4, 3), dtype=np.uint8),
      "label": np.arange(i * b, (i + 1) * b, dtype=np.int32),
    }
    for i in range(n)
  ]


def test_make_mesh_shapes_and_errors():
  mesh = sharding.make_mesh(fsdp=2)
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
  assert dict(sharding.make_mesh().shape) == {"data": 8, "fsdp": 1}
  with pytest.raises(ValueError, match="fsdp=3"):
    sharding.make_mesh(fsdp=3)
  with pytest.raises(ValueError, match="data=2"):
    sharding.make_mesh(data=2, fsdp=2)


def test_fsdp_spec_picks_largest_divisible_dim():
  assert sharding.fsdp_spec((1024, 768), 4, min_size=1) == P("fsdp", None)
  assert sharding.fsdp_spec((3, 1026, 768), 4, min_size=1) == P(
    None, None, "fsdp"
  )
  assert sharding.fsdp_spec((3, 5), 4, min_size=1) == P()
  assert sharding.fsdp_spec((1024, 768), 4, min_size=10**7) == P()
  assert sharding.fsdp_spec((1024, 768), 1, min_size=1) == P()


def test_batch_is_sharded_on_batch_axis_and_stays_uint8():
  mesh = sharding.make_mesh(fsdp=2)
  local = _batches(1)[0]
  batch = sharding.host_to_global_batch(local, mesh)
  video = batch["video"]
  assert video.dtype == jnp.uint8 and video.shape == local["video"].shape
  assert video.sharding.spec == P(("data", "fsdp"))
  assert {s.data.shape[0] for s in video.addressable_shards} == {1}
  np.testing.assert_array_equal(np.asarray(video), local["video"])
  np.testing.assert_array_equal(np.asarray(batch["label"]), local["label"])
  with pytest.raises(ValueError, match=r"batch\['label'\].*divisible by the 8"):
    sharding.host_to_global_batch({"label": np.zeros(6, np.int32)}, mesh)


def test_state_created_sharded_and_donated_step():
  mesh = sharding.make_mesh(fsdp=4)

  def init(key):
    model = nnx.Linear(64, 32, rngs=nnx.Rngs(params=key))
    return nnx.split(model)

  (graphdef, state), shardings = sharding.create_sharded_state(
    init, mesh, jax.random.key(0), min_size=64 * 32
  )
  kernel, bias = state["kernel"][...], state["bias"][...]
  assert kernel.sharding.spec == P("fsdp", None)
  assert {s.data.shape for s in kernel.addressable_shards} == {(16, 32)}
  assert bias.sharding.spec == P()  # below min_size: replicated
  abstract = sharding.abstract_sharded_state(
    init, mesh, jax.random.key(0), min_size=64 * 32
  )[1]
  assert abstract["kernel"].get_value().sharding == kernel.sharding
  assert isinstance(abstract["kernel"].get_value(), jax.ShapeDtypeStruct)

  batch = sharding.host_to_global_batch(
    {"x": np.ones((16, 64), np.float32)}, mesh
  )

  def step(state, batch):
    def loss_fn(state):
      model = nnx.merge(graphdef, state)
      return jnp.mean(model(batch["x"]) ** 2)

    grads = jax.grad(loss_fn)(state)
    return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)

  step = jax.jit(step, donate_argnums=0, out_shardings=shardings[1])
  new_state = step(state, batch)
  new_state = step(new_state, batch)
  assert kernel.is_deleted()  # donated: the old buffer was reused
  assert new_state["kernel"][...].sharding.spec == P("fsdp", None)
  assert np.isfinite(np.asarray(new_state["kernel"][...])).all()
