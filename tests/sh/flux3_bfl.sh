#!/usr/bin/env bash
# budget: 25 s; checks: 21
# `tpgen check` on FLUX.3 transformers in Black Forest Labs single-file names:
# the golden flux3-tiny base and flow-map models renamed by
# tests/tools/flux3_bfl_testdata.py (the files whose sha256, in
# tests/data/flux3-bfl, diffusers' converter mapped back to the golden tensors),
# in a folder without config.json (derived from the shapes), with the golden
# config.json beside it, and behind model.diffusion_model.: against diffusers'
# outputs (4 cases each, 2 with reference tokens) at tp 1, 2, 3, with the same
# errors as the diffusers-named folder; its errors; a FLUX.2 BFL file still
# loads as FLUX.2.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
R=$TPGEN_ROOT/tests/tools/flux3_bfl_testdata.py
python3 "$R" "$TPGEN_GOLDEN/flux3-tiny" "$TMP/bfl" --no-verify --raw
python3 "$R" "$TPGEN_GOLDEN/flux3-tiny" "$TMP/dm" --no-verify --raw --prefix
if (cd "$TMP/bfl" && sha256sum --quiet -c "$TPGEN_ROOT/tests/data/flux3-bfl/flux3-bfl.sha256") &&
    [ "$(ls "$TMP/bfl/base")" = "flux3-tiny-bfl.safetensors" ]; then
    ok "flux3 bfl: files written, the ones diffusers' converter maps back to the golden tensors"
else fail "flux3 bfl: files: $(cd "$TMP/bfl" && sha256sum */*)"; fi
for v in base flowmap; do   # the same file beside the golden config.json
    mkdir -p "$TMP/cfg/$v" && cp "$TMP/bfl/$v/flux3-tiny-bfl.safetensors" "$TPGEN_GOLDEN/flux3-tiny/$v/model/transformer/config.json" "$TMP/cfg/$v/"
done

lines() { echo "$1" | grep -E '^case[0-9]+ rel_err=|^max_rel_err='; }
for v in base flowmap; do
    G=$TPGEN_GOLDEN/flux3-tiny/$v
    CASES=$G/transformer_cases.safetensors
    for np in 1 2 3; do
        d=$($MPIRUN -np $np "$TPGEN" check --backend cpu --model "$G/model" --cases "$CASES" --tol 1e-4 2>&1)
        for layout in bfl cfg dm; do
            [ $layout != bfl ] && [ $np = 2 ] && continue   # the other layouts at tp 1 and 3
            b=$($MPIRUN -np $np "$TPGEN" check --backend cpu --model "$TMP/$layout/$v" --cases "$CASES" --tol 1e-4 2>&1); rc=$?
            if [ $rc -eq 0 ] && echo "$b" | grep -q '^# FLUX.3 transformer' && echo "$b" | grep -qE '^max_rel_err=.* PASS$' &&
                [ "$(lines "$b" | grep -c '^case')" -eq 4 ] && [ "$(lines "$b")" = "$(lines "$d")" ]; then
                ok "flux3 bfl: $v ($layout) check golden f32 tp=$np, the diffusers folder's errors ($(echo "$b" | grep '^max_rel_err'))"
            else fail "flux3 bfl: $v ($layout) check tp=$np: rc=$rc [$(lines "$b" | tr '\n' ' ')] vs [$(lines "$d" | tr '\n' ' ')] $(echo "$b" | tail -2 | tr '\n' ' ')"; fi
        done
    done
done
G=$TPGEN_GOLDEN/flux3-tiny/base
CASES=$G/transformer_cases.safetensors
b=$($MPIRUN -np 3 "$TPGEN" check --backend cpu --model "$TMP/bfl/base" --cases "$CASES" --precision bf16 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$b" | grep -qE '^max_rel_err=.* PASS$'; then ok "flux3 bfl: base check golden bf16 tp=3 ($(echo "$b" | grep '^max_rel_err'))"
else fail "flux3 bfl: base bf16 tp=3: rc=$rc $(echo "$b" | tail -2 | tr '\n' ' ')"; fi

# errors: a tensor missing from the BFL file is named (with and without config.json), on every rank, no hang
S=$TPGEN_ROOT/tests/tools/st_rename.py
mkdir -p "$TMP/miss" "$TMP/miss2" "$TMP/nomod"
python3 "$S" "$TMP/bfl/base/flux3-tiny-bfl.safetensors" "$TMP/miss/x.safetensors" --drop single_blocks.1.mlp_out.weight
expect_fail "flux3 bfl: missing tensor named" "miss: tensor single_blocks\.1\.mlp_out\.weight missing from the FLUX.3 BFL checkpoint" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/miss" --cases "$CASES"
python3 "$S" "$TMP/bfl/base/flux3-tiny-bfl.safetensors" "$TMP/miss2/x.safetensors" --drop txt_in.weight
expect_fail "flux3 bfl: config not derivable, names the tensor and the file" "miss2: FLUX.3 BFL checkpoint has no tensor txt_in\.weight" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/miss2" --cases "$CASES"
python3 "$S" "$TMP/bfl/base/flux3-tiny-bfl.safetensors" "$TMP/nomod/x.safetensors" --drop early_stream_modulations.image.lin.weight
expect_fail "flux3 bfl: a file without the FLUX.3 key is not taken for FLUX.3 BFL" "config.json is missing" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/nomod" --cases "$CASES"

# a FLUX.2 BFL file still loads as FLUX.2
mkdir -p "$TMP/f2"
if TPGEN_BFL_OUT="$TMP/f2" "$TPGEN_TESTS" bfl_write_golden_as_bfl | grep -q '^ok - '; then
    out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/f2" --cases "$TPGEN_GOLDEN/flux2-tiny-a/transformer_cases.safetensors" 2>&1); rc=$?
    if [ $rc -eq 0 ] && ! echo "$out" | grep -q 'FLUX.3' && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then
        ok "flux3 bfl: a FLUX.2 BFL file still checks as FLUX.2 ($(echo "$out" | grep '^max_rel_err'))"
    else fail "flux3 bfl: FLUX.2 BFL: rc=$rc $(echo "$out" | tail -3 | tr '\n' ' ')"; fi
else fail "flux3 bfl: writing the FLUX.2 BFL file failed"; fi

# generate from a FLUX.3 pipeline folder whose transformer/ is the BFL file (no config.json):
# bit for bit the latents of the diffusers-named folder, at np 2
P3=$TPGEN_ROOT/tests/data/flux3-pipe/base_t2i.safetensors
flux3_folder base "$TMP/pd"
mkdir -p "$TMP/pb" && ln -s "$TMP/bfl/base" "$TMP/pb/transformer" && ln -s "$TPGEN_GOLDEN/vae-tiny/model/vae" "$TMP/pb/vae" &&
    cp "$TPGEN_ROOT/tests/data/flux3-pipe/base_modular_model_index.json" "$TMP/pb/modular_model_index.json"
for x in pb pd; do
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/$x" --prompt-embeds "$P3" --negative-prompt-embeds "$P3" --seed 42 \
        --steps 3 --width 64 --height 48 --precision f32 --backend cpu --no-decode --save-latents "$TMP/$x.st" \
        >"$TMP/$x.log" 2>&1 || echo "rc=$?" >>"$TMP/$x.log"
done
if [ -s "$TMP/pb.st" ] && cmp -s "$TMP/pb.st" "$TMP/pd.st"; then ok "flux3 bfl: generate np=2 from a BFL transformer/ gives the diffusers folder's latents"
else fail "flux3 bfl: generate: $(tail -2 "$TMP/pb.log" | tr '\n' ' ')"; fi
