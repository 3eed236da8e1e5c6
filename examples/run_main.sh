#!/usr/bin/env bash
# The main job (README): sets up .venv, builds the op library, then trains a streaming RNN-T on
# the committed spoken-digit set with FlashRNNTLoss (CPU defaults, ~15 min on 2 cores), reports
# held-out WER and exports a streaming SavedModel to runs/speech/. Extra args go to train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
exec "$VENV/bin/python" examples/speech/train.py --out runs/speech "$@"
