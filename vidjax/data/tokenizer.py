"""CLIP's byte-level BPE tokenizer, loaded from a local vocabulary file.

Gives the same ids as OpenAI CLIP's `SimpleTokenizer` and OpenCLIP's
`tokenize` on the same vocabulary: text is cleaned (ftfy when installed, HTML
unescaping, whitespace collapsing), lower-cased, split with CLIP's regex,
mapped to byte-level symbols and merged by BPE rank. Rows are
`[start] + tokens + [end]`, padded with 0; rows too long are cut to the
context length with the end token kept last, as OpenCLIP does.

The vocabulary is the `bpe_simple_vocab_16e6.txt.gz` format: gzip text, one
header line, then one merge (`a b`) per line. Only the first
`49152 - 256 - 2` merges are used, as CLIP does, giving 49408 ids with the
start and end tokens at 49406 and 49407. Nothing is downloaded: vidjax
ships CLIP's file (`vidjax/data/vocab/`, OpenAI's MIT license beside it,
`SHIPPED_VOCAB`), byte for byte the one OpenCLIP's wheel ships.

ftfy (optional; OpenCLIP depends on it) is used when importable, as CLIP
does. It repairs mojibake ('fÃ¼r' -> 'für'), straightens curly quotes
('it’s' -> "it's"), expands ligatures and full-width letters and applies NFC;
without it, only text containing such characters tokenizes differently from
CLIP. `fix_text=False` skips it (faster, and the same on any machine).
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import gzip
import html
import importlib.util
import os

import numpy as np
import regex

from vidjax.base import errors
from vidjax.config import defaults

# CLIP keeps the first 49152 - 256 - 2 merges of the file.
NUM_MERGES = 49152 - 256 - 2
CLIP_VOCAB_FILE = "bpe_simple_vocab_16e6.txt.gz"
# CLIP's vocabulary as vidjax ships it (package data, with its license).
SHIPPED_VOCAB = os.path.join(
  os.path.dirname(__file__), "vocab", CLIP_VOCAB_FILE
)
# Installed packages that ship CLIP's vocabulary next to their code: where
# it is looked for if vidjax's own copy is missing (a trimmed install).
VOCAB_PACKAGES = ("open_clip", "clip")
START_TOKEN = "<|startoftext|>"
END_TOKEN = "<|endoftext|>"

# CLIP's pre-tokenisation: special tokens, English contractions, runs of
# letters, single digits, runs of other non-space symbols.
_SPLIT = regex.compile(
  r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d"""
  r"""|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
  regex.IGNORECASE,
)
_WHITESPACE = regex.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
  """A reversible byte -> printable character map (GPT-2/CLIP's).

  Printable Latin-1 bytes map to themselves; the other 68 bytes (control,
  space, ...) map to characters from 256 up, in byte order, so BPE symbols
  never contain whitespace.
  """
  printable = (
    list(range(ord("!"), ord("~") + 1))
    + list(range(ord("¡"), ord("¬") + 1))
    + list(range(ord("®"), ord("ÿ") + 1))
  )
  # Insertion order fixes the ids: printable bytes first, then the rest.
  table = {b: chr(b) for b in printable}
  for b in range(256):
    if b not in table:
      table[b] = chr(256 + len(table) - len(printable))
  return table


@functools.lru_cache(maxsize=1)
def _ftfy_fix_text():
  """ftfy's `fix_text`, or None; imported on first use since it is optional."""
  try:
    import ftfy
  except ImportError:
    return None
  return ftfy.fix_text


def _load_merges(
  vocab_path: str | os.PathLike, num_merges: int
) -> list[tuple[str, str]]:
  try:
    with gzip.open(vocab_path, "rt", encoding="utf-8") as f:
      lines = f.read().split("\n")
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise errors.DataFileError(
      f"{vocab_path}: cannot read a gzip BPE vocabulary ({e})"
    ) from e
  # CLIP's header: '"bpe_simple_vocab_16e6.txt#version: 0.2'.
  if "#version" not in lines[0]:
    raise errors.DataFileError(
      f"{vocab_path}:1: "
      + (
        "an empty file"
        if lines == [""]
        else f"{lines[0][:40]!r} is not a header line"
      )
      + f": expected a BPE vocabulary such as CLIP's {CLIP_VOCAB_FILE} "
      "(a '#version' header, then one merge 'a b' per line)"
    )
  merges = []
  for line_no, line in enumerate(lines[1 : num_merges + 1], start=2):
    parts = line.split()
    if not parts:  # Trailing newline at the end of a short file.
      continue
    if len(parts) != 2:
      raise errors.DataFileError(
        f'{vocab_path}:{line_no}: expected a merge "a b", got {line!r}'
      )
    merges.append((parts[0], parts[1]))
  if not merges:
    raise errors.DataFileError(
      f"{vocab_path}: no merges after the header line: expected one merge "
      f"'a b' per line, as in CLIP's {CLIP_VOCAB_FILE} (262145 lines)"
    )
  return merges


def find_clip_vocab() -> str | None:
  """CLIP's `bpe_simple_vocab_16e6.txt.gz`: vidjax's own (`SHIPPED_VOCAB`),
  else an installed package's, or None.

  OpenCLIP and OpenAI's `clip` ship the file too; they are located without
  being imported (no torch import).
  """
  if os.path.isfile(SHIPPED_VOCAB):
    return SHIPPED_VOCAB
  for package in VOCAB_PACKAGES:
    try:
      spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
      continue
    for folder in (spec.submodule_search_locations or []) if spec else []:
      path = os.path.join(folder, CLIP_VOCAB_FILE)
      if os.path.isfile(path):
        return path
  return None


class Tokenizer:
  """CLIP BPE tokenizer.

  Args:
    vocab_path: the gzip merges file (bpe_simple_vocab_16e6.txt.gz format).
    context_length: tokens per row, start and end tokens included.
    fix_text: clean text with ftfy (see the module note). None: when ftfy is
      installed; True: require it; False: never.

  Attributes:
    vocab_size: number of ids (`defaults.VOCAB_SIZE` for CLIP's vocabulary).
    start_id: id of the start-of-text token.
    end_id: id of the end-of-text token.
  """

  def __init__(
    self,
    vocab_path: str | os.PathLike,
    context_length: int = defaults.CONTEXT_LENGTH,
    fix_text: bool | None = None,
  ):
    if context_length < 2:
      raise ValueError(f"context_length must be >= 2, got {context_length}")
    if fix_text and _ftfy_fix_text() is None:
      raise ImportError("fix_text=True needs ftfy (pip install ftfy)")
    self.context_length = context_length
    self._fix_text = fix_text
    merges = _load_merges(vocab_path, NUM_MERGES)
    self._byte_encoder = _bytes_to_unicode()
    self._byte_decoder = {c: b for b, c in self._byte_encoder.items()}
    # Ids: 256 byte symbols, the same with the end-of-word mark, one per
    # merge, then the two special tokens.
    symbols = list(self._byte_encoder.values())
    vocab = symbols + [s + "</w>" for s in symbols]
    vocab += [a + b for a, b in merges] + [START_TOKEN, END_TOKEN]
    self._encoder = {token: i for i, token in enumerate(vocab)}
    self._decoder = dict(enumerate(vocab))
    self._ranks = {merge: i for i, merge in enumerate(merges)}
    self._cache = {START_TOKEN: (START_TOKEN,), END_TOKEN: (END_TOKEN,)}
    self.vocab_size = len(vocab)
    self.start_id = self._encoder[START_TOKEN]
    self.end_id = self._encoder[END_TOKEN]

  def _clean(self, text: str) -> str:
    fix = None if self._fix_text is False else _ftfy_fix_text()
    if fix is not None:
      text = fix(text)
    text = html.unescape(html.unescape(text)).strip()
    return _WHITESPACE.sub(" ", text).strip().lower()

  def _bpe(self, token: str) -> tuple[str, ...]:
    """Merges a word's byte symbols by rank, lowest rank first."""
    cached = self._cache.get(token)
    if cached is not None:
      return cached
    word = list(token[:-1]) + [token[-1] + "</w>"]
    while len(word) > 1:
      pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
      best = min(pairs, key=lambda p: self._ranks.get(p, float("inf")))
      if best not in self._ranks:
        break
      merged, i = [], 0
      while i < len(word):  # Merge every occurrence, left to right.
        if i < len(word) - 1 and (word[i], word[i + 1]) == best:
          merged.append(word[i] + word[i + 1])
          i += 2
        else:
          merged.append(word[i])
          i += 1
      word = merged
    result = tuple(word)
    if len(self._cache) < 200_000:  # Bounded: narrations have few words.
      self._cache[token] = result
    return result

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without start/end tokens or padding."""
    ids = []
    for piece in _SPLIT.findall(self._clean(text)):
      symbols = "".join(self._byte_encoder[b] for b in piece.encode("utf-8"))
      ids.extend(self._encoder[s] for s in self._bpe(symbols))
    return ids

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of `ids`, without special tokens and padding (0s after the end).

    Words come back lower-cased and separated by single spaces, with a space
    after each word (CLIP's decoding); invalid UTF-8 becomes U+FFFD.
    """
    symbols = []
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == self.end_id:
        break
      if i == self.start_id:
        continue
      if not 0 <= i < self.vocab_size:
        raise ValueError(
          f"token id {i} is outside the vocabulary (size {self.vocab_size})"
        )
      symbols.append(self._decoder[i])
    data = bytearray(self._byte_decoder[c] for c in "".join(symbols))
    return data.decode("utf-8", errors="replace").replace("</w>", " ")

  def __call__(self, texts: str | Sequence[str]) -> np.ndarray:
    """Tokenizes text(s) into fixed-length rows.

    Args:
      texts: a string or a sequence of strings.

    Returns:
      `int32[B, context_length]`: start token, tokens, end token, zeros. A row
      too long is truncated with its last entry set to the end token.
    """
    if isinstance(texts, str):
      texts = [texts]
    out = np.zeros((len(texts), self.context_length), np.int32)
    for row, text in enumerate(texts):
      ids = [self.start_id] + self.encode(text) + [self.end_id]
      if len(ids) > self.context_length:
        ids = ids[: self.context_length]
        ids[-1] = self.end_id
      out[row, : len(ids)] = ids
    return out
