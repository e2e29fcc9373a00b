#!/usr/bin/env bash
# The docs site: the reference pages generated from the code, then MkDocs with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
python docs/generate.py
mkdocs build --strict --site-dir "${1:-site}"
