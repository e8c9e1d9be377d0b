"""vidjax.search's inputs in the user's words: every bad argument said before
the index and the model load, a damaged or moved INDEX named, an output
that cannot be written (exit 74). No model is loaded here."""

import csv
import json

import numpy as np
import pytest

from vidjax import search
from vidjax.base import errors
from vidjax.search import embed


def _index(path, rows=(("v1", 0, 2), ("v1", 1, 3)), store=None):
  """An INDEX's files as vidjax.embed writes them (the store: none)."""
  path.mkdir(parents=True, exist_ok=True)
  (path / embed.INDEX_JSON).write_text(
    json.dumps({"weights": "W", "store": str(store or path / "gone")})
  )
  (path / search.CONFIG_JSON).write_text("{}")
  matrix = np.eye(len(rows), 4, dtype=np.float16)
  np.save(path / embed.EMBEDDINGS, matrix)
  with open(path / embed.WINDOWS, "w", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(("video", "start", "end"))
    writer.writerows(rows)
  return path


def _main(capsys, *argv) -> tuple[int, str]:
  code = search.main([str(a) for a in argv])
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return code, err


def test_bad_arguments_are_said_before_anything_loads(tmp_path, capsys):
  # The INDEX does not exist: each refusal below comes before it is read.
  latin1 = tmp_path / "labels.txt"
  latin1.write_bytes("caf\xe9\n".encode("latin-1"))
  for argv, said in (
    (["", "--top", "3"], "query 1 is empty"),
    (["a dog", "   "], "query 2 is empty"),
    (["--labels", latin1], "not UTF-8 text"),
    (["--labels", " , "], "--labels: no labels"),
    (["q", "--html", tmp_path / "no/dir/p.html"], "has no folder"),
    (["q", "--html", tmp_path], "is a folder"),
    (["--labels", "a,b", "--csv", tmp_path / "x/l.csv"], "has no folder"),
    (["q", "--templates", "a photo"], "each template holds {} once"),
  ):
    code, err = _main(capsys, tmp_path / "nowhere", *argv)
    assert code == errors.EXIT_USAGE and said in err, (argv, err)


@pytest.mark.parametrize(
  "damage, code, said",
  [
    (lambda p: (p / embed.EMBEDDINGS).write_bytes(b""), 1, "does not read"),
    (lambda p: (p / search.CONFIG_JSON).unlink(), 2, "no config.json"),
    (lambda p: (p / embed.INDEX_JSON).unlink(), 2, "not a complete index"),
    (
      lambda p: _index(p, rows=(("v1", "zero", 2), ("v1", 1, 3))),
      1,
      "windows.csv:2: not a window",
    ),
    (
      lambda p: (p / embed.WINDOWS).write_text(
        "clip,start,end\nv,0,1\nv,1,2\n"
      ),
      1,
      "windows.csv:2: no column 'video'",
    ),
    (
      lambda p: (p / embed.WINDOWS).write_text("video,start,end\nv,0,1\nv,1\n"),
      1,
      "windows.csv:3: not a window",
    ),
    (
      lambda p: _index(p, rows=(("v1", 0, 2), ("../../etc", 1, 3))),
      1,
      "'../../etc' is not a video id",
    ),
    (lambda p: np.save(p / embed.EMBEDDINGS, np.zeros(2)), 1, "float64[2]"),
  ],
)
def test_a_damaged_index_is_named(tmp_path, capsys, damage, code, said):
  index = _index(tmp_path / "index")
  damage(index)
  got, err = _main(capsys, index, "a query")
  assert got == code and said in err, err


def test_a_moved_index_finds_its_own_chunks_or_says_the_store_is_gone(
  tmp_path, capsys
):
  index = search.Index(_index(tmp_path / "index"))
  with pytest.raises(errors.PathError, match="its chunk store .* is gone"):
    _ = index.store
  code, err = _main(capsys, index.path, "q", "--html", tmp_path / "p.html")
  assert code == errors.EXIT_USAGE and "is gone" in err
  chunks = index.path / embed.CHUNKS  # Moved with the index: found there.
  chunks.mkdir()
  (chunks / "manifest.jsonl").write_text("")
  assert index.store == str(chunks)


def test_an_output_that_cannot_be_written_exits_74(
  tmp_path, capsys, monkeypatch
):
  index = _index(tmp_path / "index")
  hits = [[search.Hit(0, "v1", 0.0, 2.0, 0.5)]]
  monkeypatch.setattr(search.Index, "query", lambda *a: hits)
  monkeypatch.setattr(search.Index, "store", str(tmp_path))

  def full(*args):
    raise OSError(28, "No space left on device", str(args[-1]))

  monkeypatch.setattr(search, "write_html", full)
  code, err = _main(capsys, index, "q", "--html", tmp_path / "p.html")
  assert code == errors.EXIT_WRITE_FAILED, err
  assert f"--html: could not write {tmp_path / 'p.html'}: No space" in err


def test_a_hit_links_to_its_moment_relative_to_the_page(tmp_path):
  store = tmp_path / "store"
  store.mkdir()
  source = tmp_path / "my videos" / "trip.mp4"
  source.parent.mkdir()
  source.write_bytes(b"")
  (store / "manifest.jsonl").write_text(
    json.dumps({"video_id": "trip", "chunk_seconds": 15, "source": str(source)})
    + "\n"
    + json.dumps({"video_id": "gone", "chunk_seconds": 15, "source": "/x.mp4"})
    + "\n"
  )
  index = search.Index(_index(tmp_path / "index", store=store))
  page = tmp_path / "pages"
  page.mkdir()
  hit = search.Hit(0, "trip", 32.5, 34.5, 0.3)
  assert (
    search.moment_link(index, hit, page) == "../my%20videos/trip.mp4#t=32.5"
  )
  # The source gone: the chunk holding the start, at the offset in it.
  hit = search.Hit(0, "gone", 32.5, 34.5, 0.3)
  assert search.moment_link(index, hit, page) == "../store/gone/30.mp4#t=2.5"
