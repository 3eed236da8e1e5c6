#!/usr/bin/env bash
# The test command (README): sets up .venv and builds the op library (scripts/setup_env.sh),
# checks that `pip install --no-build-isolation .` builds and loads and that an isolated
# `pip install .` stops at once with that command, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
bash scripts/check_style.sh
scratch=$(mktemp -d)
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps --target "$scratch" .
(cd "$scratch" && PYTHONPATH="$scratch" "$OLDPWD/$VENV/bin/python" -c \
  "import tf_rnnt; assert tf_rnnt.library_available(), 'installed op library does not load'; print('pip install --no-build-isolation . OK:', tf_rnnt.__file__, tf_rnnt.build_info())")
if "$VENV/bin/python" -m pip install --no-deps --target "$scratch/isolated" . >"$scratch/isolated.log" 2>&1 ||
   ! grep -q "pip install --no-build-isolation \." "$scratch/isolated.log"; then
  cat "$scratch/isolated.log"; echo "isolated pip install . did not stop with the working command" >&2; exit 1
fi
echo "isolated pip install . stops with the working command: OK"
rm -rf "$scratch"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
