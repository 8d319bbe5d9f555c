#!/usr/bin/env bash
# The device check: rlrunner's GPU path measured and run end to end on random-weight models, nothing downloaded.
#
#   bash bench/gpu_check.sh                   # one GPU, real sizes, <= 8 minutes on an 80-141 GB GPU
#   bash bench/gpu_check.sh --skip-qwen       # skip a part: --skip-sd3 --skip-runner --skip-qwen --skip-wan
#   bash bench/gpu_check.sh --tiny            # the same code on CPU with tiny folders: checks the script (CI)
#   bash bench/gpu_check.sh --help            # every option
#
# Parts (bench/gpu_parts.py, one process each: a failing part is recorded in the table and the next one runs):
#   sd3     SD3.5-Medium (sd3_nft_ocr): a group of 10-step DPM-Solver++ rollouts at 512 px + decode, NFT steps
#   runner  sd3_nft_ocr through the launcher on one GPU: 2 steps, eval + checkpoint at step 2, resume to step 3
#   qwen    qwen_image_nft_ocr (fsdp2, enable_offload, --qwen-layers of its 60 blocks), the same way
#   wan     Wan2.2 TI2V-5B as an image (1 frame) and a video (5 frames) model: rollouts + NFT steps
# Model folders come from bench/gpu_folders.py (bench/model_configs/ at real size; text encoders one layer deep).
# Prints one table (images/GPU/s, s/step, peak GiB per part; for the launched runs the peak plan --simulate
# predicts beside it) and writes logs/gpu_check-<time>/gpu_check.json;
# exits 1 if any part failed. Run it with a CUDA build of torch active, or PYTHON=/path/to/python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
cd "$ROOT"
exec "$PY" "$ROOT/bench/gpu_check.py" "$@"
