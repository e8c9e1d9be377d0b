"""The input pipeline: determinism, exact resume, bad videos, sharded batches."""

import gzip
import json
import os
from pathlib import Path
import pickle
import re
import shutil
import threading
import time

import grain
import jax
import numpy as np
import psutil
import pytest

from benchmarks import timed_reads
from vidjax import augment, sharding
from vidjax.base import errors
from vidjax.config import defaults
from vidjax.data import (
  annotations,
  batches as batches_lib,
  loader as loader_lib,
  order as order_lib,
  pipeline,
  synthetic,
  video,
  workers as workers_lib,
)
from vidjax.data.annotations import annotation_files, ek100
from vidjax.data.synthetic import layouts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return synthetic.make_corpus(
    tmp_path_factory.mktemp("corpus"),
    num_videos=16,
    segments_per_video=2,
    progress=False,
  )


SIZE = 36


def config_for(root, **data):
  config = defaults.base_config("contrastive")
  config.seed = 3
  config.data.update(
    root=str(root / "chunks"),
    train_annotations=str(root / "train.jsonl"),
    eval_annotations=str(root / "val.jsonl"),
    num_frames=4,
    size=SIZE,
    device_prefetch=1,
    **data,
  )
  return config


CLIP_BYTES = 4 * SIZE * SIZE * 3  # config_for's uint8 clips.
# A worker's block of a clip (its flag byte, then alignment).
BLOCK_BYTES = CLIP_BYTES + workers_lib.SLOT_HEADER


@pytest.fixture(scope="module")
def mesh():
  return sharding.make_mesh()


def take(pipe, n):
  batches = [jax.tree.map(np.asarray, next(pipe)) for _ in range(n)]
  return batches


def assert_same(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _shm_bytes(block_size, before):
  """Bytes of this process's /dev/shm blocks of `block_size` bytes made
  since `before`: the pipelines' blocks are named after their trainer (this
  process), so other tests, and other vidjax runs on the machine, do not
  count."""
  ours, total = f"{workers_lib.PREFIX}{os.getpid()}_", 0
  for entry in os.scandir(pipeline.SHM_DIR):
    if not entry.name.startswith(ours) or entry.name in before:
      continue
    try:
      size = entry.stat().st_size
    except FileNotFoundError:  # Freed while we looked.
      continue
    if size == block_size:
      total += size
  return total


@pytest.fixture(scope="module")
def two_workers(corpus, mesh, tmp_path_factory):
  """3 batches of 48 clips made by 2 worker processes in groups of 2 clips,
  /dev/shm watched, their reads timed as the pipeline benchmark times them
  (`benchmarks.timed_reads`)."""
  config = config_for(corpus, workers=2, worker_buffer=4)
  reads = tmp_path_factory.mktemp("reads")
  patch = pytest.MonkeyPatch()
  patch.setattr(pipeline, "TRANSFER_BYTES", 2 * CLIP_BYTES)
  assert pipeline.clips_per_transfer(config.data, 48) == 2
  before = set(os.listdir(pipeline.SHM_DIR))
  peak, stop = [0], threading.Event()

  def watch():
    while not stop.is_set():
      peak[0] = max(peak[0], _shm_bytes(BLOCK_BYTES, before))

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  pipe = pipeline.make_pipeline(
    config,
    mesh,
    train=True,
    batch_size=48,
    read_clip=timed_reads.TimedReadClip(reads),
  )
  try:
    batches = take(pipe, 1)
    time.sleep(1.0)  # Every worker and main-side buffer fills up.
    batches += take(pipe, 2)
    jax_in_workers = [
      "jaxlib" in Path(f"/proc/{p.pid}/maps").read_text()
      for p in psutil.Process().children(recursive=True)
      if "spawn_main" in " ".join(p.cmdline())
    ]
  finally:
    stop.set()
    watcher.join()
    pipe.close()
    patch.undo()
  return {
    "batches": batches,
    "peak_shm": peak[0],
    "config": config,
    "jax_in_workers": jax_in_workers,
    "reads": reads,
  }


@pytest.mark.xdist_group("two_workers")
def test_workers_start_without_jax(two_workers):
  """Grain's workers run `vidjax.data.lean_worker` first: jax is not
  loaded in them, though this process (their main module's) has it."""
  assert two_workers["jax_in_workers"] == [False, False]


@pytest.mark.xdist_group("two_workers")
def test_the_benchmarks_timed_reads_count_each_workers_reads(two_workers):
  """Every clip the workers read is counted, in a file per worker, with its
  frames and a CPU time (and the batches are the same without the stand-in:
  `test_same_batches_whatever_the_workers`)."""
  folder = two_workers["reads"]
  assert len(list(folder.iterdir())) == 2
  totals = timed_reads.totals(folder)
  frames = two_workers["config"].data.num_frames
  assert totals.clips >= 3 * 48
  assert totals.delivered == totals.clips * frames
  assert totals.decoded >= totals.delivered and totals.cpu_s > 0


# The tests of `two_workers` (a module fixture) run in one process.
@pytest.mark.xdist_group("two_workers")
def test_same_batches_whatever_the_workers(corpus, mesh, two_workers):
  runs = {(2, 0): two_workers["batches"]}
  for workers, threads in ((0, 0), (0, 2)):
    config = config_for(corpus, workers=workers, threads=threads)
    pipe = pipeline.make_pipeline(config, mesh, train=True, batch_size=48)
    runs[(workers, threads)] = take(pipe, 3)
    pipe.close()
  base = runs.pop((0, 0))
  for other in runs.values():
    for a, b in zip(base, other, strict=True):
      assert_same(a, b)
  # Different seeds differ.
  pipe = pipeline.make_pipeline(
    config_for(corpus), mesh, train=True, batch_size=8, seed=4
  )
  assert not np.array_equal(take(pipe, 1)[0]["video"], base[0]["video"][:8])
  pipe.close()


# The tests of `two_workers` (a module fixture) run in one process.
@pytest.mark.xdist_group("two_workers")
@pytest.mark.skipif(not os.path.isdir(pipeline.SHM_DIR), reason="no /dev/shm")
def test_shared_memory_holds_a_few_clips_per_worker_whatever_the_batch(
  two_workers,
):
  """Workers hand over groups of 2 clips, not batches of 48, in blocks they
  reuse (3 batches are 72 groups): /dev/shm never holds more than their
  buffers' worth (`shared_memory_bytes`)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(pipeline, "TRANSFER_BYTES", 2 * CLIP_BYTES)
    bound = pipeline.shared_memory_bytes(two_workers["config"].data, 48)
  # Per worker: 4 clips (2 groups) buffered on each side, a group in hand
  # on each side, and the next group being decoded; a block a clip.
  assert bound == 2 * (2 * 2 + 3) * 2 * BLOCK_BYTES
  assert 0 < two_workers["peak_shm"] <= bound < 48 * CLIP_BYTES, (
    two_workers["peak_shm"],
    bound,
  )


@pytest.mark.skipif(not os.path.isdir(pipeline.SHM_DIR), reason="no /dev/shm")
def test_a_worker_hands_over_the_blocks_it_decoded_into(corpus, monkeypatch):
  """In a worker, each clip is decoded into a /dev/shm block of its own and
  crosses in it (stacking the group makes no block for it); a failed read,
  or a reader that makes its own array, frees its block for the next clip;
  an invalid clip's zeros are copied into a block; `receive` copies the
  frames out and frees every block."""
  pool = workers_lib.Workers(1)
  for name, value in (
    ("_PREFIX", [pool.prefix]),
    ("_POOL", {}),
    ("_CLIPS", {}),
  ):
    monkeypatch.setattr(workers_lib, name, value)  # As in a worker.
  # Clips of a size of this test's own: the reader threads of other tests'
  # pipelines may still run in this process, and would take blocks too.
  data = config_for(corpus).data
  data.size = SIZE + 4
  blocks = lambda: sorted(
    e.name
    for e in os.scandir(pipeline.SHM_DIR)
    if e.name.startswith(pool.prefix)
    and e.stat().st_size == 4 * data.size**2 * 3 + workers_lib.SLOT_HEADER
  )

  def broken(*args, out=None, **kwargs):
    raise video.VideoReadError("broken.mp4: cannot decode")

  records = annotations.load_jsonl(corpus / "train.jsonl")
  spec = loader_lib.ClipSpec.from_config(data, train=True)
  make = lambda **kw: loader_lib.ClipLoader(
    records, str(corpus / "chunks"), spec, targets=(), **kw
  )
  good, bad = make(), make(read_clip=broken, max_attempts=3)
  rng = np.random.default_rng(0)
  try:
    first = good.train_element(0, rng)
    invalid = bad.train_element(1, rng)  # 3 reads in one block, freed.
    third = good.train_element(2, rng)  # In the block the reads freed.
    assert invalid["skipped"] == 3 and not invalid["valid"]
    assert len(blocks()) == 2
    expected = np.stack([first["video"], invalid["video"], third["video"]])
    group = workers_lib.stack_to_shared_memory([first, invalid, third])
    slot = group["video"]
    assert len(blocks()) == 3  # One more: the invalid clip's zeros.
    assert set(slot.names) == set(blocks()) and slot.shape == expected.shape
    out = np.empty_like(expected)
    workers_lib.receive(slot, out)
    np.testing.assert_array_equal(out, expected)
    free = lambda name: (
      Path(pipeline.SHM_DIR, name).read_bytes()[:1] == bytes([workers_lib.FREE])
    )
    assert all(map(free, slot.names))
    # A reader that makes its own array leaves the block it was offered free.
    own = make(
      read_clip=lambda *args, out=None, **kw: video.read_clip(*args, **kw)
    )
    assert own.train_element(3, rng)["valid"]
    assert len(blocks()) == 3 and all(map(free, blocks()))
  finally:
    pool.close()
  assert not blocks()


def test_too_small_dev_shm_stops_at_start_up_saying_what_to_change(
  corpus, mesh, monkeypatch
):
  config = config_for(corpus, workers=16, worker_buffer=8)
  config.data.update(num_frames=16, size=224)
  usage = shutil.disk_usage(".")
  monkeypatch.setattr(
    pipeline.shutil, "disk_usage", lambda path: usage._replace(free=64 * 2**20)
  )
  monkeypatch.setattr(pipeline.os.path, "isdir", lambda path: True)
  with pytest.raises(
    ValueError,
    match=r"(?s)64 MiB free.*16 data workers.*"
    r"data.worker_buffer.*data.workers.*--shm-size",
  ):
    pipeline.make_pipeline(config, mesh, train=True, batch_size=8)


def test_training_order_takes_every_record_once_an_epoch_in_a_new_order():
  """`EpochShuffle`: each epoch a permutation of its own (the same for
  the same seed, also in another process: pickled to a worker), read at
  any position and by slices as Grain reads it."""
  order = order_lib.EpochShuffle(grain.MapDataset.range(12), seed=3)
  order = order.repeat(3)
  epochs = [[order[12 * e + i] for i in range(12)] for e in range(3)]
  assert all(sorted(epoch) == list(range(12)) for epoch in epochs)
  assert len({tuple(epoch) for epoch in epochs}) == 3
  assert epochs[0] != list(range(12))
  again = pickle.loads(
    pickle.dumps(order_lib.EpochShuffle(grain.MapDataset.range(12), seed=3))
  )
  assert [again[i] for i in reversed(range(24))] == [
    x for epoch in epochs[:2] for x in epoch
  ][::-1]
  other = order_lib.EpochShuffle(grain.MapDataset.range(12), seed=4)
  assert [other[i] for i in range(12)] != epochs[0]
  assert list(order[1::12].to_iter_dataset())[:3] == [e[1] for e in epochs]


def test_restored_iterator_reproduces_following_batches(corpus, mesh):
  config = config_for(corpus)
  pipe = pipeline.make_pipeline(config, mesh, train=True, batch_size=8)
  take(pipe, 2)
  state = json.loads(json.dumps(pipe.get_state()))  # As a checkpoint saves it.
  expected = take(pipe, 3)
  resumed = pipeline.make_pipeline(
    config, mesh, train=True, batch_size=8, state=state
  )
  for a, b in zip(expected, take(resumed, 3)):
    assert_same(a, b)
  pipe.close()
  resumed.close()


def test_batches_are_global_uint8_arrays_sharded_on_batch(corpus, mesh):
  pipe = pipeline.make_pipeline(
    config_for(corpus), mesh, train=True, batch_size=16
  )
  batch = next(pipe)
  video = batch["video"]
  assert isinstance(video, jax.Array) and video.dtype == np.uint8
  assert video.shape == (16, 4, SIZE, SIZE, 3)
  assert video.sharding.spec[0] == ("data", "fsdp")
  assert len(video.addressable_shards) == 8
  assert {s.data.shape[0] for s in video.addressable_shards} == {2}
  assert batch["valid"].all()
  assert "label" not in batch  # The rows' labels: a video-text task reads none.
  # Augmentation runs jitted on the device batch.
  fn = jax.jit(augment.make_augment({}))
  out = fn(batch, jax.random.key(0))
  assert out["video"].dtype == np.float32 and out["video"].shape == video.shape
  pipe.close()


def test_text_tokens_with_a_tokenizer(corpus, mesh, tmp_path):
  from vidjax.data import tokenizer as tok_lib

  vocab = tmp_path / "vocab.txt.gz"
  with gzip.open(vocab, "wt") as f:
    f.write("#version: 0.2\nm o\nmo v\n")
  tok = tok_lib.Tokenizer(vocab)
  pipe = pipeline.make_pipeline(
    config_for(corpus), mesh, train=True, batch_size=8, tokenizer=tok
  )
  batch = jax.tree.map(np.asarray, next(pipe))
  records = annotations.load_jsonl(corpus / "train.jsonl")
  for tokens, index in zip(batch["tokens"], batch["index"]):
    assert tokens.shape == (77,)
    np.testing.assert_array_equal(tokens, tok(records[index].text)[0])
  pipe.close()


def corrupt(root, video_ids):
  for vid in video_ids:
    for path in (root / "chunks" / vid).iterdir():
      path.write_bytes(b"garbage" * 10)


def test_ten_percent_corrupt_iterates_to_the_end(
  corpus, mesh, tmp_path, monkeypatch
):
  warnings = []
  monkeypatch.setattr(
    batches_lib.logging,
    "warning",
    lambda fmt, *args: warnings.append(fmt % args),
  )
  root = tmp_path / "c"
  shutil.copytree(corpus, root)
  records = annotations.load_jsonl(root / "train.jsonl")  # 24 records.
  video_ids = sorted({r.video_id for r in records})
  bad = video_ids[:1]  # 2 of 24 records, about 10%.
  corrupt(root, bad)
  pipe = pipeline.make_pipeline(
    config_for(root), mesh, train=True, batch_size=8, num_epochs=1
  )
  batches = [jax.tree.map(np.asarray, b) for b in pipe]
  assert len(batches) == 3
  assert all(b["valid"].all() for b in batches)
  loaded = np.concatenate([b["index"] for b in batches])
  assert not {records[i].video_id for i in loaded} & set(bad)
  skipped = sum(int(b["skipped"].sum()) for b in batches)
  assert skipped >= 2 and pipe.skipped == skipped
  # Counted per file, each file's first failure logged once.
  failures = pipe.failures
  assert sum(failures.values()) == skipped
  assert {p.split("/chunks/")[1].split("/")[0] for p in failures} == set(bad)
  logged = [m for m in warnings if "cannot read a clip" in m]
  assert len(logged) == len(failures)
  assert {m.split(": ")[1] for m in logged} == set(failures)


def test_all_corrupt_stops_with_the_bad_files_named(corpus, mesh, tmp_path):
  root = tmp_path / "c"
  shutil.copytree(corpus, root)
  corrupt(root, [p.name for p in (root / "chunks").iterdir() if p.is_dir()])
  pipe = pipeline.make_pipeline(
    config_for(root), mesh, train=True, batch_size=8
  )
  with pytest.raises(errors.DataError) as e:
    next(pipe)
  pipe.close()
  lines = str(e.value).splitlines()
  assert re.fullmatch(
    r"(\d+) of \1 clip reads failed \(100%\), in (\d+) files:", lines[0]
  )
  num_files = int(lines[0].split()[-2])
  listed, more = lines[1:11], lines[11:]  # The 10 worst, then how many more.
  assert more == [f"  ... and {num_files - 10} more files"]
  files = [line.split(": ")[0].strip() for line in listed]
  assert len(set(files)) == 10  # Each file once, with its count.
  assert all(
    re.fullmatch(r"\s+\S+/chunks/vid0\d\d/\d+\.mp4: \d+ failed reads?", line)
    for line in listed
  )
  assert "data.max_skip_fraction" in e.value.hint


def test_eval_views_each_once_and_padded(corpus, mesh):
  config = config_for(corpus, eval_clips=2, eval_crops=3)
  pipe = pipeline.make_pipeline(config, mesh, train=False, batch_size=32)
  batches = [jax.tree.map(np.asarray, b) for b in pipe]
  num_records = len(annotations.load_jsonl(corpus / "val.jsonl"))
  valid = np.concatenate([b["valid"] for b in batches])
  pairs = {
    (int(i), int(v))
    for b in batches
    for i, v, ok in zip(b["index"], b["view"], b["valid"])
    if ok
  }
  assert valid.sum() == num_records * 6 and len(pairs) == num_records * 6
  assert len(valid) == 64 and not valid[-16:].any()  # Padded to full batches.
  again = [
    jax.tree.map(np.asarray, b)
    for b in pipeline.make_pipeline(config, mesh, train=False, batch_size=32)
  ]
  for a, b in zip(batches, again):
    assert_same(a, b)


@pytest.fixture(scope="module")
def tok(corpus):
  from vidjax.data import tokenizer as tok_lib

  return tok_lib.Tokenizer(synthetic.write_vocab(corpus / "vocab.txt.gz"))


def corpus_config(corpus, data_format, **data):
  """The corpus's files in `data_format`, as a `:debug` run points at them."""
  config = config_for(corpus, format=data_format, **data)
  layouts.use_corpus(config, corpus)
  return config


def caption_of(tokens, tok, captions):
  """The caption whose tokens these are."""
  matches = [
    i for i, c in enumerate(captions) if np.array_equal(tok(c)[0], tokens)
  ]
  assert len(matches) == 1
  return matches[0]


def test_mir_positives_are_relevant_and_the_same_for_any_worker_count(
  corpus, mesh, tok
):
  config = corpus_config(corpus, "ek100_mir")
  data = config.data
  records = annotation_files.load_annotations(data, data.train_annotations)
  captions = [
    t for _, t in ek100.load_ek100_mir_sentences(data.train_sentences)
  ]
  relevancy = ek100.load_relevancy(data.train_relevancy, allow_pickle=True)
  assert len(captions) < len(records) == relevancy.shape[0]  # Captions repeat.
  positives = annotation_files.caption_positives(data, records)
  rng = np.random.default_rng(0)
  drawn = [
    [captions.index(positives.draw(i, rng)) for _ in range(40)]
    for i in range(len(records))
  ]
  for i, columns in enumerate(drawn):  # 40 draws for each of the clips
    assert (relevancy[i, columns] > 0.1).all()
    assert set(columns) == set(np.flatnonzero(relevancy[i] > 0.1))
  assert any(
    captions[c] != records[i].text for i, cs in enumerate(drawn) for c in cs
  )
  # In the pipeline: each element's own generator, whatever the workers.
  runs = []
  for workers in (0, 2):
    with config.unlocked():
      config.data.workers = workers
    pipe = pipeline.make_pipeline(
      config, mesh, train=True, batch_size=8, tokenizer=tok
    )
    runs.append(take(pipe, 2))
    pipe.close()
  for a, b in zip(*runs):
    assert_same(a, b)
  elements = [(i, t) for b in runs[0] for i, t in zip(b["index"], b["tokens"])]
  chosen = [caption_of(t, tok, captions) for _, t in elements]
  assert all(relevancy[i, c] > 0.1 for (i, _), c in zip(elements, chosen))


def test_sms_batches_carry_the_train_matrix_relevancy_of_every_pair(
  corpus, mesh, tok, monkeypatch
):
  """With a relevancy-aware loss each item carries its clip's row and its
  caption's column of the training matrix, and the relevancy the loss gets
  for every in-batch pair (video i, caption of item j) is the matrix's."""
  from vidjax.tasks import losses, retrieval

  config = corpus_config(corpus, "ek100_mir")
  config.task, config.loss.name = "retrieval", "sms"
  data = config.data
  matrix = ek100.load_relevancy(data.train_relevancy, allow_pickle=True)
  captions = [
    t for _, t in ek100.load_ek100_mir_sentences(data.train_sentences)
  ]
  pipe = pipeline.make_pipeline(
    config, mesh, train=True, batch_size=8, tokenizer=tok
  )
  batch = jax.tree.map(np.asarray, take(pipe, 1)[0])
  pipe.close()
  rows, columns = batch["relevancy_row"], batch["relevancy_column"]
  np.testing.assert_array_equal(rows, batch["index"])  # Every row checked.
  assert (columns >= 0).all()  # Every clip has positives here.
  assert [caption_of(t, tok, captions) for t in batch["tokens"]] == list(
    columns
  )
  expected = matrix[np.ix_(rows, columns)]
  assert len(np.unique(expected)) > 1  # Pairs of several relevancies.
  seen, sms_loss = {}, losses.sms_loss

  def spy(similarity, relevancy, **kwargs):
    seen["relevancy"] = np.asarray(relevancy)
    return sms_loss(similarity, relevancy, **kwargs)

  monkeypatch.setattr(losses, "sms_loss", spy)
  embeddings = dict(
    video=np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32),
    text=np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32),
  )
  value, _ = retrieval.embedded_loss(None, embeddings, batch, config)
  assert np.isfinite(value)
  np.testing.assert_allclose(seen["relevancy"], expected, atol=1e-6)


def test_llm_augmented_files_concatenated_and_lists_drawn_reproducibly(
  corpus, mesh, tok
):
  config = corpus_config(corpus, "ego4d", threads=2)
  records = annotation_files.load_annotations(
    config.data, config.data.train_annotations
  )
  segments = annotations.load_jsonl(corpus / "train.jsonl")
  assert len(records) == 2 * len(segments)  # Rephraser's, then narrator's.
  assert all(len(r.extra["texts"]) == 3 for r in records)
  epochs = []
  for threads, seed in ((2, 3), (0, 3), (0, 4)):
    with config.unlocked():
      config.data.threads = threads
    pipe = pipeline.make_pipeline(
      config,
      mesh,
      train=True,
      batch_size=8,
      tokenizer=tok,
      num_epochs=1,
      seed=seed,
    )
    epochs.append([jax.tree.map(np.asarray, b) for b in pipe])
  for a, b in zip(epochs[0], epochs[1]):
    assert_same(a, b)
  chosen = {
    seed: sorted(
      (int(i), caption_of(t, tok, records[i].extra["texts"]))
      for b in run
      for i, t in zip(b["index"], b["tokens"])
    )
    for seed, run in ((3, epochs[0]), (4, epochs[2]))
  }
  assert [i for i, _ in chosen[3]] == list(range(len(records)))  # Each once.
  assert len({k for _, k in chosen[3]}) == 3  # All list positions drawn.
  assert chosen[3] != chosen[4]  # Another seed, other draws.


def test_kinetics_list_records_span_whole_videos(corpus, tmp_path):
  """AVION's `path num_frames label` lists: clips anywhere in the video."""
  listing = tmp_path / "k400_val_list.txt"
  listing.write_text("val_320px/vid000.mp4 32 5\nval_320px/vid001.mp4 32 7\n")
  config = config_for(
    corpus, format="kinetics_list", sampling="stride", stride=2, eval_clips=2
  )
  records = annotation_files.load_annotations(config.data, str(listing))
  loader = loader_lib.ClipLoader(
    records, config.data.root, loader_lib.ClipSpec.from_config(config.data)
  )
  last = loader.eval_element(1)  # Record 0, the second (last) of 2 views.
  assert last["valid"] and last["label"] == 5
  from vidjax.data import crop, sampling, video

  info = video.video_info(config.data.root, "vid000")
  ids = sampling.multi_view_frame_ids(0, info.num_frames, 4, 2, 2)[1]
  assert ids[-1] > info.num_frames * 3 // 4  # The whole video's last part.
  box = crop.center_crop(None, info.height, info.width, (SIZE, SIZE))
  np.testing.assert_array_equal(
    last["video"],
    video.read_clip(
      config.data.root, "vid000", ids, crop=box.box, size=(SIZE, SIZE)
    ),
  )
  element = loader.train_element(3, np.random.default_rng(0))
  assert element["valid"] and element["label"] == 7 and not element["errors"]


def one_clip_groups(elements):
  """Single elements as groups of 1 clip, as `make_dataset` hands them."""
  return [{k: np.asarray(v)[None] for k, v in e.items()} for e in elements]


def test_host_batches_are_aligned_for_zero_copy_transfers():
  """XLA's CPU client takes 64-byte-aligned host arrays without a copy."""
  groups = [
    {
      "video": np.full((2, 4, 8, 8, 3), i, np.uint8),
      "valid": np.ones(2, bool),
      "skipped": np.zeros(2, np.int32),
      "errors": np.array(["", ""]),
    }
    for i in range(3)
  ]
  batch = next(batches_lib.HostBatches(iter(groups), 4, 0.25, group=2))
  for value in batch.values():
    assert value.ctypes.data % batches_lib.ALIGNMENT == 0
  np.testing.assert_array_equal(batch["video"][:, 0, 0, 0, 0], [0, 0, 1, 1])


def test_batch_buffers_are_reused_only_once_nothing_holds_them():
  """A batch's memory comes back only when no array, view or device array
  (a CPU's, made without a copy) holds it."""
  pool = batches_lib.BatchBuffers()
  shape = (4, 64, 64, 3)
  first = pool.empty(shape, np.uint8)
  where = first.ctypes.data
  assert pool.empty(shape, np.uint8).ctypes.data != where  # Held.
  del first
  again = pool.empty(shape, np.uint8)
  assert again.ctypes.data == where  # Only the pool held it.
  view = again[1:]
  del again
  assert pool.empty(shape, np.uint8).ctypes.data != where  # Its view held.
  del view
  device = jax.device_put(pool.empty(shape, np.uint8))
  if device.unsafe_buffer_pointer() == where:  # No copy (a CPU).
    assert pool.empty(shape, np.uint8).ctypes.data != where
  assert pool.empty((2, 2), np.uint8).ctypes.data % batches_lib.ALIGNMENT == 0


def host_elements(valid, video_ids=None):
  """Elements as `ClipLoader` makes them; an invalid one failed one read."""
  video_ids = video_ids or [f"vid{i:03d}" for i in range(len(valid))]
  return one_clip_groups(
    [
      {
        "video": np.full((2, 4, 4, 3), i, np.uint8),
        "valid": ok,
        "skipped": int(not ok),
        "errors": "" if ok else f"/store/{vid}: cannot decode frame 3",
      }
      for i, (ok, vid) in enumerate(zip(valid, video_ids))
    ]
  )


def test_unreadable_clip_alone_in_the_final_eval_batch_is_counted():
  """Evaluation keeps going on a few bad clips; training stops at a batch
  whose every element used up its attempts."""
  elements = host_elements([True] * 4 + [False])
  host = batches_lib.HostBatches(iter(elements), 4, 0.25)
  out = list(host)
  assert [b["valid"].tolist() for b in out] == [[True] * 4, [False] * 4]
  assert host.skipped == 1 and host.failures == {"/store/vid004": 1}
  host = batches_lib.HostBatches(iter(elements), 1, 0.25, train=True)
  assert len([next(host) for _ in range(4)]) == 4
  with pytest.raises(
    errors.DataError, match=r"1 of 5 clip reads failed \(20%\), in 1 file:"
  ):
    next(host)


def test_every_process_yields_as_many_eval_batches(corpus):
  """9 clips over 2 processes of 4: both yield ceil(9 / 8) = 2 batches, or
  the evaluation's collectives would wait forever for the one that ran out."""
  config = config_for(corpus)
  records = annotations.load_jsonl(corpus / "train.jsonl")[:9]
  clip_loader = loader_lib.ClipLoader(
    records, config.data.root, loader_lib.ClipSpec.from_config(config.data)
  )
  runs = [
    list(
      batches_lib.HostBatches(
        iter(
          pipeline.make_dataset(
            clip_loader,
            train=False,
            seed=0,
            batch_size=4,
            process_index=p,
            process_count=2,
          )
        ),
        4,
        0.25,
      )
    )
    for p in (0, 1)
  ]
  assert [len(run) for run in runs] == [2, 2]
  valid = [
    (int(i), int(s))
    for run in runs
    for b in run
    for i, ok, s in zip(b["index"], b["valid"], b["skipped"])
    if ok
  ]
  assert sorted(valid) == [(i, 0) for i in range(9)]  # Each clip once, read.
  assert sum(int(b["skipped"].sum()) for run in runs for b in run) == 0


def test_kinetics_class_ids_come_from_the_training_file(tmp_path):
  """A validation CSV with fewer classes gets the training ids, not its own."""
  header = "label,youtube_id,time_start,time_end,split\n"

  def write(name, labels):
    (tmp_path / name).write_text(
      header
      + "".join(
        f"{label},yt{i:08d}ab,{10 * i},{10 * i + 10},{name[:-4]}\n"
        for i, label in enumerate(labels)
      )
    )
    return str(tmp_path / name)

  data = defaults.data_config()
  data.update(
    format="kinetics",
    train_annotations=write(
      "train.csv", ["zumba", "abseiling", "bowling", "zumba"]
    ),
    eval_annotations=write("val.csv", ["zumba", "bowling"]),
  )
  labels = {
    s: [r.label for r in annotation_files.load_annotations(data, data[k])]
    for s, k in (("train", "train_annotations"), ("eval", "eval_annotations"))
  }
  assert labels == {"train": [2, 0, 1, 2], "eval": [2, 1]}
  write("val.csv", ["zumba", "yoga", "kayaking"])
  with pytest.raises(
    errors.DataFileError,
    match=r"val.csv: 2 classes not in "
    r"the training classes of \S+train.csv: 'kayaking', 'yoga'",
  ):
    annotation_files.load_annotations(data, data.eval_annotations)
  data.train_annotations = ""  # Evaluating released weights: its own names.
  assert [
    r.label
    for r in annotation_files.load_annotations(data, data.eval_annotations)
  ] == [2, 1, 0]


def test_unknown_video_ids_counted_per_video(corpus):
  root = str(corpus / "chunks")
  records = [
    annotations.ClipRecord(v, 0.0, 1.0, None, 0, {})
    for v in ("ghost1", "ghost2", "ghost2")
  ]
  clip_loader = loader_lib.ClipLoader(
    records, root, loader_lib.ClipSpec(num_frames=2, size=(8, 8))
  )
  host = batches_lib.HostBatches(
    iter(one_clip_groups(map(clip_loader.eval_element, range(3)))), 4, 0.25
  )
  assert not next(host)["valid"].any()
  assert host.failures == {f"{root}/ghost1": 1, f"{root}/ghost2": 2}


def test_failures_per_file_survive_a_resume():
  elements = host_elements([False, True, True, False], ["a", "b", "c", "a"])

  def host(state=None):
    start = batches_lib.resume_group(state, 1) if state else 0
    source = grain.MapDataset.source(elements)[start:].to_iter_dataset()
    return batches_lib.HostBatches(iter(source), 1, 1.0, state=state)

  first = host()
  next(first), next(first)
  state = json.loads(json.dumps(first.get_state()))  # As a checkpoint saves it.
  resumed = host(state)
  assert len(list(resumed)) == 2
  assert resumed.failures == {"/store/a": 2} and resumed.skipped == 2
  del state["failures"]  # A state saved before they were kept still loads.
  assert host(state).failures == {}


def test_a_position_of_other_transfer_groups_resumes_at_its_clip():
  """The position counts clips: groups of another size resume at the same
  clip, unless it falls inside a group (the local batch changed)."""
  state = {"clips": 24, "skipped": 0, "attempts": 24}
  assert batches_lib.resume_group(state, 4) == 6
  assert (
    batches_lib.HostBatches(
      iter([]), 8, 0.25, group=2, state=state
    ).get_state()["clips"]
    == 24
  )
  with pytest.raises(errors.ConfigError, match="24 clips.*transfers of 16"):
    batches_lib.resume_group(state, 16)
  # Saved by an older vidjax: Grain's groups, of one iterator or per worker.
  old = {"skipped": 0, "attempts": 0, "clips_per_transfer": 2}
  assert batches_lib.resume_group(dict(old, grain={"next_index": 12}), 4) == 6
  assert (
    batches_lib.resume_group(
      dict(
        old,
        grain={
          "iterators_in_use_states": [{"next_index": 7}, {"next_index": 5}]
        },
      ),
      4,
    )
    == 6
  )
