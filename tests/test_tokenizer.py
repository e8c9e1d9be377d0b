"""Tests for vidjax.data.tokenizer on a tiny BPE vocabulary and on CLIP's,
which vidjax ships."""

import gzip
import hashlib
import pathlib
import pickle
import sys

import numpy as np
import pytest

from vidjax.data import tokenizer
from vidjax.data.tokenizer import Tokenizer

MERGES = [
  "t h",
  "th e</w>",
  "a n",
  "an d</w>",
  "c a",
  "ca t</w>",
  "d o",
  "do g</w>",
]


def _write_vocab(path, merges=MERGES):
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("#version: 0.2 - tiny test vocabulary\n" + "\n".join(merges) + "\n")
  return path


@pytest.fixture
def tok(tmp_path):
  return Tokenizer(_write_vocab(tmp_path / "vocab.txt.gz"))


def _byte_id(ch: str, end_of_word: bool = False) -> int:
  # Printable ASCII from '!' comes first in CLIP's byte order.
  return ord(ch) - ord("!") + (256 if end_of_word else 0)


def test_vocab_size_and_special_ids(tok):
  assert tok.vocab_size == 512 + len(MERGES) + 2
  assert (tok.start_id, tok.end_id) == (520, 521)


def test_merges_give_word_ids_and_unknown_words_fall_back_to_bytes(tok):
  assert tok.encode("the cat") == [
    513,
    517,
  ]  # 512 + merge rank of 'the</w>', 'cat</w>'
  assert tok.encode("zq") == [_byte_id("z"), _byte_id("q", True)]
  assert tok.encode("") == []


def test_lower_cases_unescapes_html_and_cleans_whitespace(tok):
  assert tok.encode("  The\tCAT&amp;dog \n") == tok.encode("the cat & dog")
  assert tok.encode("the cat&dog") == [513, 517, _byte_id("&", True), 519]


def test_merge_rank_decides_order(tmp_path):
  # 'b c</w>' outranks 'a b', so 'abc' becomes a + bc</w>, not ab + c</w>.
  tok = Tokenizer(_write_vocab(tmp_path / "v.gz", ["b c</w>", "a b"]))
  assert tok.encode("abc") == [_byte_id("a"), 512]
  tok = Tokenizer(_write_vocab(tmp_path / "w.gz", ["a b", "b c</w>"]))
  assert tok.encode("abc") == [512, _byte_id("c", True)]


def test_pre_tokenisation_splits_digits_punctuation_and_contractions(tok):
  pieces = [tok.decode([i]) for i in tok.encode("it's 42!?")]
  # 'it' | "'s" | '4' | '2' | '!?', each split into bytes by the tiny vocabulary.
  assert pieces == ["i", "t ", "'", "s ", "4 ", "2 ", "!", "? "]


@pytest.mark.parametrize(
  "text", ["the cat and the dog !", "café über 東京 ok", "zebra 1 2 3"]
)
def test_round_trip(tok, text):
  assert tok.decode(tok.encode(text)).strip() == text
  assert tok.decode(tok(text)[0]).strip() == text


def test_call_pads_with_zero_and_marks_start_and_end(tok):
  rows = tok(["the cat", "dog"])
  assert rows.shape == (2, 77) and rows.dtype == np.int32
  np.testing.assert_array_equal(rows[0, :4], [520, 513, 517, 521])
  assert not rows[0, 4:].any()
  np.testing.assert_array_equal(rows[1, :3], [520, 519, 521])
  assert tok("the").shape == (1, 77)


def test_truncation_keeps_end_token_last(tok):
  row = tok(" ".join(["cat"] * 200))[0]
  assert row[0] == 520 and row[-1] == 521
  assert np.all(row[1:-1] == 517)


def test_context_length(tmp_path):
  tok = Tokenizer(_write_vocab(tmp_path / "v.gz"), context_length=5)
  np.testing.assert_array_equal(
    tok("the cat and the dog"), [[520, 513, 517, 515, 521]]
  )
  np.testing.assert_array_equal(tok("cat"), [[520, 517, 521, 0, 0]])


def test_decode_stops_at_end_token_and_checks_ids(tok):
  assert tok.decode([520, 513, 521, 517, 0, 0]) == "the "
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode([10_000])


def test_pickles_for_grain_workers(tok):
  clone = pickle.loads(pickle.dumps(tok))
  np.testing.assert_array_equal(
    clone(["the dog", "zq"]), tok(["the dog", "zq"])
  )


def test_bad_vocabulary_files_name_the_file(tmp_path):
  bad = tmp_path / "bad.gz"
  with gzip.open(bad, "wt") as f:
    f.write("#version\nt h\nthree parts here\n")
  with pytest.raises(ValueError, match=r"bad\.gz:3: expected a merge"):
    Tokenizer(bad)
  plain = tmp_path / "plain.txt"
  plain.write_text("#version\nt h\n")
  with pytest.raises(ValueError, match="plain.txt: cannot read a gzip"):
    Tokenizer(plain)


def test_fix_text_true_needs_ftfy(tmp_path):
  try:
    import ftfy  # noqa: F401

    pytest.skip("ftfy is installed")
  except ImportError:
    pass
  with pytest.raises(ImportError, match="ftfy"):
    Tokenizer(_write_vocab(tmp_path / "v.gz"), fix_text=True)


PARITY_TEXTS = [
  "a photo of a cat",
  "#c c picks up the knife from the chopping board.",
  "he's washing 3 plates &amp; 12 cups, isn't he?",
  "café crème brûlée — 東京 タワー 😀 naïve",
  "   tabs\tand\nnewlines   ",
  "C Opens The FRIDGE",
  " ".join(["long narration"] * 60),
  "",
]


@pytest.mark.parity
def test_parity_with_open_clip():
  open_clip = pytest.importorskip("open_clip")
  vocab = (
    pathlib.Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
  )
  if not vocab.exists():
    pytest.skip(f"{vocab} not shipped with this open_clip")
  tok = Tokenizer(vocab)
  assert (tok.vocab_size, tok.start_id, tok.end_id) == (49408, 49406, 49407)
  theirs = open_clip.tokenize(PARITY_TEXTS).numpy()
  ours = tok(PARITY_TEXTS)
  # Some open_clip versions skip lower-casing; compare mixed case only if it lower-cases.
  lowers = (open_clip.tokenize(["CAT"]) == open_clip.tokenize(["cat"])).all()
  rows = [i for i, t in enumerate(PARITY_TEXTS) if lowers or t == t.lower()]
  np.testing.assert_array_equal(ours[rows], theirs[rows])


def test_clip_vocabulary_ships_with_vidjax_without_torch(monkeypatch):
  # `pip install -e .` alone: OpenCLIP, OpenAI's clip and torch blocked.
  for name in ("open_clip", "clip", "torch"):
    monkeypatch.setitem(sys.modules, name, None)
  path = tokenizer.find_clip_vocab()
  assert path == tokenizer.SHIPPED_VOCAB
  blob = pathlib.Path(path).read_bytes()
  assert len(blob) == 1_356_917  # OpenAI's file, as OpenCLIP's wheel has it.
  assert hashlib.sha256(blob).hexdigest().startswith("924691ac288e5440")
  assert (
    "Copyright (c) 2021 OpenAI"
    in (pathlib.Path(path).parent / "LICENSE").read_text()
  )
  tok = Tokenizer(path)
  assert (tok.vocab_size, tok.start_id, tok.end_id) == (49408, 49406, 49407)
  # CLIP's README: clip.tokenize("a diagram") -> 49406, 320, 22697, 49407.
  assert tok(["a diagram"])[0, :5].tolist() == [49406, 320, 22697, 49407, 0]
