#!/usr/bin/env bash
# The installed size of the package with each extra: the wheel built from this
# checkout, installed with `uv pip install` into a fresh venv per extra (the package
# registries give the dependencies), then `du -sh` of that venv's site-packages.
# Prints a Markdown table. Usage: benchmarks/extra_sizes.sh [EXTRA ...]
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python="$(uv run --frozen python -c 'import sys; print(sys.executable)')"
uv build --quiet --wheel --out-dir "$work/dist" .
wheel="$(ls "$work"/dist/*.whl)"
extras=("$@")
[ ${#extras[@]} -gt 0 ] || extras=(base cli server local eval docs redis milvus)
echo "| install | site-packages | packages |"
echo "| --- | ---: | ---: |"
for extra in "${extras[@]}"; do
  venv="$work/venv-$extra"
  uv venv --quiet --python "$python" "$venv"
  target="$wheel"
  [ "$extra" = base ] || target="$wheel[$extra]"
  # --link-mode copy: the files themselves, not links into uv's cache
  uv pip install --quiet --link-mode copy --python "$venv/bin/python" "$target"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  count="$(uv pip list --python "$venv/bin/python" 2>/dev/null | tail -n +3 | wc -l)"
  label="llama-index-hyde-plus"
  [ "$extra" = base ] || label="llama-index-hyde-plus[$extra]"
  echo "| \`$label\` | $(du -sh "$site" | cut -f1) | $count |"
  rm -rf "$venv"
done
