#!/usr/bin/env bash
# budget: 5 s; checks: 14
# tpgen inspect of GGUF files: every tensor of tests/data/gguf/types.gguf and
# of the golden flux2-gguf files listed with the type and row-major shape
# that tests/data/gguf/*.json (written from gguf-py) give, the metadata keys,
# and corrupt files refused with a clear message, no crash (also under
# AddressSanitizer + UBSan when build-asan/ exists).
[ -n "${TPGEN_ROOT:-}" ] && [ -n "${TPGEN:-}" ] && [ -n "${TPGEN_GOLDEN:-}" ] || { echo "FAIL - gguf.sh: run it through tests/run.sh"; exit 1; }
. "$TPGEN_ROOT/tests/lib.sh"
[ -d "$TMP" ] || { echo "FAIL - gguf.sh: no temporary folder"; exit 1; }
command -v jq >/dev/null || { fail "gguf.sh: jq is not installed (scripts/install-deps.sh)"; exit 1; }
DATA=$TPGEN_ROOT/tests/data/gguf

# check_listing NAME TPGEN FILE JSON JQ_TENSORS: each tensor of the JSON
# (name -> {type, ne}) is a line "name type [shape]" with shape = ne reversed
check_listing() {
    local name=$1 bin=$2 file=$3 json=$4 sel=$5 out want got n
    out=$("$bin" inspect --model "$file" 2>&1) || { fail "$name: inspect failed: $(echo "$out" | tail -2)"; return; }
    want=$(jq -r "$sel | to_entries[] | \"\(.key) \(.value.type) [\(.value.ne | reverse | map(tostring) | join(\", \"))]\"" "$json" | sort)
    got=$(echo "$out" | awk '/^  .* bytes/ { sub(/^ +/, ""); sub(/ +[0-9]+ bytes.*$/, ""); print }' | sed -E 's/ {2,}/ /g' | sort)
    n=$(echo "$want" | wc -l)
    if [ "$want" = "$got" ]; then ok "$name ($n tensors)"; else fail "$name: listing differs: $(diff <(echo "$want") <(echo "$got") | head -4)"; fi
}

run_cases() { # TPGEN PREFIX
    local bin=$1 p=$2 v out
    check_listing "${p}inspect_types_gguf" "$bin" "$DATA/types.gguf" "$DATA/types.json" .tensors
    for v in Q8_0 Q4_K mixed; do
        check_listing "${p}inspect_golden_$v" "$bin" "$TPGEN_GOLDEN/flux2-gguf/$v/transformer/flux2-tiny-$v.gguf" \
            "$DATA/golden.json" ".\"$v\".tensors"
    done
    out=$("$bin" inspect --model "$DATA/types.gguf" --summary 2>&1)
    if echo "$out" | grep -qE '^  test\.arr_nested +array +\[3 x array\]' && echo "$out" | grep -qE '^  general\.alignment +u32 +64$' &&
        ! echo "$out" | grep -q ' bytes$'; then ok "${p}inspect_gguf_summary"
    else fail "${p}inspect_gguf_summary: $(echo "$out" | head -3)"; fi
    head -c 1000 "$DATA/types.gguf" > "$TMP/cut.gguf"
    expect_fail "${p}inspect_gguf_truncated" "cut.gguf: .*(truncated|past the end)" "$bin" inspect --model "$TMP/cut.gguf"
    { printf 'GGUF\001\000\000\000'; head -c 100 /dev/zero; } > "$TMP/v1.gguf"
    expect_fail "${p}inspect_gguf_version1" "v1.gguf: GGUF version 1" "$bin" inspect --model "$TMP/v1.gguf"
}

run_cases "$TPGEN" ""
ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then run_cases "$ASAN/tpgen" "asan_"
else fail "sanitizer runs: build-asan/ not found (the test command 'make test' builds it; or run 'make asan')"; fi
