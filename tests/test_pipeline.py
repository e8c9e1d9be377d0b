"""The input pipeline: determinism, exact resume, bad videos, sharded batches."""
import gzip
import json
import re
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from vidjax import augment, sharding
from vidjax.data import annotations, pipeline, synthetic


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return synthetic.make_corpus(tmp_path_factory.mktemp("corpus"),
                               num_videos=16, segments_per_video=2,
                               progress=False)


def config_for(root, **data):
  config = ml_collections.ConfigDict({"seed": 3,
                                      "data": pipeline.default_data_config()})
  config.data.update(root=str(root / "chunks"),
                     train_annotations=str(root / "train.jsonl"),
                     eval_annotations=str(root / "val.jsonl"), num_frames=4,
                     size=32, device_prefetch=1, **data)
  return config


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


def test_same_batches_whatever_the_workers(corpus, mesh):
  runs = {}
  for workers, threads in ((0, 0), (2, 0), (0, 2)):
    config = config_for(corpus, workers=workers, threads=threads)
    pipe = pipeline.make_pipeline(config, mesh, train=True, batch_size=8)
    runs[(workers, threads)] = take(pipe, 3)
    pipe.close()
  base = runs.pop((0, 0))
  for other in runs.values():
    for a, b in zip(base, other):
      assert_same(a, b)
  # Different seeds differ.
  pipe = pipeline.make_pipeline(config_for(corpus), mesh, train=True,
                                batch_size=8, seed=4)
  assert not np.array_equal(take(pipe, 1)[0]["video"], base[0]["video"])
  pipe.close()


def test_restored_iterator_reproduces_following_batches(corpus, mesh):
  config = config_for(corpus)
  pipe = pipeline.make_pipeline(config, mesh, train=True, batch_size=8)
  take(pipe, 2)
  state = json.loads(json.dumps(pipe.get_state()))  # As a checkpoint saves it.
  expected = take(pipe, 3)
  resumed = pipeline.make_pipeline(config, mesh, train=True,
                                   batch_size=8).restored(state)
  for a, b in zip(expected, take(resumed, 3)):
    assert_same(a, b)
  pipe.close()
  resumed.close()


def test_batches_are_global_uint8_arrays_sharded_on_batch(corpus, mesh):
  pipe = pipeline.make_pipeline(config_for(corpus), mesh, train=True,
                                batch_size=16)
  batch = next(pipe)
  video = batch["video"]
  assert isinstance(video, jax.Array) and video.dtype == np.uint8
  assert video.shape == (16, 4, 32, 32, 3)
  assert video.sharding.spec[0] == ("data", "fsdp")
  assert len(video.addressable_shards) == 8
  assert {s.data.shape[0] for s in video.addressable_shards} == {2}
  assert batch["label"].shape == (16,) and batch["valid"].all()
  # Augmentation runs jitted on the device batch.
  fn = jax.jit(augment.make_augment({"hflip": True}))
  out = fn(batch, jax.random.key(0))
  assert out["video"].dtype == np.float32 and out["video"].shape == video.shape
  pipe.close()


def test_text_tokens_with_a_tokenizer(corpus, mesh, tmp_path):
  from vidjax.data import tokenizer as tok_lib
  vocab = tmp_path / "vocab.txt.gz"
  with gzip.open(vocab, "wt") as f:
    f.write("#version: 0.2\nm o\nmo v\n")
  tok = tok_lib.Tokenizer(vocab)
  pipe = pipeline.make_pipeline(config_for(corpus), mesh, train=True,
                                batch_size=8, tokenizer=tok)
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


def test_ten_percent_corrupt_iterates_to_the_end(corpus, mesh, tmp_path,
                                                 monkeypatch):
  warnings = []
  monkeypatch.setattr(pipeline.logging, "warning",
                      lambda fmt, *args: warnings.append(fmt % args))
  root = tmp_path / "c"
  shutil.copytree(corpus, root)
  records = annotations.load_jsonl(root / "train.jsonl")  # 24 records.
  video_ids = sorted({r.video_id for r in records})
  bad = video_ids[:1]  # 2 of 24 records, about 10%.
  corrupt(root, bad)
  pipe = pipeline.make_pipeline(config_for(root), mesh, train=True,
                                batch_size=8, num_epochs=1)
  batches = [jax.tree.map(np.asarray, b) for b in pipe]
  assert len(batches) == 3
  assert all(b["valid"].all() for b in batches)
  loaded = np.concatenate([b["index"] for b in batches])
  assert not {records[i].video_id for i in loaded} & set(bad)
  skipped = sum(int(b["skipped"].sum()) for b in batches)
  assert skipped >= 2 and pipe.skipped == skipped
  # Counted per file, each file's first failure logged once.
  failures = pipe.host.failures
  assert sum(failures.values()) == skipped
  assert {p.split("/chunks/")[1].split("/")[0] for p in failures} == set(bad)
  logged = [m for m in warnings if "cannot read a clip" in m]
  assert len(logged) == len(failures)
  assert {m.split(": ")[1] for m in logged} == set(failures)


def test_all_corrupt_stops_with_the_bad_files_named(corpus, mesh, tmp_path):
  root = tmp_path / "c"
  shutil.copytree(corpus, root)
  corrupt(root, [p.name for p in (root / "chunks").iterdir() if p.is_dir()])
  pipe = pipeline.make_pipeline(config_for(root), mesh, train=True,
                                batch_size=8)
  with pytest.raises(pipeline.DataError) as e:
    next(pipe)
  pipe.close()
  lines = str(e.value).splitlines()
  assert re.fullmatch(r"(\d+) of \1 clip reads failed \(100%\), in (\d+) files:",
                      lines[0])
  num_files = int(lines[0].split()[-2])
  listed, more = lines[1:11], lines[11:]  # The 10 worst, then how many more.
  assert more == [f"  ... and {num_files - 10} more files"]
  files = [line.split(": ")[0].strip() for line in listed]
  assert len(set(files)) == 10  # Each file once, with its count.
  assert all(re.fullmatch(r"\s+\S+/chunks/vid0\d\d/\d+\.mp4: \d+ failed reads?",
                          line) for line in listed)
  assert "data.max_skip_fraction" in e.value.hint


def test_eval_views_each_once_and_padded(corpus, mesh):
  config = config_for(corpus, eval_clips=2, eval_crops=3)
  pipe = pipeline.make_pipeline(config, mesh, train=False, batch_size=32)
  batches = [jax.tree.map(np.asarray, b) for b in pipe]
  num_records = len(annotations.load_jsonl(corpus / "val.jsonl"))
  valid = np.concatenate([b["valid"] for b in batches])
  pairs = {(int(i), int(v)) for b in batches
           for i, v, ok in zip(b["index"], b["view"], b["valid"]) if ok}
  assert valid.sum() == num_records * 6 and len(pairs) == num_records * 6
  assert len(valid) == 64 and not valid[-16:].any()  # Padded to full batches.
  again = [jax.tree.map(np.asarray, b) for b in pipeline.make_pipeline(
      config, mesh, train=False, batch_size=32)]
  for a, b in zip(batches, again):
    assert_same(a, b)
