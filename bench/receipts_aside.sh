#!/usr/bin/env bash
# Make room in the device call's 64 MiB: the committed receipts (48 MB on 2026-12-01, growing
# ~2 MB per qualification) travel with every call, though only a call that supersedes one
# needs that one. Run here, from the repository root, before and after a device call:
#
#   bash bench/receipts_aside.sh out [RECEIPT.json ...]   # keep MANIFEST.jsonl and these
#   bash bench/receipts_aside.sh back                     # restore the rest
#
# `out` moves every other receipts/*.json to $PP3_ASIDE (default /tmp/pp3-receipts-aside);
# `back` moves them home without overwriting anything (a name already in receipts/ stays
# where it is and the script fails). MANIFEST.jsonl always stays: a new receipt's manifest
# line chains to its last line. git_state ignores receipts/, so a receipt made while the
# others are aside is not marked dirty. Nothing is deleted.
set -euo pipefail
aside=${PP3_ASIDE:-/tmp/pp3-receipts-aside}
cd "$(dirname "$0")/.."
case ${1:-} in
  out)
    shift
    mkdir -p "$aside"
    moved=0
    for path in receipts/*.json; do
      name=$(basename "$path")
      keep=0
      for wanted in "$@"; do [ "$name" = "$(basename "$wanted")" ] && keep=1; done
      if [ "$keep" = 0 ]; then mv -n "$path" "$aside/"; moved=$((moved + 1)); fi
    done
    echo "moved $moved receipts to $aside; receipts/ now holds $(du -sh receipts | cut -f1)" ;;
  back)
    [ -d "$aside" ] || { echo "nothing aside in $aside"; exit 0; }
    for path in "$aside"/*.json; do
      [ -e "$path" ] || continue
      name=$(basename "$path")
      if [ -e "receipts/$name" ]; then echo "receipts/$name exists: left in $aside" >&2; exit 1; fi
      mv "$path" receipts/
    done
    rmdir "$aside" 2>/dev/null || true
    git status --short receipts ;;
  *) echo "usage: bash bench/receipts_aside.sh out [RECEIPT.json ...] | back" >&2; exit 2 ;;
esac
