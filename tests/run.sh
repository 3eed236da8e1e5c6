#!/usr/bin/env bash
# The test command (README): sets up .venv and builds the op library (scripts/setup_env.sh),
# checks that a regular `pip install .` builds and loads, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
scratch=$(mktemp -d)
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps --target "$scratch" .
(cd "$scratch" && PYTHONPATH="$scratch" "$OLDPWD/$VENV/bin/python" -c \
  "import tf_rnnt, tf_rnnt.ops as o; assert o.library_available(), 'installed op library does not load'; print('pip install . OK:', tf_rnnt.__file__)")
rm -rf "$scratch"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
