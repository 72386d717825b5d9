#!/usr/bin/env bash
# budget: 240 s; checks: 113
# The adapter dialects users download (docs/lora.md): LyCORIS LoKr/LoHa,
# ComfyUI BFL-named LoKr/LoHa on fused weights, fal's PEFT-on-BFL files and
# FLUX.2-dev files with guidance_in, ComfyUI .diff patches. `tpgen check
# --lora` against the golden flux2-lora-dialects set (LyCORIS's own forward,
# torch merges; tests/data/golden/flux2-lora-dialects.tar.xz): every adapter
# at strengths 1.0 and 0.5, f32 at tp 1, 2 and 4 and bf16 at tp 2. The two
# tiny transformers are regenerated bit for bit (tpgen_tests
# lora_dialects_make_models, sha256 from the set's manifest); the two large
# ComfyUI diff files (3.8 MB of random f32) are not in the repository: a
# generated twin (tests/tools/diff_twin.py) checks the dialect in every run, and
# the files themselves are checked when TPGEN_SHARED_GOLDEN names the upstream
# golden folder (one SKIP line otherwise, as in CI and a fresh clone). Then the structured terms on GGUF
# weights (fp8 and GGUF against dequantised twins: tests/test_lora_quant.c), two dialects at once, inspect --lora and the refusals.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN/flux2-lora-dialects
U=${TPGEN_SHARED_GOLDEN:-/nonexistent}/flux2-lora-dialects
export OMP_NUM_THREADS=1
M=$TMP/models
mkdir -p "$M"
out=$(TPGEN_LORA_DIALECTS_OUT="$M" "$TPGEN_TESTS" lora_dialects_make_models 2>&1)
if echo "$out" | grep -q '^ok - '; then ok "dialects: tiny klein and dev regenerated, sha256 as in the manifest"
else fail "dialects: regenerating the models: $(echo "$out" | grep FAIL | head -2)"; fi

model_of() { case $1 in fal_dev*) echo dev;; *) echo klein;; esac; }
dir_of() { [ "$1" = dev ] && echo "$M/transformer_dev" || echo "$M/transformer"; }
gcheck() {   # NP PRECISION FILE NAME STRENGTH [more --lora ...]
    local np=$1 prec=$2 file=$3 name=$4 s=$5 m out rc; shift 5
    m=$(model_of "$name")
    out=$($MPIRUN -np "$np" "$TPGEN" check --backend cpu --model "$(dir_of "$m")" --cases "$G/cases_$m.safetensors" \
          --precision "$prec" --lora "$file:$s" "$@" --outputs "$G/outputs.safetensors" --prefix "${name}_s$s" 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then
        ok "dialects: $name s=$s np=$np $prec ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
    else fail "dialects: $name s=$s np=$np $prec: rc=$rc $(echo "$out" | grep -E 'error|max_rel' | head -2 | tr '\n' ' ')"; fi
}
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$M/transformer" --cases "$G/cases_klein.safetensors" 2>&1)
if echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then ok "dialects: klein without adapter = the set's base output"
else fail "dialects: base output: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi

PACKED="lycoris_lokr_full lycoris_lokr_w2lowrank lycoris_lokr_bothlowrank lycoris_loha comfy_bfl_lokr_full
        comfy_bfl_lokr_lowrank comfy_bfl_loha fal_klein_peft fal_dev_bfl_guidance fal_dev_expanded_guidance"
for a in $PACKED; do
    for s in 1.0 0.5; do
        for np in 1 2 4; do gcheck $np f32 "$G/adapters/$a.safetensors" $a $s; done
        gcheck 2 bf16 "$G/adapters/$a.safetensors" $a $s
    done
done
# ComfyUI .diff patches (full weights, QK-norm scales, the final layer's swapped halves). The set's two diff
# files (3.8 MB of random values) are left out of the repository; their twin is generated here
# (tests/tools/diff_twin.py): a full-diff patch in BFL names over fused weights, and the model with the same
# deltas merged in diffusers layout by the tool, so `check --against` compares base + patch with the merged model
DT=$TMP/difftwin
if python3 "$TPGEN_ROOT/tests/tools/diff_twin.py" "$M/transformer" "$DT"; then :
else fail "dialects: tests/tools/diff_twin.py failed"; fi
tcheck() {   # NP STRENGTH FILE -> output of check --against
    $MPIRUN -np "$1" "$TPGEN" check --backend cpu --model "$M/transformer" --lora "$3:$2" --against "$DT/merged_$2" 2>&1
}
for s in 1.0 0.5; do for np in 1 2 4; do
    out=$(tcheck $np $s "$DT/comfy_diff.safetensors"); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then
        ok "dialects: generated ComfyUI full diff s=$s np=$np = the merged twin ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
    else fail "dialects: generated full diff s=$s np=$np: rc=$rc $(echo "$out" | grep -E 'error|max_rel' | head -2 | tr '\n' ' ')"; fi
done; done
n=$(echo "$out" | grep -c 'warning: .*\.diff_b is a bias patch (.diff_b), but .* no bias; it is ignored')
if [ "$n" = 2 ]; then ok "dialects: the two .diff_b keys are named in warnings, once each"
else fail "dialects: .diff_b warnings: $n: $(echo "$out" | grep -i warn | head -2)"; fi
# the comparison can tell: the model without the patch, and the patch with the adaLN halves unswapped, differ
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$M/transformer" --against "$DT/merged_1.0" 2>&1)
echo "$out" | grep -qE '^max_rel_err=.* FAIL$' && ok "dialects: without the patch the merged twin differs" ||
    fail "dialects: the merged twin equals the base model: $(echo "$out" | tail -1)"
out=$(tcheck 2 1.0 "$DT/comfy_diff_unswapped.safetensors")
echo "$out" | grep -qE '^max_rel_err=.* FAIL$' && ok "dialects: adaLN halves left unswapped do not match ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))" ||
    fail "dialects: the unswapped patch matched: $(echo "$out" | tail -1)"
# the upstream files themselves, where the shared golden folder is at hand (TPGEN_SHARED_GOLDEN)
if [ -f "$U/adapters/comfy_full_diff.safetensors" ]; then
    for a in comfy_full_diff comfy_diff_norms; do
        for s in 1.0 0.5; do for np in 1 2 4; do gcheck $np f32 "$U/adapters/$a.safetensors" $a $s; done; done
    done
else skip "dialects: the set's own comfy_full_diff and comfy_diff_norms files (3.8 MB, left out of the repository; their generated twin is checked above): set TPGEN_SHARED_GOLDEN to check them"; fi

# ---- two dialects at once: LyCORIS LoHa at 0.5 plus a BFL-named LoKr on the fused weights at +1 and -1
# (which cancel) must give the LoHa reference at 0.5
for np in 2 4; do
    gcheck $np f32 "$G/adapters/lycoris_loha.safetensors" lycoris_loha 0.5 \
        --lora "$G/adapters/comfy_bfl_lokr_lowrank.safetensors:1" --lora "$G/adapters/comfy_bfl_lokr_lowrank.safetensors:-1" \
        --lora "$G/adapters/fal_klein_peft.safetensors:0.25" --lora "$G/adapters/fal_klein_peft.safetensors:-0.25"
done

# ---- GGUF Q8_0 (BFL names: the diffusers-named LyCORIS modules land on fused weights): the structured terms,
# tp 2 against the unsharded run; tests/test_lora_quant.c (lora_dialects_unmerged) compares raw-E4M3 fp8 and
# this GGUF, tp 2, with the merge into their dequantised twins
Q=$TMP/gguf/transformer
mkdir -p "$Q"
cp "$M/transformer/config.json" "$Q/"
if "$TPGEN" quantize --type Q8_0 "$M/transformer" "$Q/klein-Q8_0.gguf" > /dev/null 2>&1; then :
else fail "dialects: tpgen quantize Q8_0 failed"; fi
for a in lycoris_lokr_full comfy_bfl_lokr_lowrank lycoris_loha comfy_bfl_loha fal_klein_peft; do
    out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/gguf" --lora "$G/adapters/$a.safetensors:0.7" 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then
        ok "dialects: $a on GGUF Q8_0 weights (unmerged), tp 2 = unsharded ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
    else fail "dialects: $a on GGUF: rc=$rc $(echo "$out" | grep -E 'error|max_rel' | head -2 | tr '\n' ' ')"; fi
done
out=$(TPGEN_LORA_DIALECTS_MODELS="$M" TPGEN_LORA_DIALECTS_GGUF="$Q/klein-Q8_0.gguf" \
      $MPIRUN -np 2 "$TPGEN_TESTS" --mpi lora_dialects_unmerged 2>&1)
if [ "$(echo "$out" | grep -c '^ok - lora_dialects_unmerged')" = 1 ] && ! echo "$out" | grep -q FAIL; then
    ok "dialects: fp8 and GGUF + LoKr/LoHa/fal unmerged = merged into the dequantised twins (tp 2)"
else fail "dialects: unmerged vs twins: $(echo "$out" | grep -E 'FAIL' | head -3)"; fi

# ---- inspect --lora
out=$("$TPGEN" inspect --model "$M" --tp 2 --lora "$G/adapters/lycoris_lokr_bothlowrank.safetensors:0.5" 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q 'format lycoris, rank 2, scale 1.5, weight 0.5, 28 modules, dialect LoKr' &&
   echo "$out" | grep -E '^ +transformer_blocks_0_attn_to_k +transformer_blocks\.0\.attn\.to_k\.weight' | grep -qE 'LoKr +[0-9]+x[0-9]+/r2\(x\)[0-9]+x[0-9]+/r2 +0\.75$'; then
    ok "dialects: inspect --lora names the dialect, the factors and the coefficient per module"
else fail "dialects: inspect LoKr: rc=$rc $(echo "$out" | grep -E 'LoRA|to_k' | head -3 | tr '\n' ' ')"; fi
out=$("$TPGEN" inspect --model "$M" --tp 2 --json --lora "$G/adapters/comfy_bfl_loha.safetensors" 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | python3 -c "import json,sys
j=json.load(sys.stdin); a=j['loras'][0]
t=[x for x in a['targets'] if x['module']=='double_blocks.0.img_attn.qkv']
assert a['dialect']=='LoHa' and a['scale']==1.5 and len(t)==3 and {x['tensor'].split('.')[-2] for x in t}=={'to_q','to_k','to_v'}, a['dialect']" 2>&1; then
    ok "dialects: inspect --json: a BFL LoHa on the fused qkv targets to_q, to_k, to_v"
else fail "dialects: inspect --json LoHa: rc=$rc $(echo "$out" | tail -2)"; fi

out=$("$TPGEN" inspect --model "$M" --tp 2 --lora "$G/adapters/fal_dev_bfl_guidance.safetensors" 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q 'format aitk, rank 4, scale 1, weight 1, 28 modules, dialect LoRA' &&
   echo "$out" | grep -q 'unmatched: 2 module(s) match no weight of this transformer (a run refuses the adapter): guidance_in.in_layer guidance_in.out_layer'; then
    ok "dialects: inspect --lora lists a dev adapter's guidance_in modules as unmatched on klein"
else fail "dialects: inspect unmatched: rc=$rc $(echo "$out" | grep -E 'LoRA|unmatched' | head -2 | tr '\n' ' ')"; fi

# ---- refusals, on every rank, naming the adapter, the module and what is wrong
B=$TMP/bad
mkdir -p "$B"
python3 "$TPGEN_ROOT/tests/tools/bad_lora_dialects.py" "$B"
refuse() {   # FILE PATTERN WHAT
    expect_fail "dialects: refused: $3" "$2" $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$M/transformer" --lora "$1"
}
refuse "$B/kron_shape.safetensors" "kron_shape.safetensors: module transformer_blocks_0_attn_to_q: its LoKr delta is \[120, 128\].*not the module's shape" "LoKr factors of the wrong product"
refuse "$B/loha_shape.safetensors" "loha_shape.safetensors: module transformer_blocks.0.attn.to_out.0: LoHa factors .* do not make two products" "LoHa factors of two shapes"
refuse "$B/nan.safetensors" "nan.safetensors: key lycoris_transformer_blocks_0_attn_to_q.lokr_w2 has a non-finite value" "a NaN in a factor"
refuse "$B/inf_alpha.safetensors" "inf_alpha.safetensors: key lycoris_transformer_blocks_0_attn_to_q.alpha: alpha is inf" "a non-finite scale"
refuse "$B/two_dialects.safetensors" "module double_blocks.0.img_attn.proj is named twice, by two dialects: .*lora_A.weight \(LoRA\) and .*lokr_w1 \(LoKr\)" "one module in two dialects"
refuse "$B/two_names.safetensors" "modules double_blocks.0.img_attn.proj and transformer_blocks.0.attn.to_out.0 both target tensor" "one module under a BFL diff and a diffusers LoHa"
refuse "$B/tucker.safetensors" "lokr_t2 is a LyCORIS Tucker core" "Tucker"
refuse "$B/unknown.safetensors" "unknown.safetensors: no known adapter dialect .*first keys are: model.layers.0.mlp.gate.weight, model.layers.0.mlp.up.weight" "no known dialect"
refuse "$G/adapters/fal_dev_bfl_guidance.safetensors" "guidance_in.in_layer' matches no Linear" "guidance_in on klein (no guidance embedder)"
refuse "$B/diff_b_only.safetensors" "diff_b_only.safetensors: every module of the file is a .diff_b bias patch \(2\).*would change nothing" "only bias patches"
