#!/usr/bin/env bash
# The test command (README): sets up .venv and builds the op library (scripts/setup_env.sh),
# checks that `pip install --no-build-isolation .` builds and loads and that an isolated
# `pip install .` stops at once with that command, then runs the whole test suite: tests/,
# examples/*/tests and benchmarks/tests. The style check (scripts/check_style.sh) runs first; its
# findings do not stop the tests, but the exit status is non-zero when it or the tests failed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
style_status=0
bash scripts/check_style.sh || style_status=$?
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
test_status=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests examples benchmarks "$@" || test_status=$?
if [ "$style_status" != 0 ]; then
  echo "style check failed (exit status $style_status): its findings are above" >&2
fi
[ "$test_status" = 0 ] || exit "$test_status"
[ "$style_status" = 0 ] || exit 1
