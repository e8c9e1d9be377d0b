"""The chunker: long videos -> short constant-rate H.264 chunks + a manifest.

    python -m vidjax.data.chunk SRC DST [options]     (`cli`; --help)

A chunk store:

    DST/<video_id>/<start_second>.mp4   the chunks of each video (`encode`)
    DST/manifest.jsonl                  one line per finished video
    DST/errors.jsonl                    the videos that failed, with why
    DST/shards/<K>-of-<N>/              a shard's own manifest and report

`encode` turns one video into its chunks and manifest entry; `store` runs it
over every video of a source (or of one shard), resumably, in worker
processes; `manifest` says where a store's lines are and reads them (the
union of its parts); `parts` writes a part's report and reads them all
(--status, --merge); `cli` is the command line. The names below are the
package's API.
"""

from vidjax.data.chunk.encode import (
  PROFILES,
  ChunkError,
  ChunkOptions,
  chunk_name,
  chunk_start_frames,
  chunk_video,
  encoding,
  output_size,
  yuv_frame,
  yuv_planes,
)
from vidjax.data.chunk.manifest import (
  ERRORS,
  MANIFEST,
  manifest_files,
  manifest_lines,
  read_manifest,
)
from vidjax.data.chunk.store import chunk_videos, find_videos, sources

__all__ = [
  "ERRORS",
  "MANIFEST",
  "PROFILES",
  "ChunkError",
  "ChunkOptions",
  "chunk_name",
  "chunk_start_frames",
  "chunk_video",
  "chunk_videos",
  "encoding",
  "find_videos",
  "manifest_files",
  "manifest_lines",
  "output_size",
  "read_manifest",
  "sources",
  "yuv_frame",
  "yuv_planes",
]
