#!/usr/bin/env bash
# budget: 65 s; checks: 77
# FLUX.3 transformers stored as GGUF (docs/flux3.md "GGUF"): the golden
# flux3-tiny base and flow-map models written by `tpgen quantize` (Q8_0,
# diffusers names and the default BFL names) and by the test binary (a mixed
# Q4_0/Q5_1/Q8_0/F16/F32 file), each byte-identical to what gguf-py 0.19.0
# wrote (tests/data/flux3-gguf/flux3-gguf.sha256, tests/tools/flux3_gguf_golden.py);
# `tpgen check` at tp 1, 2, 3 against diffusers 0.42.1's float32 forward on
# gguf-py's dequantised weights (4 cases, 2 with reference tokens): f32 <= 1e-5,
# bf16 <= 3e-2, with and without config.json; the same from a BFL single file
# quantised with its BFL names kept; inspect picks the FLUX.3 plan (GGUF and a
# BFL safetensors file without config.json); generate from a GGUF pipeline
# folder = its dequantised twin's latents (and with a LoRA adapter: unmerged
# low-rank terms vs merged); a GGUF missing a mode weight is refused naming the
# file and the tensor; quantize refuses a non-FLUX.3 tensor under --names bfl; K-quants
# (tpgen's Q4_K/Q5_K/Q6_K) on a random D 256 model against diffusers at tp 1, 2, 4.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
D=$TPGEN_ROOT/tests/data/flux3-gguf
F=$TMP/f
gold_t() { echo "$TPGEN_GOLDEN/flux3-tiny/$1/model/transformer"; }

# the files, and gguf-py's bytes
for v in base flowmap; do
    mkdir -p "$F/$v"
    "$TPGEN" quantize --type Q8_0 --names keep "$(gold_t $v)" "$F/$v/Q8_0-keep.gguf" >/dev/null &&
        "$TPGEN" quantize --type Q8_0 "$(gold_t $v)" "$F/$v/Q8_0-bfl.gguf" >/dev/null &&
        TPGEN_F3GGUF_OUT="$F/$v/mixed.gguf" TPGEN_F3GGUF_VARIANT=$v "$TPGEN_TESTS" flux3_gguf_write | grep -q '^ok - ' ||
        fail "flux3 gguf: writing the $v files"
done
if (cd "$F" && sha256sum --quiet -c "$D/flux3-gguf.sha256"); then
    ok "flux3 gguf: tpgen quantize (Q8_0 keep, Q8_0 BFL names) and the mixed writer = gguf-py 0.19.0's bytes (6 files)"
else fail "flux3 gguf: sha256: $(cd "$F" && sha256sum */*)"; fi
out=$("$TPGEN" inspect --model "$F/base/Q8_0-bfl.gguf" 2>&1)
echo "$out" | grep -q 'general.architecture.*flux3' && echo "$out" | grep -q 'final_layer.image.adaLN_modulation.1.weight' &&
    ! echo "$out" | grep -q 'norm_out' && ok "flux3 gguf: quantize's default names are BFL, architecture flux3" ||
    fail "flux3 gguf: BFL names: $(echo "$out" | head -5 | tr '\n' ' ')"

# folders: keep (with config.json), keep without, bfl (without), mixed (without)
for v in base flowmap; do
    for l in keep keep-nocfg bfl mixed; do mkdir -p "$TMP/$v/$l"; done
    cp "$F/$v/Q8_0-keep.gguf" "$(gold_t $v)/config.json" "$TMP/$v/keep/"
    cp "$F/$v/Q8_0-keep.gguf" "$TMP/$v/keep-nocfg/"
    cp "$F/$v/Q8_0-bfl.gguf" "$TMP/$v/bfl/"
    cp "$F/$v/mixed.gguf" "$TMP/$v/mixed/"
done

lines() { echo "$1" | grep -E '^case[0-9]+ rel_err='; }
check() { # NAME DIR CASES NP PREC TOL [ARGS...]: PASS with 4 cases; sets $out
    local name=$1 dir=$2 cases=$3 np=$4 prec=$5 tol=$6 rc
    shift 6
    out=$($MPIRUN -np "$np" "${BIN:-$TPGEN}" check --backend cpu --model "$dir" --cases "$cases" --precision "$prec" \
          --tol "$tol" "$@" 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q '^# FLUX.3 transformer' && [ "$(lines "$out" | wc -l)" -eq 4 ] &&
        echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then ok "$name ($(echo "$out" | grep -oE '^max_rel_err=[^ ]+'))"
    else fail "$name: rc=$rc $(echo "$out" | tail -3 | tr '\n' ' ')"; fi
}
for v in base flowmap; do
    for np in 1 2 3; do
        for l in keep bfl mixed; do
            t=$([ $l = mixed ] && echo mixed || echo Q8_0)
            check "flux3 gguf: $v $l check f32 tp=$np vs diffusers on gguf-py's dequantised $t" \
                "$TMP/$v/$l" "$D/$v-${t}_cases.safetensors" $np f32 1e-5
            [ $l = keep ] && k=$(lines "$out")
            [ $l = bfl ] && { [ "$(lines "$out")" = "$k" ] && ok "flux3 gguf: $v tp=$np BFL names = diffusers names, case by case" ||
                fail "flux3 gguf: $v tp=$np BFL [$(lines "$out" | tr '\n' ' ')] vs keep [$(echo "$k" | tr '\n' ' ')]"; }
        done
        check "flux3 gguf: $v mixed check bf16 tp=$np" "$TMP/$v/mixed" "$D/$v-mixed_cases.safetensors" $np bf16 3e-2
    done
    check "flux3 gguf: $v keep without config.json (derived) f32 tp=2" "$TMP/$v/keep-nocfg" "$D/$v-Q8_0_cases.safetensors" 2 f32 1e-5
    check "flux3 gguf: $v bfl check bf16 tp=3" "$TMP/$v/bfl" "$D/$v-Q8_0_cases.safetensors" 3 bf16 3e-2
done
# K-quants on the random D 256 FLUX.3 of tests/test_flux3_gguf.c (the tiny golden rows are no whole 256-blocks):
# tpgen quantize Q4_K / Q5_K / Q6_K = the bytes the golden script's reference was computed on (gguf-py's
# dequantisation, diffusers' forward on the golden base inputs); check at tp 1, 2, 4 (row-parallel shards of half
# and a quarter of a block), f32 and bf16
KQ=$TMP/kq
mkdir -p "$KQ"
TPGEN_F3GGUF_RANDOM="$KQ/src" "$TPGEN_TESTS" flux3_gguf_write | grep -q '^ok - ' || fail "flux3 gguf: writing the random model"
for t in Q4_K Q5_K Q6_K; do
    mkdir -p "$KQ/$t" && "$TPGEN" quantize --type $t --names keep "$KQ/src" "$KQ/$t/x.gguf" >/dev/null &&
        mkdir -p "$KQ/kq" && ln -sf "$KQ/$t/x.gguf" "$KQ/kq/$t.gguf" || fail "flux3 gguf: quantize $t"
done
(cd "$KQ" && sha256sum --quiet -c "$D/flux3-gguf-kq.sha256") && ok "flux3 gguf: Q4_K/Q5_K/Q6_K of the random model = the reference's bytes" ||
    fail "flux3 gguf: K-quant sha256: $(cd "$KQ" && sha256sum kq/*)"
for t in Q4_K Q5_K Q6_K; do
    for np in 1 2 4; do
        check "flux3 gguf: random D 256 $t check f32 tp=$np vs diffusers on gguf-py's dequantised" "$KQ/$t" \
            "$D/kq-${t}_cases.safetensors" $np f32 1e-5
    done
    check "flux3 gguf: random D 256 $t check bf16 tp=2" "$KQ/$t" "$D/kq-${t}_cases.safetensors" 2 bf16 3e-2
done

# the unquantised golden outputs are not met at 1e-4 (the weights are quantised)
expect_fail "flux3 gguf: Q8_0 against the unquantised golden fails at 1e-4" "^max_rel_err=.* FAIL$" \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/base/keep" \
    --cases "$TPGEN_GOLDEN/flux3-tiny/base/transformer_cases.safetensors" --tol 1e-4

# quantize of a BFL single file keeps its names: the bytes of the BFL-named GGUF
python3 "$TPGEN_ROOT/tests/tools/flux3_bfl_testdata.py" "$TPGEN_GOLDEN/flux3-tiny" "$TMP/bflst" --no-verify --raw
"$TPGEN" quantize --type Q8_0 "$TMP/bflst/base/flux3-tiny-bfl.safetensors" "$TMP/from-bfl.gguf" >/dev/null &&
    cmp -s "$TMP/from-bfl.gguf" "$F/base/Q8_0-bfl.gguf" &&
    ok "flux3 gguf: quantize of a BFL FLUX.3 file (names kept) = the diffusers folder's --names bfl bytes" ||
    fail "flux3 gguf: quantize of the BFL file differs"
# quantize of an fp8 FLUX.3 checkpoint (per-channel E4M3 block linears + weight_scale, written by the test binary)
# = of its dequantised twin (decode(code) x scale in F32), byte for byte, in both namings; not the unquantised golden's
if TPGEN_F3FP8_OUT="$TMP/fp8" "$TPGEN_TESTS" flux3_fp8_write_pair | grep -q '^ok - '; then
    r=""
    for n in keep bfl; do
        for x in fp8 twin; do "$TPGEN" quantize --type F32 --names $n "$TMP/fp8/$x" "$TMP/fp8/$x-$n.gguf" >/dev/null || r="$r $x-$n:rc"; done
        cmp -s "$TMP/fp8/fp8-$n.gguf" "$TMP/fp8/twin-$n.gguf" || r="$r $n:differ"
    done
    "$TPGEN" quantize --type F32 --names keep "$(gold_t base)" "$TMP/fp8/golden-keep.gguf" >/dev/null
    cmp -s "$TMP/fp8/fp8-keep.gguf" "$TMP/fp8/golden-keep.gguf" && r="$r same-as-golden"
    [ -z "$r" ] && ok "flux3 gguf: quantize of an fp8 FLUX.3 folder = of its dequantised twin (keep and BFL names)" ||
        fail "flux3 gguf: fp8 quantize:$r"
else fail "flux3 gguf: writing the fp8 folder"; fi
# --names bfl refuses a tensor that is not FLUX.3's
mkdir -p "$TMP/extra" && python3 "$TPGEN_ROOT/tests/tools/st_rename.py" "$(gold_t base)/diffusion_pytorch_model.safetensors" \
    "$TMP/extra/diffusion_pytorch_model.safetensors" --prefix proj_out. extra_head.
expect_fail "flux3 gguf: quantize --names bfl refuses a tensor no BFL name maps to" \
    "tensor 'extra_head.weight' is not a tensor of diffusers' Flux3Transformer2DModel" \
    "$TPGEN" quantize --type Q8_0 --names bfl "$TMP/extra" "$TMP/extra.gguf"
[ ! -e "$TMP/extra.gguf" ] && ok "flux3 gguf: nothing written after the refusal" || fail "flux3 gguf: extra.gguf was written"

# inspect: the FLUX.3 plan for a GGUF (BFL and diffusers names) and for a BFL safetensors file without config.json
for x in bfl:"flux3 (BFL names)":content_mode_blocks.image.0.attn_out.weight keep-nocfg:flux3:mode_blocks.image.0.attn.to_out.0.weight; do
    l=${x%%:*}; rest=${x#*:}; plan=${rest%%:*}; tn=${rest#*:}
    mkdir -p "$TMP/pi-$l" && ln -sfn "$TMP/base/$l" "$TMP/pi-$l/transformer"
    out=$("$TPGEN" inspect --model "$TMP/pi-$l" --tp 3 2>&1)
    if echo "$out" | grep -qF "plan $plan, tp 3" && echo "$out" | grep -qE "^${tn//./\\.} +rowwise +\[96, 96\] +\[96, 32\] Q8_0$" &&
        echo "$out" | grep -q '^valid: tp 3'; then ok "flux3 gguf: inspect --tp 3 of the $l GGUF: plan $plan, rowwise Q8_0 shards"
    else fail "flux3 gguf: inspect $l: $(echo "$out" | grep -E 'plan|valid|error' | tr '\n' ' ')"; fi
done
mkdir -p "$TMP/pi-st" && ln -sfn "$TMP/bflst/base" "$TMP/pi-st/transformer"
out=$("$TPGEN" inspect --model "$TMP/pi-st" --tp 2 2>&1)
echo "$out" | grep -qF 'plan flux3 (BFL names), tp 2' && echo "$out" | grep -q '^valid: tp 2' &&
    ok "flux3 gguf: inspect of a BFL FLUX.3 safetensors file without config.json: the FLUX.3 BFL plan" ||
    fail "flux3 gguf: inspect BFL safetensors: $(echo "$out" | grep -E 'plan|valid|error' | tr '\n' ' ')"
expect_fail "flux3 gguf: inspect --tp 4 refused (6 heads)" "tp 4 does not divide num_attention_heads \(6\) of the flux3 \(BFL names\) model" \
    "$TPGEN" inspect --model "$TMP/pi-bfl" --tp 4

# generate from a FLUX.3 pipeline folder whose transformer/ is the mixed GGUF (no config.json):
# the latents of the same folder with the dequantised twin (F32 safetensors), np 2, 3 steps; with
# the golden LoRA adapter too (unmerged low-rank terms on the blocks vs merged into the twin)
CMP=$TMP/st_compare
cc -std=c17 -O2 -o "$CMP" "$TPGEN_ROOT/tests/tools/st_compare.c" -ljansson -lm || fail "flux3 gguf: building st_compare"
P3=$TPGEN_ROOT/tests/data/flux3-pipe/base_t2i.safetensors
A=$TPGEN_ROOT/tests/data/flux3-lora/adapter.safetensors
for x in pg pt; do
    flux3_folder base "$TMP/$x" && rm "$TMP/$x/transformer" && mkdir "$TMP/$x/transformer"
done
TPGEN_F3GGUF_OUT="$TMP/pg/transformer/x.gguf" TPGEN_F3GGUF_TWIN="$TMP/pt/transformer/x.safetensors" \
    "$TPGEN_TESTS" flux3_gguf_write | grep -q '^ok - ' || fail "flux3 gguf: writing the generate folders"
for lora in none lora; do
    for x in pg pt; do
        $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/$x" --prompt-embeds "$P3" --negative-prompt-embeds "$P3" --seed 42 \
            --steps 3 --width 64 --height 48 --precision f32 --backend cpu --no-decode --save-latents "$TMP/$x-$lora.st" \
            $([ $lora = lora ] && echo --lora "$A") >"$TMP/$x-$lora.log" 2>&1 || echo "rc=$?" >>"$TMP/$x-$lora.log"
    done
    c=$("$CMP" "$TMP/pg-$lora.st" "$TMP/pt-$lora.st" latents 1e-5) &&
        ok "flux3 gguf: generate np=2 ($lora) from the GGUF folder = the dequantised twin's latents ($c)" ||
        fail "flux3 gguf: generate ($lora): $c $(tail -2 "$TMP/pg-$lora.log" | tr '\n' ' ')"
done
c=$("$CMP" "$TMP/pg-lora.st" "$TMP/pg-none.st" latents 1e-3) && fail "flux3 gguf: the adapter changed nothing ($c)" ||
    ok "flux3 gguf: the adapter changes the GGUF model's latents ($c)"

# LoRA on BFL-named FLUX.3 files (the adapter merged into a file renamed to diffusers names at load, norm_out's
# halves swapped first): a BFL safetensors file (bare, and behind model.diffusion_model.) against diffusers + PEFT
# (tests/data/flux3-lora) with the diffusers-named folder's errors; the BFL GGUF (unmerged terms) = the diffusers GGUF
L3=$TPGEN_ROOT/tests/data/flux3-lora
python3 "$TPGEN_ROOT/tests/tools/flux3_bfl_testdata.py" "$TPGEN_GOLDEN/flux3-tiny" "$TMP/bfldm" --no-verify --raw --prefix
for x in bflst/base:1 bflst/base:2 bflst/base:3 bfldm/base:2; do
    d=${x%%:*} np=${x#*:}
    check "flux3 gguf: lora on the BFL file $d, f32 tp=$np vs diffusers+PEFT" "$TMP/$d" "$L3/lora_cases.safetensors" $np f32 1e-4 \
        --lora "$L3/adapter.safetensors"
    b=$(lines "$out")
    check "flux3 gguf: lora on the diffusers folder tp=$np" "$(gold_t base)" "$L3/lora_cases.safetensors" $np f32 1e-4 \
        --lora "$L3/adapter.safetensors" >/dev/null
    [ "$b" = "$(lines "$out")" ] && ok "flux3 gguf: lora on $d tp=$np: the diffusers folder's errors, case by case" ||
        fail "flux3 gguf: lora $d tp=$np: [$(echo "$b" | tr '\n' ' ')] vs [$(lines "$out" | tr '\n' ' ')]"
done
for l in bfl keep; do
    check "flux3 gguf: lora on the $l Q8_0 GGUF tp=2 (runs; quantised, so far from the golden)" "$TMP/base/$l" \
        "$L3/lora_cases.safetensors" 2 f32 1 --lora "$L3/adapter.safetensors"
    eval "g_$l=\$(lines \"\$out\")"
done
[ -n "$g_bfl" ] && [ "$g_bfl" = "$g_keep" ] && ok "flux3 gguf: lora on the BFL-named GGUF = on the diffusers-named GGUF" ||
    fail "flux3 gguf: lora GGUF bfl [$g_bfl] vs keep [$g_keep]"

# hostile: a GGUF missing a mode weight, with and without config.json, named with its file, on every rank
mkdir -p "$TMP/drop" "$TMP/drop-cfg"
TPGEN_F3GGUF_OUT="$TMP/drop/x.gguf" TPGEN_F3GGUF_TYPE=Q8_0 TPGEN_F3GGUF_DROP=mode_blocks.image_cond.1.ff.linear_out.weight \
    "$TPGEN_TESTS" flux3_gguf_write | grep -q '^ok - ' || fail "flux3 gguf: writing the file without a mode weight"
cp "$TMP/drop/x.gguf" "$(gold_t base)/config.json" "$TMP/drop-cfg/"
for d in drop drop-cfg; do
    out=$(timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/$d" \
          --cases "$D/base-Q8_0_cases.safetensors" 2>&1); rc=$?
    n=$(echo "$out" | grep -c "tensor mode_blocks\.image_cond\.1\.ff\.linear_out\.weight missing from the .*$TMP/$d/x\.gguf")
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -ge 1 ] && ok "flux3 gguf: $d: the missing mode weight refused naming the file and the tensor" ||
        fail "flux3 gguf: $d: rc=$rc: $(echo "$out" | grep -i error | head -2 | tr '\n' ' ')"
done

# again under AddressSanitizer + UBSan: check (mixed, BFL names without config.json) at tp 2, quantize --names bfl
ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:fast_unwind_on_malloc=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    for l in mixed bfl; do
        t=$([ $l = mixed ] && echo mixed || echo Q8_0)
        BIN=$ASAN/tpgen check "flux3 gguf: asan $l check f32 tp=2" "$TMP/base/$l" "$D/base-${t}_cases.safetensors" 2 f32 1e-5
    done
    "$ASAN/tpgen" quantize --type Q8_0 "$(gold_t base)" "$TMP/asan-bfl.gguf" >/dev/null 2>"$TMP/asan-q.log" &&
        cmp -s "$TMP/asan-bfl.gguf" "$F/base/Q8_0-bfl.gguf" && ok "flux3 gguf: asan quantize --names bfl: the same bytes" ||
        fail "flux3 gguf: asan quantize: $(tail -3 "$TMP/asan-q.log" | tr '\n' ' ')"
else fail "flux3 gguf: sanitizer runs: build-asan/ not found (run 'make asan')"; fi
