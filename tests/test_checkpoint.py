"""Tests for vidjax.checkpoints.checkpoint: Orbax round trips, keep-last-K, resume order."""

import json
import os
import shutil
import subprocess
import sys

from flax import nnx
import grain
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from vidjax import sharding
from vidjax.base import errors, rundir
from vidjax.checkpoints import checkpoint, checkpoint_reader, checksums, resume


def _state(mesh, scale=1.0):
  fsdp = NamedSharding(mesh, P("fsdp", None))
  return {
    "params": {
      "w": jax.device_put(jnp.arange(64.0).reshape(16, 4) * scale, fsdp),
      "b": jax.device_put(jnp.ones(4) * scale, sharding.replicated(mesh)),
    },
    "opt": {"count": jnp.int32(7)},
  }


def _config(**kw):
  return ml_collections.ConfigDict({"resume": "", "init_from": "", **kw})


def _grain_iter():
  return iter(
    grain.MapDataset.range(40).shuffle(seed=5).batch(4).to_iter_dataset()
  )


def test_round_trip_sharded_state_iterator_step_rng(tmp_path):
  mesh = sharding.make_mesh(fsdp=2)
  state = _state(mesh)
  it = _grain_iter()
  for _ in range(3):
    next(it)
  data_state = it.get_state()
  expected_next = next(it)
  rng = jax.random.key(42)

  with checkpoint.Checkpointer(
    tmp_path, every_steps=10, metadata={"config": {"seed": 1}}
  ) as ckpt:
    assert not ckpt.save(
      5, state, data_state=data_state, rng=rng
    )  # off schedule
    assert ckpt.save(10, state, data_state=data_state, rng=rng)

  # Restore onto a different sharding: arrays land where the target says.
  other = sharding.make_mesh(fsdp=4)
  target = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=sharding.replicated(other)
    ),
    state,
  )
  target["params"]["w"] = jax.ShapeDtypeStruct(
    (16, 4), jnp.float32, sharding=NamedSharding(other, P("fsdp", None))
  )
  restored = checkpoint_reader.restore_checkpoint(tmp_path, target)
  assert restored.step == 10
  w = restored.state["params"]["w"]
  assert (
    w.sharding.spec == P("fsdp", None) and w.sharding.mesh.shape["fsdp"] == 4
  )
  jax.tree.map(np.testing.assert_array_equal, restored.state, state)
  assert restored.metadata == {"config": {"seed": 1}}
  assert (
    jax.random.key_data(restored.rng).tolist()
    == jax.random.key_data(rng).tolist()
  )

  resumed = _grain_iter()
  resumed.set_state(restored.data_state)
  np.testing.assert_array_equal(next(resumed), expected_next)


def test_restores_nnx_and_optax_state_into_abstract_target(tmp_path):
  mesh = sharding.make_mesh(fsdp=2)

  def init(key):
    params = nnx.state(nnx.Linear(64, 32, rngs=nnx.Rngs(params=key)), nnx.Param)
    return params, optax.adamw(1e-3).init(params)

  key = jax.random.key(0)
  state, _ = sharding.create_sharded_state(init, mesh, key, min_size=1)
  with checkpoint.Checkpointer(tmp_path, every_steps=1) as ckpt:
    ckpt.save(1, state)
  target = sharding.abstract_sharded_state(init, mesh, key, min_size=1)
  restored = checkpoint_reader.restore_checkpoint(tmp_path, target).state
  assert restored[0]["kernel"][...].sharding.spec == P("fsdp", None)
  jax.tree.map(np.testing.assert_array_equal, restored, state)


def test_keeps_last_k_and_restores_latest(tmp_path):
  mesh = sharding.make_mesh()
  with checkpoint.Checkpointer(tmp_path, every_steps=2, keep=2) as ckpt:
    for step in range(1, 9):
      ckpt.save(step, _state(mesh, scale=step))
    assert ckpt.save(9, _state(mesh, scale=9), force=True)
    assert not ckpt.save(9, _state(mesh, scale=9), force=True)  # already there
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [8, 9]
    restored = checkpoint_reader.restore_checkpoint(tmp_path, _state(mesh))
  assert (
    restored.step == 9 and restored.data_state is None and restored.rng is None
  )
  np.testing.assert_array_equal(restored.state["params"]["b"], np.full(4, 9.0))


def test_half_written_checkpoint_is_ignored(tmp_path):
  mesh = sharding.make_mesh()
  ckpt_dir = str(rundir.checkpoints(tmp_path))
  with checkpoint.Checkpointer(ckpt_dir, every_steps=1) as ckpt:
    ckpt.save(3, _state(mesh))
  # A crash mid-save leaves Orbax's temporary directory behind.
  os.makedirs(os.path.join(ckpt_dir, "4.orbax-checkpoint-tmp-1234", "state"))
  assert checkpoint_reader.latest_complete_step(ckpt_dir) == 3
  assert resume.resolve_start(tmp_path, _config()) == resume.StartPoint(
    "workdir", ckpt_dir, 3
  )
  assert checkpoint_reader.restore_checkpoint(ckpt_dir, _state(mesh)).step == 3


def test_resolve_start_order(tmp_path):
  mesh = sharding.make_mesh()
  run_a, run_b = tmp_path / "a", tmp_path / "b"
  weights = tmp_path / "clip.npz"
  weights.write_bytes(b"x")

  assert resume.resolve_start(run_b, _config()).kind == "scratch"
  assert resume.resolve_start(run_b, _config(init_from=str(weights))) == (
    resume.StartPoint("init_from", str(weights))
  )

  with checkpoint.Checkpointer(
    str(rundir.checkpoints(run_a)), every_steps=5
  ) as ckpt:
    ckpt.save(5, _state(mesh))
  a_dir = str(rundir.checkpoints(run_a))
  for spec in (run_a, a_dir):  # a workdir or its checkpoints dir
    start = resume.resolve_start(
      run_b, _config(resume=str(spec), init_from=str(weights))
    )
    assert start == resume.StartPoint("resume", a_dir, 5)
  start = resume.resolve_start(run_b, _config(resume=os.path.join(a_dir, "5")))
  assert start == resume.StartPoint("resume", a_dir, 5)

  # Once run b has its own checkpoint, it wins over resume.
  with checkpoint.Checkpointer(
    str(rundir.checkpoints(run_b)), every_steps=5
  ) as ckpt:
    ckpt.save(10, _state(mesh))
  start = resume.resolve_start(run_b, _config(resume=str(run_a)))
  assert start == resume.StartPoint(
    "workdir", str(rundir.checkpoints(run_b)), 10
  )

  with pytest.raises(FileNotFoundError, match="config.resume"):
    resume.resolve_start(tmp_path / "c", _config(resume=str(tmp_path / "nope")))
  with pytest.raises(FileNotFoundError, match="config.init_from"):
    resume.resolve_start(
      tmp_path / "c", _config(init_from=str(tmp_path / "nope"))
    )


def test_from_config_reads_checkpoint_keys(tmp_path):
  config = ml_collections.ConfigDict(
    {
      "checkpoint": {
        "every_steps": 7,
        "keep": 1,
        "async_save": False,
        "best_metric": "eval/loss",
        "best_mode": "min",
      }
    }
  )
  with checkpoint.Checkpointer.from_config(tmp_path, config) as ckpt:
    assert (
      ckpt.every_steps == 7 and ckpt.should_save(14) and not ckpt.should_save(0)
    )
    assert (ckpt.best_metric, ckpt.best_mode) == ("eval/loss", "min")
    assert str(ckpt.directory) == str(rundir.checkpoints(tmp_path))


def test_best_checkpoint_outlives_keep_and_is_what_a_workdir_names(tmp_path):
  mesh = sharding.make_mesh()
  directory = str(rundir.checkpoints(tmp_path))
  scores = {2: 0.1, 4: 0.5, 6: 0.3, 8: 0.2, 10: 0.4, 12: 0.5}  # 12: a tie
  with checkpoint.Checkpointer(
    directory, every_steps=2, keep=2, best_metric="eval/mAP_avg"
  ) as ckpt:
    for step in range(1, 13):
      ckpt.save(step, _state(mesh, scale=step))
      if step in scores:
        ckpt.record_eval(
          step,
          {"eval/mAP_avg": scores[step], "eval/top1": 0.9},
          _state(mesh, scale=step),
        )
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [4, 10, 12]  # The last 2, and the best.
  best = {"metric": "eval/mAP_avg", "mode": "max", "step": 4, "value": 0.5}
  assert checkpoint_reader.read_best(directory) == best
  assert resume.find_checkpoint(tmp_path, prefer_best=True) == (directory, 4)
  assert resume.find_checkpoint(tmp_path) == (directory, 12)

  # A resumed run keeps the record; a better step off the schedule is saved.
  with checkpoint.Checkpointer(
    directory, every_steps=100, keep=2, best_metric="eval/mAP_avg"
  ) as ckpt:
    assert ckpt.best == best
    assert not ckpt.record_eval(13, {"eval/mAP_avg": 0.45}, _state(mesh))
    assert ckpt.record_eval(15, {"eval/mAP_avg": 0.6}, _state(mesh, scale=15))
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [12, 15]  # The old best is let go.
  restored = checkpoint_reader.restore_checkpoint(
    directory, _state(mesh), step=15
  )
  np.testing.assert_array_equal(restored.state["params"]["b"], np.full(4, 15.0))
  assert checkpoint_reader.read_best(directory)["step"] == 15


def test_best_mode_min_nan_and_a_metric_the_eval_lacks(tmp_path):
  mesh = sharding.make_mesh()
  state = _state(mesh)
  with checkpoint.Checkpointer(
    tmp_path, every_steps=1, keep=1, best_metric="eval/loss", best_mode="min"
  ) as ckpt:
    assert not ckpt.record_eval(1, {"eval/loss": float("nan")}, state)
    assert ckpt.record_eval(2, {"eval/loss": 2.0}, state)
    assert not ckpt.record_eval(3, {"eval/loss": 3.0}, state)
    assert ckpt.record_eval(4, {"eval/loss": 1.0}, state)
    assert not ckpt.record_eval(5, {"eval/top1": 1.0}, state)  # Warns once.
    assert ckpt.best["step"] == 4
  with pytest.raises(
    ValueError, match=r"best_mode must be one of \('max', 'min'\)"
  ):
    checkpoint.Checkpointer(tmp_path, every_steps=1, best_mode="best")


def test_partial_save_is_ignored_then_removed(tmp_path):
  mesh = sharding.make_mesh()
  with checkpoint.Checkpointer(
    str(rundir.checkpoints(tmp_path)), every_steps=1
  ) as ckpt:
    ckpt.save(1, _state(mesh))
  ckpts = tmp_path / "checkpoints"
  # What a save killed half-way leaves: Orbax's temporary directory.
  partial = ckpts / f"2{checkpoint.TMP_SUFFIX}"
  shutil.copytree(ckpts / "1", partial)
  assert checkpoint_reader.latest_complete_step(ckpts) == 1
  with checkpoint.Checkpointer(ckpts, every_steps=1) as ckpt:  # Orbax's
    ckpt.save(3, _state(mesh))  # clean-up ends before the first save.
  assert sorted(p.name for p in ckpts.iterdir()) == ["1", "3"]


def _replicated(mesh, shapes: dict) -> dict:
  """Arrays of `shapes` ({name: (shape, dtype)}) on every device of `mesh`."""
  rep = sharding.replicated(mesh)
  return {
    name: jax.device_put(
      jnp.arange(np.prod(shape)).reshape(shape).astype(dtype), rep
    )
    for name, (shape, dtype) in shapes.items()
  }


def test_save_of_replicated_arrays_compiles_nothing(tmp_path):
  # An axis divisible by the 8 replicas: Orbax's default save would cut each
  # replica's slice on its device, compiling a jitted slice per shape and device.
  state = _replicated(
    sharding.make_mesh(),
    {
      "w": ((24, 3), jnp.float32),
      "b": ((8,), jnp.int32),
      "e": ((5, 16), jnp.bfloat16),
    },
  )
  jax.block_until_ready(state)
  compiled = []

  def on_event(event, duration, **kwargs):
    del duration
    if event.startswith("/jax/core/compile/"):  # Trace, lower or compile.
      compiled.append(kwargs.get("fun_name", event))

  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    with checkpoint.Checkpointer(tmp_path, every_steps=1) as ckpt:
      assert ckpt.save(1, state)
      ckpt.wait_until_finished()
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  assert compiled == []
  restored = checkpoint_reader.restore_checkpoint(tmp_path, state).state
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  assert restored["w"].sharding == state["w"].sharding


def test_checkpoints_written_by_orbax_standard_handler_still_read(
  tmp_path, caplog
):
  """What earlier versions wrote (Orbax's StandardCheckpointHandler, replicas
  saving slices, no checksums) restores, and `read_params` reads it and
  today's alike."""
  mesh = sharding.make_mesh()
  state = {
    "params": _replicated(
      mesh, {"w": ((16, 2), jnp.float32), "b": ((3,), jnp.float32)}
    ),
    "opt": {"count": jnp.int32(7)},
  }
  meta = {"step": 3, "metadata": {"config": {"seed": 1}}}
  old, new = tmp_path / "old", tmp_path / "new"
  with ocp.CheckpointManager(
    old,
    item_handlers={
      "state": ocp.StandardCheckpointHandler(),
      "meta": ocp.JsonCheckpointHandler(),
    },
  ) as mngr:
    mngr.save(
      3,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
      ),
    )
  with checkpoint.Checkpointer(
    new, every_steps=1, metadata=meta["metadata"]
  ) as ckpt:
    ckpt.save(3, state)
  caplog.set_level("INFO")
  assert resume.find_checkpoint(old) == (str(old), 3)
  assert (
    f"{old}/3 has no checksums.json (saved before vidjax kept checksums):"
    " used without verifying its files"
  ) in caplog.text
  for directory in (old, new):
    restored = checkpoint_reader.restore_checkpoint(directory, state)
    assert restored.step == 3 and restored.metadata == meta["metadata"]
    jax.tree.map(np.testing.assert_array_equal, restored.state, state)
    params, config = checkpoint_reader.read_params(directory, 3)
    assert sorted(params) == ["b", "w"] and config == {"seed": 1}
    np.testing.assert_array_equal(params["w"], state["params"]["w"])


# ---------------------------------------------------------------------------
# Damaged checkpoints, and saves that fail.
# ---------------------------------------------------------------------------
def _largest_file(directory):
  return max(
    (p for p in directory.rglob("*") if p.is_file()),
    key=lambda p: p.stat().st_size,
  )


def _flip_a_byte(step_dir):
  path = _largest_file(step_dir / "state")
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))
  return f"{path.relative_to(step_dir)} has changed since it was saved"


def _truncate(step_dir):
  path = _largest_file(step_dir / "state")
  size = path.stat().st_size
  os.truncate(path, size // 2)
  return (
    f"{path.relative_to(step_dir)} has {size // 2} bytes, {size} when "
    "saved (truncated)"
  )


def _delete_metadata(step_dir):
  (step_dir / "state" / "_METADATA").unlink()
  return "state/_METADATA is missing"


def test_a_damaged_checkpoint_is_named_and_the_newest_intact_one_restored(
  tmp_path, caplog
):
  mesh = sharding.make_mesh(fsdp=2)
  saved = tmp_path / "saved"
  with checkpoint.Checkpointer(
    str(rundir.checkpoints(saved)), every_steps=1
  ) as ckpt:
    for step in (1, 2):
      ckpt.save(step, _state(mesh, scale=step), data_state={"seen": step})
  assert checksums.verify(saved / "checkpoints" / "2") is None
  for damage in (_flip_a_byte, _truncate, _delete_metadata):
    run = tmp_path / damage.__name__
    shutil.copytree(saved, run)
    ckpts = run / "checkpoints"
    caplog.clear()
    problem = damage(ckpts / "2")
    start = resume.resolve_start(run, _config())
    assert start == resume.StartPoint("workdir", str(ckpts), 1, damaged=(2,))
    assert f"the checkpoint {ckpts}/2 is damaged: {problem}" in caplog.text
    assert "using step 1 instead, the newest intact checkpoint" in caplog.text
    # Once the run is accepted, the damaged step makes way for a new save.
    assert resume.set_aside_damaged(start) == [f"{ckpts}/2.damaged"]
    assert checkpoint_reader.complete_steps(ckpts) == [1]
    restored = checkpoint_reader.restore_checkpoint(ckpts, _state(mesh), step=1)
    jax.tree.map(np.testing.assert_array_equal, restored.state, _state(mesh))
    assert restored.data_state == {"seen": 1}

  # `init_from`/`resume` naming a run: its best step is skipped if damaged.
  (saved / "checkpoints" / rundir.BEST_JSON).write_text(
    json.dumps({"metric": "eval/top1", "mode": "max", "step": 1, "value": 0.5})
  )
  _delete_metadata(saved / "checkpoints" / "1")
  assert resume.find_checkpoint(saved, prefer_best=True) == (
    str(saved / "checkpoints"),
    2,
  )
  with pytest.raises(
    errors.WorkdirError,
    match="checkpoints/1 is damaged: state/_METADATA is missing",
  ):
    resume.find_checkpoint(saved / "checkpoints" / "1")
  assert checksums.main(["checksums", str(saved / "checkpoints" / "1")]) == 1
  # The folder above the steps, or the run: each step checked.
  for above in (saved, saved / "checkpoints"):
    assert checksums.main(["checksums", str(above)]) == 1
  assert checksums.main(["checksums", str(saved / "checkpoints" / "2")]) == 0
  for wrong in (tmp_path, tmp_path / "nowhere", "--help"):
    with pytest.raises(SystemExit) as refused:
      checksums.main(["checksums", str(wrong)])
    assert refused.value.code == (0 if wrong == "--help" else 2)
  # None intact: refused (exit 2), saying what to do.
  _flip_a_byte(saved / "checkpoints" / "2")
  with pytest.raises(
    errors.WorkdirError,
    match="no intact checkpoint in .*: steps 2, 1 are damaged",
  ) as refused:
    resume.resolve_start(saved, _config())
  assert refused.value.exit_code == errors.EXIT_USAGE
  assert "move" in refused.value.hint and "backup" in refused.value.hint


def test_damaged_arrays_are_found_by_the_restore_which_takes_the_next_step(
  tmp_path, caplog
):
  """The start point verifies a step's metadata; its arrays are verified as
  the restore reads them: a damaged one gives way to the next newest step
  (or, named by `resume`, is refused)."""
  mesh = sharding.make_mesh(fsdp=2)
  ckpts = rundir.checkpoints(tmp_path)
  with checkpoint.Checkpointer(str(ckpts), every_steps=1) as ckpt:
    for step in (1, 2):
      ckpt.save(step, _state(mesh, scale=step), data_state={"seen": step})
  arrays = [
    p
    for p in (ckpts / "2").rglob("*")
    if p.is_file()
    and checksums.is_array_data(p.relative_to(ckpts / "2").as_posix())
  ]
  assert arrays
  data = bytearray(arrays[0].read_bytes())
  data[len(data) // 2] ^= 0xFF
  arrays[0].write_bytes(bytes(data))
  start = resume.resolve_start(tmp_path, _config())
  assert start == resume.StartPoint("workdir", str(ckpts), 2)
  with caplog.at_level("WARNING"):
    at, restored, _ = resume.restore(
      start, _state(mesh), _config(), training=False
    )
  start.close()
  assert at == resume.StartPoint("workdir", str(ckpts), 1, damaged=(2,))
  assert f"the checkpoint {ckpts}/2 is damaged: " in caplog.text
  assert "has changed since it was saved" in caplog.text
  assert "using step 1 instead" in caplog.text
  jax.tree.map(np.testing.assert_array_equal, restored.state, _state(mesh))
  assert restored.data_state == {"seen": 1}
  named = resume.resolve_start(
    tmp_path / "other", _config(resume=str(ckpts / "2"))
  )
  with pytest.raises(errors.WorkdirError, match="checkpoints/2 is damaged"):
    resume.restore(named, _state(mesh), _config(), training=False)
  named.close()


def _random_state(mesh, size: int, seed: int):
  """Incompressible float32[size] (Orbax compresses what it writes)."""
  return {
    "params": {
      "w": jax.device_put(
        jax.random.normal(jax.random.key(seed), (size,)),
        sharding.replicated(mesh),
      )
    }
  }


def test_a_save_that_fails_names_its_cause_and_the_last_good_step(small_disk):
  mesh = sharding.make_mesh()
  ckpts = small_disk.path / "checkpoints"
  state = _random_state(mesh, 250_000, 0)  # 1 MB
  with checkpoint.Checkpointer(ckpts, every_steps=1, keep=3) as ckpt:
    assert ckpt.save(1, state)
    ckpt.wait_until_finished()
    small_disk.leave_free(500_000)
    assert ckpt.save(2, _random_state(mesh, 250_000, 2))  # In the background.
    with pytest.raises(errors.WriteError) as failed:
      ckpt.wait_until_finished()  # Or the next `save`, at the next step.
  # Without asynchronous saves: raised by that save.
  with checkpoint.Checkpointer(ckpts, every_steps=1, async_save=False) as ckpt:
    with pytest.raises(
      errors.WriteError,
      match="step 3 .*: No space left on "
      "device; the last checkpoint saved whole is step 1",
    ):
      ckpt.save(3, _random_state(mesh, 250_000, 3))
  assert str(failed.value) == (
    f"could not save the checkpoint of step 2 in {ckpts}: No space left on "
    "device; the last checkpoint saved whole is step 1"
  )
  assert failed.value.exit_code == errors.EXIT_WRITE_FAILED == 74
  # What the failed saves wrote is gone; the last good one is whole.
  assert sorted(p.name for p in ckpts.iterdir()) == ["1"]
  assert checksums.verify(ckpts / "1") is None
  small_disk.free_up()
  restored = checkpoint_reader.restore_checkpoint(ckpts, state)
  jax.tree.map(np.testing.assert_array_equal, restored.state, state)
  # A disk that stops being writable (here: remounted read-only).
  subprocess.run(
    ["mount", "-o", "remount,ro", str(small_disk.path)], check=True
  )
  with checkpoint.Checkpointer(ckpts, every_steps=1) as ckpt:
    with pytest.raises(
      errors.WriteError,
      match="step 4 .*: Read-only file "
      "system; the last checkpoint saved whole is step 1",
    ):
      ckpt.save(4, state)


def test_a_workdir_deleted_during_a_save_is_said_so(tmp_path):
  """The directory goes while the save writes in the background: one
  WriteError saying so (exit 74), not Orbax's or TensorStore's tracebacks."""
  mesh = sharding.make_mesh()
  ckpts = tmp_path / "run" / "checkpoints"
  with checkpoint.Checkpointer(ckpts, every_steps=1, keep=3) as ckpt:
    assert ckpt.save(1, _random_state(mesh, 4_000_000, 1))  # 16 MB.
    while (tmp_path / "run").exists():  # While it is being written (the
      shutil.rmtree(tmp_path / "run", ignore_errors=True)  # save adds files).
    with pytest.raises(errors.WriteError) as failed:
      ckpt.wait_until_finished()
  assert str(failed.value) == (
    f"could not save the checkpoint of step 1 in {ckpts}: files of the save "
    "were deleted while it was being written (the workdir removed or moved?)"
  )


def test_any_failure_of_a_save_whose_workdir_is_gone_is_said_so(tmp_path):
  """Which error the deletion raises depends on when it hits the save:
  Orbax reading back its array metadata raises a ValueError, also once its
  writes have made the directories again; with the checkpoints' directory
  gone any error is the same WriteError; else a bug's own."""
  ckpts = tmp_path / "run" / "checkpoints"
  gone = ValueError("No ArrayMetadata found for process_index=0 in ...")
  with checkpoint.Checkpointer(ckpts, every_steps=1, keep=3) as ckpt:
    with pytest.raises(ValueError, match="a bug"):
      ckpt._report_failure(1, ValueError("a bug"))
    with pytest.raises(errors.WriteError, match="were deleted while"):
      ckpt._report_failure(1, gone)
    shutil.rmtree(tmp_path / "run")
    with pytest.raises(errors.WriteError, match="were deleted while"):
      ckpt._report_failure(1, ValueError("a bug"))


_ORPHANED_WRITES = """
import asyncio, gc
from vidjax.checkpoints import failed_saves
from vidjax.report import console
console.setup_console()
failed_saves.install_quiet()
loop = asyncio.new_event_loop()
for message in (
  # TensorStore's, raised in a write task Orbax no longer awaits.
  'RESOURCE_EXHAUSTED: Error writing "params.w/0" in OCDBT database: Failed '
  "to write 259769 bytes to file 8: No space left on device "
  "[os_error_code='28']",
  "a bug in a task",
):
  future = loop.create_future()
  future.set_exception(ValueError(message))
  del future
  gc.collect()
"""


def test_a_failed_saves_orphaned_writes_stay_off_the_console():
  """asyncio reports each write task whose error nobody retrieved (when it
  is collected, one report per task: hundreds on a full disk); those of a
  refused write are dropped, any other task's error is still shown."""
  proc = subprocess.run(
    [sys.executable, "-c", _ORPHANED_WRITES],
    capture_output=True,
    text=True,
    check=True,
  )
  out = proc.stdout + proc.stderr
  assert "a bug in a task" in out
  assert "No space left" not in out
  assert out.count("never retrieved") == 1, out
