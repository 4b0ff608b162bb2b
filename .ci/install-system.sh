#!/usr/bin/env bash
# System packages the tests need (tmux for --detach). Installs only what is missing.
set -euo pipefail
if ! command -v tmux >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq tmux >/dev/null
  else
    echo "tmux is missing: install it (apt-get install tmux) for pp3 --detach and its test" >&2
  fi
fi
