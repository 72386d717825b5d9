#!/usr/bin/env bash
# budget: 10 s; checks: 7
# The repository holds every test input: no test, script or build file names
# the upstream ../shared folder, the tracked tree stays under 60 MB, and a
# fresh clone (in an empty temporary folder, nothing beside it) unpacks its
# golden data and passes golden tests with it.
source "$TPGEN_ROOT/tests/lib.sh"
cd "$TPGEN_ROOT"
LIMIT_MB=60

hits=$(grep -rnI --exclude=selfcontained.sh -e '\.\./shared' tests scripts Makefile .ci core cli kernels plans 2>/dev/null || true)
if [ -z "$hits" ]; then ok "selfcontained: no test, script or source path names ../shared"
else fail "selfcontained: paths name ../shared: $(echo "$hits" | head -3 | tr '\n' ' ')"; fi

if ! command -v git >/dev/null || ! git rev-parse --git-dir >/dev/null 2>&1; then
    fail "selfcontained: $TPGEN_ROOT is not a git checkout with git installed: the tracked tree cannot be measured"
    exit 0
fi
bytes=$(git ls-files -z | xargs -0 stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
mb=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
if [ "$bytes" -gt 0 ] && [ "$bytes" -lt $((LIMIT_MB * 1048576)) ]; then ok "selfcontained: tracked tree is $mb MB (limit $LIMIT_MB MB)"
else fail "selfcontained: tracked tree is $mb MB, over the $LIMIT_MB MB limit (store large test data compressed, once)"; fi

# every file the golden manifest lists is tracked (or restored from a tracked file)
untracked=$(git ls-files --others --exclude-standard tests/data | head -3)
if [ -z "$untracked" ]; then ok "selfcontained: tests/data has no untracked files"
else fail "selfcontained: untracked test data (commit it): $untracked"; fi

# a fresh clone of HEAD with nothing beside it
clone=$TMP/empty/tpgen
mkdir -p "$TMP/empty"
if git clone -q --no-hardlinks "$TPGEN_ROOT" "$clone" 2>"$TMP/clone.err"; then
    out=$(cd "$clone" && tests/unpack-golden.sh "$clone/build/golden" 2>&1)
    echo "$out" | grep -q '^ok - ' && ok "selfcontained: a fresh clone unpacks its golden data" \
        || fail "selfcontained: a fresh clone cannot unpack its golden data: $(echo "$out" | tail -2)"
    # data stored compressed in git (the Qwen3 tokenizer.json) is unpacked beside its .xz for its readers
    out=$(cd "$clone" && "$TPGEN" tokenize --model tests/data/qwen3-tokenizer --prompt "a cat" 2>&1)
    [ -s "$clone/tests/data/qwen3-tokenizer/tokenizer.json" ] && [ -n "$out" ] && ! echo "$out" | grep -q 'error' &&
        ok "selfcontained: the fresh clone's tests/data/qwen3-tokenizer reads after the unpack" ||
        fail "selfcontained: tests/data/qwen3-tokenizer in the fresh clone: $(echo "$out" | tail -2)"
    out=$(cd "$clone" && TPGEN_GOLDEN="$clone/build/golden" "$TPGEN_TESTS" rng_matches_torch_randn rng_pipeline_noise_matches_golden_runs rng_matches_torch2_randn rng_large_draws_match_torch2_digests 2>&1)
    n=$(echo "$out" | grep -c '^ok - ')
    if [ "$n" -ge 4 ] && ! echo "$out" | grep -q '^FAIL - '; then ok "selfcontained: golden unit tests pass in the fresh clone ($n)"
    else fail "selfcontained: golden unit tests in the fresh clone: $(echo "$out" | grep -E '^(ok|FAIL)' | head -3 | tr '\n' ' ')"; fi
    out=$(cd "$clone" && G=build/golden/flux2-tiny-a && $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" \
        --cases "$G/transformer_cases.safetensors" --precision f32 2>&1)
    echo "$out" | grep -qE '^max_rel_err=.* PASS$' && ok "selfcontained: golden check at tp 2 passes in the fresh clone" \
        || fail "selfcontained: golden check in the fresh clone: $(echo "$out" | tail -2 | tr '\n' ' ')"
else
    fail "selfcontained: git clone failed: $(tail -2 "$TMP/clone.err")"
fi
