#!/usr/bin/env bash
# Make room in the device call's 64 MiB: the committed receipts (59 MB at the end of
# 2026-12-01, growing ~2 MB per qualification; past the limit with anything else carried, so
# every call now needs this) travel with every call, though only a call that supersedes one
# needs that one. Run here, from the repository root, before and after a device call:
#
#   bash bench/receipts_aside.sh out [RECEIPT.json ...]   # keep MANIFEST.jsonl and these
#   bash bench/receipts_aside.sh back                     # restore the rest
#   bash bench/receipts_aside.sh take FILES_AT            # a device call's returned receipts
#
# `out` moves every other receipts/*.json to $PP3_ASIDE (default /tmp/pp3-receipts-aside);
# `back` moves them home without overwriting anything (a name already in receipts/ stays
# where it is and the script fails). MANIFEST.jsonl always stays: a new receipt's manifest
# line chains to its last line. git_state ignores receipts/, so a receipt made while the
# others are aside is not marked dirty. Nothing is deleted.
# `take` unpacks FILES_AT/receipts.tar.part* (bench/device_session.sh writes them), checks
# that the local manifest is a prefix of the returned one and that every file the new lines
# name came back, then copies the receipts and the manifest into receipts/ (never over an
# existing receipt).
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
  take)
    from=${2:?usage: take FILES_AT}
    back=$(mktemp -d)
    cat "$from"/receipts.tar.part* | tar -x -C "$back"
    lines=$(wc -l <receipts/MANIFEST.jsonl)
    head -n "$lines" "$back/MANIFEST.jsonl" | cmp -s - receipts/MANIFEST.jsonl \
      || { echo "the returned manifest does not extend receipts/MANIFEST.jsonl" >&2; exit 1; }
    tail -n +"$((lines + 1))" "$back/MANIFEST.jsonl" \
      | python3 -c 'import json, sys; [print(json.loads(line)["file"]) for line in sys.stdin]' \
      >"$back/.names"
    while read -r name; do
      [ -f "$back/$name" ] || { echo "$name is in the manifest but did not come back" >&2; exit 1; }
      [ -e "receipts/$name" ] && { echo "receipts/$name exists already" >&2; exit 1; }
    done <"$back/.names"
    while read -r name; do cp "$back/$name" receipts/; done <"$back/.names"
    cp "$back/MANIFEST.jsonl" receipts/MANIFEST.jsonl
    echo "took $(wc -l <"$back/.names") receipts: $(tr '\n' ' ' <"$back/.names")" ;;
  *) echo "usage: bash bench/receipts_aside.sh out [RECEIPT.json ...] | back | take FILES_AT" >&2
     exit 2 ;;
esac
