#!/usr/bin/env bash
# budget: 95 s; checks: 52
# Block caching (--cache, docs/cache.md) against cache-dit 1.5.3 (the golden
# set flux2-cache: a tiny FLUX.2, 4 double + 5 single blocks, 16 steps):
#  - every configuration (dev flow, klein-base CFG flow with separate branch
#    state, F1B0 / F2B1, warmup, max_cached, max_continuous, a single-group
#    threshold, TaylorSeer orders 1 and 2) through `tpgen generate` at tp 1
#    and 2: decisions exactly, residual diffs, the latents after every step
#    and the final latents against cache-dit's (tests/tools/cache_check.py);
#  - tp 3: the same decisions, no rank disagreement (the decision is agreed);
#  - the mesh: --sp 2, --cfg-parallel and both, the decisions as cache-dit's and
#    the latents byte-identical to tp 1;
#  - --cache off and threshold=0 give files identical to a run without it;
#  - a batch of three images: each one equals the same image rendered alone
#    (the state is fresh for every image);
#  - the run-spec mapping form, the summary line and the PNG parameters;
#  - bad specs refused on every rank before loading, naming the key, no file.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
G=$TPGEN_GOLDEN/flux2-cache
I=$G/inputs.safetensors
CHECK="python3 $TPGEN_ROOT/tests/tools/cache_check.py"
# two pipeline folders on the golden transformer: FLUX.2-dev and klein base
for f in dev cfg; do
    mkdir -p "$TMP/$f"
    ln -s "$G/transformer" "$TMP/$f/transformer"
    ln -s "$G/scheduler" "$TMP/$f/scheduler"
done
printf '{"_class_name": "Flux2Pipeline", "transformer": ["diffusers", "Flux2Transformer2DModel"]}\n' \
    > "$TMP/dev/model_index.json"
printf '{"_class_name": "Flux2KleinPipeline", "is_distilled": false, "transformer": ["diffusers", "Flux2Transformer2DModel"]}\n' \
    > "$TMP/cfg/model_index.json"
# gen NP FLOW OUT [ARGS...]: the golden command of README.md at tp NP, f32, the latents of every step
gen() {
    local np=$1 flow=$2 out=$3; shift 3
    local neg=()
    [ "$flow" = cfg ] && neg=(--negative-prompt-embeds "$I:negative_prompt_embeds")
    $MPIRUN -np "$np" "$TPGEN" generate --model "$TMP/$flow" --prompt-embeds "$I:prompt_embeds" "${neg[@]}" \
        --initial-latents "$I:latents_unpacked" --width 96 --height 64 --steps 16 --guidance 4 --precision f32 \
        --backend cpu --no-decode --save-latents "$out.st" --save-step-latents --json-metrics "$out.json" "$@"
}
CONFIGS="dev_nocache:off
dev_F1B0_W2_R0.105:fn=1,bn=0,warmup=2,threshold=0.105
dev_F2B1_W3_R0.12_MC2:fn=2,bn=1,warmup=3,threshold=0.12,max_continuous=2
dev_F1B0_W2_R0.20_M3:fn=1,bn=0,warmup=2,threshold=0.2,max_cached=3
dev_F1B0_W2_R0.06_S0.18:fn=1,bn=0,warmup=2,threshold=0.06,threshold_single=0.18
dev_F1B0_W2_R0.105_TS1:fn=1,bn=0,warmup=2,threshold=0.105,taylorseer=1
dev_F1B0_W4_R0.095_TS1:fn=1,bn=0,warmup=4,threshold=0.095,taylorseer=1
dev_F1B0_W4_R0.095_TS2:fn=1,bn=0,warmup=4,threshold=0.095,taylorseer=2
cfg_nocache:off
cfg_F1B0_W2_R0.09:fn=1,bn=0,warmup=2,threshold=0.09
cfg_F1B0_W4_R0.09_TS1:fn=1,bn=0,warmup=4,threshold=0.09,taylorseer=1"

# --- every golden configuration at tp 1 and 2 ---
for np in 1 2; do
    while IFS=: read -r cfg spec; do
        o=$TMP/$cfg-$np
        if ! gen $np "${cfg%%_*}" "$o" --cache "$spec" >"$o.log" 2>&1 </dev/null; then
            fail "cache $cfg tp=$np: generate: $(tail -3 "$o.log" | tr '\n' ' ')"; continue
        fi
        r=$($CHECK "$G" "$cfg" "$o.json" "$o.st" 2>&1) && ok "cache $cfg tp=$np (--cache $spec): $r" \
            || fail "cache $cfg tp=$np: $r"
    done <<< "$CONFIGS"
done

# --- tp 3: the same decisions on every rank (agreed), as at tp 1 ---
# the golden model's 2 heads do not split 3 ways: a random 3-head FLUX.2 (tests/tools/cache_model.py),
# as FLUX.2-dev and as klein base (CFG), with the golden inputs
for f in m3dev m3cfg; do
    mkdir -p "$TMP/$f"
    ln -s "$G/scheduler" "$TMP/$f/scheduler"
done
python3 "$TPGEN_ROOT/tests/tools/cache_model.py" "$TMP/m3dev/transformer"
ln -s "$TMP/m3dev/transformer" "$TMP/m3cfg/transformer"
cp "$TMP/dev/model_index.json" "$TMP/m3dev/"
cp "$TMP/cfg/model_index.json" "$TMP/m3cfg/"
dec() { python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['cache_decisions'][0]; print(' '.join(d[k] for k in ('double','single','double_uncond','single_uncond') if k in d), 'disagreements', d['disagreements'])" "$1"; }
for c in m3dev:fn=1,bn=0,warmup=2,threshold=0.1 m3cfg:fn=1,bn=0,warmup=2,threshold=0.1 \
         m3dev:fn=1,bn=1,warmup=3,threshold=0.12,taylorseer=2; do
    f=${c%%:*} spec=${c#*:}
    for np in 1 3; do gen $np "$f" "$TMP/t$np" --cache "$spec" >"$TMP/t$np.log" 2>&1; done
    d1=$(dec "$TMP/t1.json" 2>&1) d3=$(dec "$TMP/t3.json" 2>&1)
    if [ "$d1" = "$d3" ] && echo "$d3" | grep -q 'K.*disagreements 0$'; then
        ok "cache ${f#m3} tp=3 --cache $spec: decisions agreed on every rank, equal to tp 1's ($d3)"
    else fail "cache ${f#m3} tp=3 --cache $spec: tp 3 $d3, tp 1 $d1; $(tail -2 "$TMP/t3.log" | tr '\n' ' ')"; fi
done

# --- the parallel mesh (docs/parallel.md): Ulysses SP ranks hold different token rows, so the residual sums
# add up over the SP group and the decision is agreed over it; CFG parallelism keeps each branch's state on
# its half. Decisions as cache-dit's, and the latents byte-identical to the tp 1 run above (SP and CFG
# parallelism change no arithmetic) ---
for c in "dev_F1B0_W2_R0.105:2:--sp 2" "dev_F1B0_W4_R0.095_TS2:2:--sp 2" "cfg_F1B0_W2_R0.09:2:--sp 2" \
         "cfg_F1B0_W2_R0.09:2:--cfg-parallel" "cfg_F1B0_W4_R0.09_TS1:4:--cfg-parallel --sp 2"; do
    IFS=: read -r cfg np mesh <<< "$c"
    spec=$(echo "$CONFIGS" | sed -n "s/^$cfg://p")
    o=$TMP/$cfg-mesh$np
    # shellcheck disable=SC2086
    if ! gen "$np" "${cfg%%_*}" "$o" --cache "$spec" $mesh >"$o.log" 2>&1 </dev/null; then
        fail "cache $cfg $mesh: generate: $(tail -3 "$o.log" | tr '\n' ' ')"; continue
    fi
    r=$($CHECK "$G" "$cfg" "$o.json" "$o.st" 2>&1) && cmp -s "$o.st" "$TMP/$cfg-1.st" \
        && ok "cache $cfg $mesh (np $np): as cache-dit, latents byte-identical to tp 1 ($r)" \
        || fail "cache $cfg $mesh (np $np): $r; $(cmp "$o.st" "$TMP/$cfg-1.st" 2>&1)"
done

# --- off and threshold=0 are the uncached run, bit for bit ---
gen 1 dev "$TMP/plain" >/dev/null 2>&1
for spec in off threshold=0 fn=1,threshold=0,taylorseer=2; do
    gen 1 dev "$TMP/z" --cache "$spec" >/dev/null 2>&1 && cmp -s "$TMP/z.st" "$TMP/plain.st" \
        && ok "cache --cache $spec: latents file identical to a run without --cache" \
        || fail "cache --cache $spec: the latents differ from a run without --cache"
done
gen 1 cfg "$TMP/plainc" >/dev/null 2>&1
gen 1 cfg "$TMP/zc" --cache threshold=0 >/dev/null 2>&1 && cmp -s "$TMP/zc.st" "$TMP/plainc.st" \
    && ok "cache --cache threshold=0 with CFG: identical to a run without --cache" \
    || fail "cache threshold=0 with CFG: the latents differ"

# --- a batch: each image as it would be alone (state reset per image) ---
B=(--model "$TMP/dev" --prompt-embeds "$I:prompt_embeds" --width 96 --height 64 --steps 16 --guidance 4
   --precision f32 --backend cpu --no-decode --cache fn=1,bn=0,warmup=2,threshold=0.105,taylorseer=1)
printf 'seeds: [3, 1, 3]\n' > "$TMP/batch.yaml"
if $MPIRUN -np 2 "$TPGEN" generate "${B[@]}" --spec "$TMP/batch.yaml" --save-latents "$TMP/b-{index}.st" \
    --json-metrics "$TMP/b.json" >"$TMP/log" 2>&1 &&
    $MPIRUN -np 2 "$TPGEN" generate "${B[@]}" --seed 1 --save-latents "$TMP/a1.st" --json-metrics "$TMP/a1.json" >/dev/null 2>&1 &&
    $MPIRUN -np 2 "$TPGEN" generate "${B[@]}" --seed 3 --save-latents "$TMP/a3.st" --json-metrics "$TMP/a3.json" >/dev/null 2>&1; then
    s=$(python3 -c "
import json,sys
b=json.load(open('$TMP/b.json'))['cache_decisions']; a={s: json.load(open('$TMP/a%d.json' % s))['cache_decisions'][0] for s in (1,3)}
ok = [x['job'] for x in b] == [0,1,2] and all(x['double'] == a[s]['double'] and x['single'] == a[s]['single'] for x, s in zip(b, (3,1,3)))
print('same' if ok else 'differ: %s' % [(x['double'], x['single']) for x in b])")
    if [ "$s" = same ] && cmp -s "$TMP/b-0.st" "$TMP/a3.st" && cmp -s "$TMP/b-1.st" "$TMP/a1.st" &&
        cmp -s "$TMP/b-2.st" "$TMP/a3.st"; then
        ok "cache batch (seeds 3, 1, 3 at tp 2): each image's latents and decisions equal the image rendered alone"
    else fail "cache batch: $s; files: $(cmp "$TMP/b-0.st" "$TMP/a3.st" 2>&1; cmp "$TMP/b-2.st" "$TMP/a3.st" 2>&1)"; fi
else fail "cache batch: $(tail -3 "$TMP/log" | tr '\n' ' ')"; fi

# --- the run-spec mapping, the summary, the PNG parameters ---
printf 'cache:\n  fn: 1\n  bn: 0\n  warmup: 2\n  threshold: 0.105\n' > "$TMP/c.yaml"
if gen 1 dev "$TMP/y" --spec "$TMP/c.yaml" >"$TMP/y.log" 2>&1 && cmp -s "$TMP/y.st" "$TMP/dev_F1B0_W2_R0.105-1.st"; then
    ok "cache run-spec mapping {fn, bn, warmup, threshold}: the same run as --cache fn=1,bn=0,warmup=2,threshold=0.105"
else fail "cache run-spec mapping: $(tail -2 "$TMP/y.log" | tr '\n' ' ')"; fi
grep -q 'cache    double blocks 7 computed, 9 cached; single blocks 6 computed, 10 cached' "$TMP/y.log" \
    && ok "cache summary: computed and cached steps per group (cache-dit's 9 and 10 cached steps)" \
    || fail "cache summary line: $(grep cache "$TMP/y.log")"
K=$TPGEN_GOLDEN/klein-tiny/model
mkdir -p "$TMP/kb"
for x in transformer vae scheduler; do ln -s "$K/$x" "$TMP/kb/$x"; done
cp "$TMP/cfg/model_index.json" "$TMP/kb/"
E=$TPGEN_GOLDEN/klein-tiny/e2e.safetensors:case0.prompt_embeds
if "$TPGEN" generate --model "$TMP/kb" --prompt-embeds "$E" --negative-prompt-embeds "$E" --steps 3 --width 32 \
    --height 32 --backend cpu --cache balanced,warmup=1 --output "$TMP/p.png" >"$TMP/log" 2>&1 &&
    grep -aq 'cache: balanced,fn=1,bn=0,warmup=1,threshold=0.08,threshold_single=0.24,max_cached=-1,max_continuous=2,taylorseer=0' "$TMP/p.png"; then
    ok "cache PNG parameters record the spec (klein base with --negative-prompt-embeds)"
else fail "cache PNG parameters: $(tail -2 "$TMP/log" | tr '\n' ' ') $(grep -ao 'cache: [^ ]*' "$TMP/p.png")"; fi

# --- refusals: every rank, before loading, naming the key, no file ---
refuse() {
    local name=$1 pat=$2; shift 2
    rm -f "$TMP/r.st"
    expect_fail "cache refuses $name (tp 2)" "$pat" $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/dev" \
        --prompt-embeds "$I:prompt_embeds" --width 96 --height 64 --steps 4 --precision f32 --backend cpu --no-decode \
        --save-latents "$TMP/r.st" "$@"
    [ -e "$TMP/r.st" ] && fail "cache refuses $name: a latents file was written"
}
refuse "fn=0" 'fn=0: expected an integer from 1' --cache fn=0
refuse "fn + bn above a group's blocks" 'fn=3 \+ bn=2 is more than the 4 double blocks' --cache fn=3,bn=2
refuse "an unknown key" "unknown key 'treshold'" --cache treshold=0.1
refuse "a negative threshold" 'threshold=-0.1: expected a number >= 0' --cache threshold=-0.1
refuse "TaylorSeer order 3" 'taylorseer=3: expected an integer from 0 to 2' --cache taylorseer=3
refuse "a bare word" "'quick' is not key=value" --cache quick
out=$($MPIRUN -np 2 "$TPGEN" generate --model "$TMP/dev" --prompt-embeds "$I:prompt_embeds" --width 96 --height 64 \
    --steps 4 --backend cpu --no-decode --save-latents "$TMP/r.st" --cache fn=0 2>&1)
[ "$(echo "$out" | grep -c 'fn=0')" -ge 1 ] && ! echo "$out" | grep -qi 'load' \
    && ok "cache refusal comes before loading (no load line)" || fail "cache refusal: $out"

# --- FLUX.3 (no golden: mode blocks and single blocks as the two groups, docs/cache.md) ---
flux3_folder base "$TMP/f3"
python3 "$TPGEN_ROOT/tests/tools/craft.py" st "$TMP/e80.st" prompt_embeds:F32:1,80,80 negative_prompt_embeds:F32:1,80,80
F3=(--model "$TMP/f3" --prompt-embeds "$TMP/e80.st" --negative-prompt-embeds "$TMP/e80.st" --steps 12 --width 64
    --height 64 --precision f32 --backend cpu --no-decode)
for np in 1 3; do
    $MPIRUN -np $np "$TPGEN" generate "${F3[@]}" --cache warmup=2,threshold=0.2 --save-latents "$TMP/f3-$np.st" \
        --json-metrics "$TMP/f3-$np.json" >"$TMP/f3-$np.log" 2>&1
done
d1=$(dec "$TMP/f3-1.json" 2>&1) d3=$(dec "$TMP/f3-3.json" 2>&1)
[ "$d1" = "$d3" ] && echo "$d3" | grep -q 'K.*disagreements 0$' && grep -q 'cache    mode blocks' "$TMP/f3-3.log" \
    && ok "cache FLUX.3 base (CFG) tp=3: mode and single groups' decisions agreed, equal to tp 1's ($d3)" \
    || fail "cache FLUX.3 tp=3: tp 3 $d3, tp 1 $d1; $(tail -2 "$TMP/f3-3.log" | tr '\n' ' ')"
# fn + bn = every block: nothing is skipped, so "caching" every step (threshold 1) must change no bit
"$TPGEN" generate "${F3[@]}" --save-latents "$TMP/f3-plain.st" >/dev/null 2>&1
"$TPGEN" generate "${F3[@]}" --cache fn=1,bn=1,warmup=1,threshold=1 --save-latents "$TMP/f3-all.st" \
    --json-metrics "$TMP/f3-all.json" >/dev/null 2>&1
[ "$(dec "$TMP/f3-all.json" 2>&1)" = "CKKKKKKKKKKK CKKKKKKKKKKK CKKKKKKKKKKK CKKKKKKKKKKK disagreements 0" ] &&
    cmp -s "$TMP/f3-all.st" "$TMP/f3-plain.st" && ! cmp -s "$TMP/f3-1.st" "$TMP/f3-plain.st" \
    && ok "cache FLUX.3: with no middle blocks the cached steps change nothing (bit-identical); with them they do" \
    || fail "cache FLUX.3 empty middle: $(dec "$TMP/f3-all.json" 2>&1)"
expect_fail "cache FLUX.3 refuses fn + bn above the mode blocks" 'fn=2 \+ bn=1 is more than the 2 mode blocks' \
    "$TPGEN" generate "${F3[@]}" --cache fn=2,bn=1 --save-latents "$TMP/f3-bad.st"

# --- serve: a request's "cache", refusals as 400 naming the field, /metrics counts the steps ---
M=$TMP/tiny
"$TPGEN" make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "cache serve: make-tiny"
. "$TPGEN_ROOT/tests/lib_serve.sh"   # start_server, stop_server
if ! start_server "$TMP/srv.log" "$TPGEN" --steps 4 --width 32 --height 32; then
    fail "cache serve: did not become ready: $(tail -3 "$TMP/srv.log")"
else
    post() { curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' -d "$1"; }
    # threshold >= 1 caches every step after the warmup without measuring (spec §3 step 8): 1 computed, 3 cached
    r=$(post '{"prompt": "a fox", "seed": 7, "cache": "warmup=1,threshold=1"}')
    echo "$r" | jq -r '.data[0].b64_json' | base64 -d > "$TMP/srv.png" 2>/dev/null
    m=$(curl -s "http://127.0.0.1:$PORT/metrics")
    if grep -aq 'cache: fn=1,bn=0,warmup=1,threshold=1,' "$TMP/srv.png" &&
        echo "$m" | grep -q 'tpgen_block_cache_steps_total{group="double",result="cached"} 3' &&
        echo "$m" | grep -q 'tpgen_block_cache_steps_total{group="single",result="computed"} 1'; then
        ok "cache serve: a request's cache is used, recorded in its PNG, and /metrics counts 1 computed + 3 cached steps per group"
    else fail "cache serve: $(echo "$r" | head -c 200) $(echo "$m" | grep block_cache)"; fi
    for c in 'fn=0:fn=0' 'treshold=1:unknown key' 'fn=9:fn=9 \+ bn=0 is more than the'; do
        r=$(post "{\"prompt\": \"a fox\", \"cache\": \"${c%%:*}\"}")
        echo "$r" | jq -e '.error.param == "cache"' >/dev/null && echo "$r" | jq -r .error.message | grep -qE "${c#*:}" \
            && ok "cache serve: \"cache\": \"${c%%:*}\" refused with 400 naming the field" \
            || fail "cache serve: \"cache\": \"${c%%:*}\": $r"
    done
    stop_server >/dev/null
fi
