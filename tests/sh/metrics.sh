#!/usr/bin/env bash
# budget: 10 s; checks: 2
# The load figures add up: the text encoder's load and the transformer's are
# reported apart (summary and --json-metrics), each byte count equals what
# `tpgen inspect` says the ranks hold, and each GB/s is its bytes over its
# reading seconds, in the JSON and on the printed lines.
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/m
"$TPGEN" make-tiny --out "$M" --seed 1 >/dev/null 2>&1 || fail "metrics: make-tiny"
out=$($MPIRUN -np 2 "$TPGEN" --model "$M" --prompt "a fox" --width 64 --height 64 --steps 2 --backend cpu \
      --output "$TMP/a.png" --json-metrics "$TMP/m.json" 2>&1) || fail "metrics: generate: $(echo "$out" | tail -2)"
for c in transformer text_encoder; do
    "$TPGEN" inspect --model "$M" --component $c --tp 2 --json >"$TMP/$c.json" 2>/dev/null || fail "metrics: inspect $c"
done
res=$(python3 - "$TMP" <<'PY'
import json, sys, re
d = sys.argv[1]
m = json.load(open(f"{d}/m.json"))
held = {c: sum(r["weight_bytes"] for r in json.load(open(f"{d}/{c}.json"))["ranks"]) for c in ("transformer", "text_encoder")}
bad = []
if m["bytes_loaded"] != held["transformer"]: bad.append(f"transformer bytes {m['bytes_loaded']} != inspect {held['transformer']}")
if m["text_encoder_bytes_loaded"] != held["text_encoder"]:
    bad.append(f"text encoder bytes {m['text_encoder_bytes_loaded']} != inspect {held['text_encoder']}")
for b, s, r in (("bytes_loaded", "load_read_seconds", "load_gb_per_s"),
                ("text_encoder_bytes_loaded", "text_encoder_read_seconds", "text_encoder_gb_per_s")):
    want = m[b] / 1e9 / m[s]
    if not m[s] > 0 or abs(m[r] - want) > 1e-4 * want: bad.append(f"{r} {m[r]} != {m[b]} B / {m[s]} s = {want}")
if "text_encoder_load" not in m["seconds"]: bad.append("no text_encoder_load phase")
print("; ".join(bad) or "ok")
PY
)
[ "$res" = ok ] && ok "metrics: JSON load figures add up (bytes = inspect's per-rank sum, GB/s = bytes / read seconds)" ||
    fail "metrics: $res"
# the printed lines: "X GB read by N ranks in S s, R GB/s" recomputed from the printed numbers
lines=$(echo "$out" | grep -E '(te load|load) .* GB read by 2 ranks in')
n=$(echo "$lines" | grep -c .)
bad=$(echo "$lines" | sed -E 's/.* ([0-9.e+-]+) GB read by [0-9]+ ranks in ([0-9.e+-]+) s, ([0-9.e+-]+) GB\/s.*/\1 \2 \3/' |
      awk '{ r = $1 / $2; if (r - $3 > 0.006 + 0.02 * r || $3 - r > 0.006 + 0.02 * r) print }')
[ "$n" = 2 ] && [ -z "$bad" ] && ok "metrics: the text-encoder and transformer load lines add up" ||
    fail "metrics: $n load lines, inconsistent: $bad; $(echo "$out" | grep -E 'load')"
