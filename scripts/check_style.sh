#!/usr/bin/env bash
# Style checks of the tracked sources (tools pinned in scripts/setup_env.sh): ruff's linter for
# Python, clang-format for C++/CUDA. Exit status non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
"$BIN/ruff" check --no-cache $(git ls-files '*.py')
git ls-files 'custom_ops/*.cc' 'custom_ops/*.h' 'custom_ops/*.cu' 'custom_ops/*.cuh' \
  | xargs "$BIN/clang-format" --dry-run --Werror
echo "style: ruff check and clang-format clean"
