#!/usr/bin/env bash
# POST /render as multipart/form-data: the picture and the speech track uploaded as files.
#
#   examples/requests/render-multipart.sh [POD_URL]   # default $POD_URL, else http://127.0.0.1:8080
#
# Environment (all optional): IMAGE, AUDIO (files to upload; default examples/media/face.png and
# speech.wav), FIT (cover|contain|exact, default cover), SEED (default 0), OUT (default
# render-multipart.mp4). The fragmented MP4 is written to OUT.part as it streams in (it plays
# while it arrives) and renamed to OUT once complete; then the pod's X-Build-Id and X-Compiles
# headers are printed (X-Compiles must be 0). A refusal prints the pod's JSON error ({"error":
# CODE, "message": ...}) and exits 1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
url="${1:-${POD_URL:-http://127.0.0.1:8080}}"
image="${IMAGE:-$here/../media/face.png}"
audio="${AUDIO:-$here/../media/speech.wav}"
fit="${FIT:-cover}"
seed="${SEED:-0}"
out="${OUT:-render-multipart.mp4}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Files go as the form fields `image` and `audio`; fit and seed as text fields (the pod reads
# `seconds` too, but only when no audio is sent).
status="$(curl -sS -X POST "${url%/}/render" -F "image=@$image" -F "audio=@$audio" -F "fit=$fit" \
    -F "seed=$seed" -D "$work/headers" -o "$out.part" -w '%{http_code}')"
if [ "$status" != 200 ]; then
    echo "render refused: HTTP $status" >&2
    cat "$out.part" >&2; echo >&2
    rm -f "$out.part"
    exit 1
fi
mv "$out.part" "$out"
header() { grep -i "^$1:" "$work/headers" | head -n 1 | cut -d: -f2- | tr -d ' \r'; }
echo "wrote $out ($(wc -c < "$out" | tr -d ' ') bytes)"
echo "X-Build-Id: $(header X-Build-Id)"
echo "X-Compiles: $(header X-Compiles)"
