#!/bin/sh
# model.init_from's config.json, one line: "nodir", "noconfig", "unreadable REASON" or
# "ok BASE64", after a "file NAME" line for each entry of the directory. $1 the drafter
# directory. Parsed by orchestrator.plan.init_from.parse_reply.
d=$1
[ -d "$d" ] || { echo nodir; exit 0; }
for f in "$d"/*; do
  [ -e "$f" ] && printf 'file %s\n' "${f##*/}"
done
[ -f "$d/config.json" ] || { echo noconfig; exit 0; }
if b=$(base64 -w0 2>&1 < "$d/config.json"); then
  printf 'ok %s\n' "$b"
else
  printf 'unreadable %s\n' "$(printf '%s' "$b" | tr '\n' ' ')"
fi
