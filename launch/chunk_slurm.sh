#!/usr/bin/env bash
# Chunk a corpus on many machines under SLURM: a job array, one shard of the
# sources per array task, every task chunking its own videos side by side.
#
#   sbatch --array=1-8 launch/chunk_slurm.sh SRC DST [chunk options ...]
#   sbatch --array=1-8 launch/chunk_slurm.sh /data/ego4d/v1/full_scale /data/ego4d_chunks
#
# Task K of an array of N runs
#   python -m vidjax.data.chunk SRC DST --shard K/N --workers CPUS [options]
# (K counts from 1 whatever the array's first index; N is the array's size):
# the sources are split into N shards of about equal bytes, the same split on
# every node, and each task writes only its own part, DST/shards/K-of-N/,
# and the chunk folders of its own videos. SRC and DST must be on a file
# system every node sees. Readers (training, --status) see the union of the
# parts at once; when all are finished, join them into DST/manifest.jsonl:
#
#   python -m vidjax.data.chunk --status DST   # done/total, hours, failures, ETA
#   python -m vidjax.data.chunk --merge DST    # refuses gaps and duplicates
#
# Resuming: submit the same array again (or only the tasks that did not end
# with exit 0 or 1: sbatch --array=3,5 ...); each shard skips its finished
# videos and redoes the one it was killed in. A task of a job whose node died
# is locked out of its shard for 5 minutes after that job's last heartbeat
# (on the same node, at once). The job gets SIGTERM at its time limit: the
# videos under way are redone next time, nothing else is lost.
#
# Resources: a shard is CPU-bound (decode, scale, x264: no GPU), one video
# per CPU (--workers = the task's CPUs, one thread each). A worker chunking
# 1080p peaked at 0.11 GB resident; 1 GB per CPU leaves room for 4K sources.
# With N machines of 16 cores, Ego4D (~3,670 h) takes about the hours
# BENCHMARKS.md gives for N machines (python -m benchmarks.chunk). Edit the
# header for your cluster; options given to sbatch on the command line win.
#SBATCH --job-name=vidjax-chunk
#SBATCH --array=1-8
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH --mem-per-cpu=1G
#SBATCH --time=12:00:00
#SBATCH --output=%x-%A_%a.out
##SBATCH --partition=cpu
##SBATCH --account=my-account
set -euo pipefail

if [[ $# -lt 2 || "$1" == -* ]]; then
  echo "usage: sbatch --array=1-N $0 SRC DST [python -m vidjax.data.chunk options ...]" >&2
  exit 2
fi
if [[ -z "${SLURM_ARRAY_TASK_ID:-}" ]]; then
  echo "$0: not in a SLURM job array (sbatch --array=1-N ...); on one machine run:" >&2
  echo "  python -m vidjax.data.chunk $1 $2 --workers \$(nproc)" >&2
  exit 2
fi
src=$1
dst=$2
shift 2

# sbatch runs a copy of this script from its spool directory: find the
# repository from where the job was submitted (a clone without pip install).
repo=${VIDJAX_REPO:-${SLURM_SUBMIT_DIR:-.}}
if [[ -f "${repo}/vidjax/data/chunk/cli.py" ]]; then
  export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
fi

k=$((SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-1} + 1))
n=${SLURM_ARRAY_TASK_COUNT:?SLURM_ARRAY_TASK_COUNT unset: SLURM 18.08 or newer}
workers=${SLURM_CPUS_PER_TASK:-$(nproc)}
echo "vidjax-chunk: shard ${k}/${n} on $(hostname), ${workers} workers" >&2
# exec: SLURM's SIGTERM reaches Python, which releases the shard's lock.
exec "${PYTHON:-python}" -m vidjax.data.chunk "${src}" "${dst}" \
  --shard "${k}/${n}" --workers "${workers}" "$@"
