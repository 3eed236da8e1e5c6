#!/usr/bin/env bash
# The speech example (README, docs/speech_example.md): sets up .venv, builds the op library, installs the example's
# requirements, then trains a streaming RNN-T on human speech (Free Spoken Digit Dataset words
# joined into digit strings, one speaker held out) plus the synthesized spoken-digit set with
# FlashRNNTLoss, reports the held-out WER on synthesized strings and on the held-out speaker,
# and exports a streaming SavedModel and the TFLite streaming step to runs/speech/.
# Extra args go to train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
"$VENV/bin/python" -m pip install -q -r examples/speech/requirements.txt
exec "$VENV/bin/python" examples/speech/train.py --out runs/speech --tflite "$@"
