#!/usr/bin/env bash
# budget: 20 s; checks: 25
# Command-line tests of `tpgen tokenize`: ids against the golden tokens.json
# (Qwen3, via a pipeline folder, a tokenizer folder and a GGUF), the dev layout and
# padding, mpirun behaviour, and clear failures on bad input.
source "$TPGEN_ROOT/tests/lib.sh"
cd "$TPGEN_ROOT"
G=$TPGEN_GOLDEN
KLEIN=$G/klein-tiny/model
QWEN=tests/data/qwen3-tokenizer
TEK=tests/data/tekken-mini

# klein chat layout through the pipeline folder: every golden case
n=$(jq '.cases | length' "$G/klein-tiny/tokens.json")
for ((i = 0; i < n; i++)); do
    want=$(jq -c ".cases[$i].chat_ids" "$G/klein-tiny/tokens.json")
    got=$(jq -j ".cases[$i].prompt" "$G/klein-tiny/tokens.json" | "$TPGEN" tokenize --model "$KLEIN" --prompt - --chat --json | jq -c .ids)
    [ "$got" = "$want" ] && ok "tokenize_klein_chat_case$i" || fail "tokenize_klein_chat_case$i: got $got, expected $want"
done

# raw ids, prompt with tabs, CR/LF and trailing spaces from standard input
want=$(jq -c '.cases[7].ids' "$G/qwen3-tokenizer/tokens.json")
got=$(jq -j '.cases[7].prompt' "$G/qwen3-tokenizer/tokens.json" | "$TPGEN" tokenize --model "$QWEN" --prompt - --json | jq -c .ids)
[ "$got" = "$want" ] && ok "tokenize_raw_stdin" || fail "tokenize_raw_stdin: got $got, expected $want"

# --max-length: the chat ids, then right padding with <|endoftext|> (151643), mask 1/0
chat=$(jq -c '.cases[0].chat_ids' "$G/klein-tiny/tokens.json")
out=$("$TPGEN" tokenize --model "$KLEIN" --prompt "$(jq -r '.cases[0].prompt' "$G/klein-tiny/tokens.json")" --chat --max-length 32 --json)
m=$(echo "$chat" | jq length)
if [ "$(echo "$out" | jq -c ".ids[:$m]")" = "$chat" ] && [ "$(echo "$out" | jq -c "[.ids[$m:][] | select(. != 151643)] | length")" = 0 ] &&
   [ "$(echo "$out" | jq '.ids | length')" = 32 ] && [ "$(echo "$out" | jq '.mask | add')" = "$m" ] &&
   [ "$(echo "$out" | jq -c ".mask[$((m - 1)):$((m + 1))]")" = "[1,0]" ]; then
    ok "tokenize_max_length_right_pad"
else
    fail "tokenize_max_length_right_pad: $out"
fi

# dev layout on the Tekken mini tokenizer, both file forms: BOS [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT] [INST] ... [/INST]
for form in hf tekken; do
    out=$("$TPGEN" tokenize --model "$TEK/$form" --prompt "hello[IMG]" --chat --json)
    if [ "$(echo "$out" | jq -c '.ids[:2]')" = "[1,17]" ] && [ "$(echo "$out" | jq -c '.ids[-4:]')" = "[18,3,1259,4]" ]; then
        ok "tokenize_dev_layout_$form"
    else
        fail "tokenize_dev_layout_$form: $out"
    fi
done
a=$("$TPGEN" tokenize --model "$TEK/hf" --prompt "helloWorld ABc 2024" --json)
b=$("$TPGEN" tokenize --model "$TEK/tekken" --prompt "helloWorld ABc 2024" --json)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "tokenize_tekken_forms_agree" || fail "tokenize_tekken_forms_agree: '$a' vs '$b'"
# left padding from the hf config
out=$("$TPGEN" tokenize --model "$TEK/hf" --prompt "hello" --format raw --max-length 4 --json)
[ "$out" = '{"ids": [11, 11, 11, 1259], "mask": [0, 0, 0, 1]}' ] && ok "tokenize_left_pad" || fail "tokenize_left_pad: $out"

# --model naming the file itself (its folder's config still applies: left padding)
out=$("$TPGEN" tokenize --model "$TEK/hf/tokenizer.json" --prompt "hello" --max-length 2 --json)
[ "$out" = '{"ids": [11, 1259], "mask": [0, 1]}' ] && ok "tokenize_model_file_path" || fail "tokenize_model_file_path: $out"

# under mpirun: one line of output, from rank 0
out=$($MPIRUN -np 2 "$TPGEN" tokenize --model "$QWEN" --prompt "Hello World" --json 2>&1)
[ "$out" = '{"ids": [9707, 4337]}' ] && ok "tokenize_mpirun_prints_once" || fail "tokenize_mpirun_prints_once: $out"

# failures
expect_fail "tokenize_missing_model" "does not exist" "$TPGEN" tokenize --model "$TMP/nothing" --prompt x
mkdir -p "$TMP/empty"
expect_fail "tokenize_no_tokenizer_files" "tokenizer.json" "$TPGEN" tokenize --model "$TMP/empty" --prompt x
mkdir -p "$TMP/wp"
echo '{"model": {"type": "WordPiece", "vocab": {"a": 0}}}' > "$TMP/wp/tokenizer.json"
expect_fail "tokenize_wordpiece" "WordPiece.*byte-level BPE" "$TPGEN" tokenize --model "$TMP/wp" --prompt x
expect_fail "tokenize_invalid_utf8" "not valid UTF-8.*offset 3" "$TPGEN" tokenize --model "$QWEN" --prompt $'abc\xff'
expect_fail "tokenize_bad_format" "unknown prompt format" "$TPGEN" tokenize --model "$QWEN" --prompt x --format chatml
expect_fail "tokenize_usage" "required" "$TPGEN" tokenize --model "$QWEN"
out=$($MPIRUN -np 2 "$TPGEN" tokenize --model "$TMP/nothing" --prompt x 2>&1); rc=$?
if [ $rc -ne 0 ] && [ "$(echo "$out" | grep -c 'tpgen: error')" = 1 ]; then
    ok "tokenize_mpirun_error_once"
else
    fail "tokenize_mpirun_error_once: rc $rc: $out"
fi

# a GGUF file's tokenizer.ggml.* metadata (tests/data/tok-gguf, made by tests/tools/tok_gguf_testdata.py)
xz -dc tests/data/tok-gguf/qwen3.gguf.xz > "$TMP/qwen3.gguf"
n=$(jq '.cases | length' "$G/klein-tiny/tokens.json")
bad=""
for ((i = 0; i < n; i++)); do
    want=$(jq -c ".cases[$i].chat_ids" "$G/klein-tiny/tokens.json")
    got=$(jq -j ".cases[$i].prompt" "$G/klein-tiny/tokens.json" | "$TPGEN" tokenize --model "$TMP/qwen3.gguf" --prompt - --chat --json | jq -c .ids)
    [ "$got" = "$want" ] || bad="$bad case$i"
done
[ -z "$bad" ] && [ "$n" -gt 2 ] && ok "tokenize_gguf_klein_chat ($n cases)" || fail "tokenize_gguf_klein_chat:$bad"
a=$("$TPGEN" tokenize --model "$TMP/qwen3.gguf" --prompt "Hello World" --max-length 6 --json)
b=$("$TPGEN" tokenize --model "$QWEN" --prompt "Hello World" --max-length 6 --json)
[ "$a" = '{"ids": [9707, 4337, 151643, 151643, 151643, 151643], "mask": [1, 1, 0, 0, 0, 0]}' ] && [ "$a" = "$b" ] &&
    ok "tokenize_gguf_right_pad" || fail "tokenize_gguf_right_pad: '$a' vs '$b'"
for f in tekken-hf tekken-mistral; do
    out=$("$TPGEN" tokenize --model tests/data/tok-gguf/$f.gguf --prompt "hello" --format raw --max-length 4 --json)
    [ "$out" = '{"ids": [11, 11, 11, 1259], "mask": [0, 0, 0, 1]}' ] && ok "tokenize_gguf_${f}_left_pad" || fail "tokenize_gguf_${f}_left_pad: $out"
done
a=$("$TPGEN" tokenize --model tests/data/tok-gguf/tekken-mistral.gguf --prompt "helloWorld [IMG]ABc" --chat --json)
b=$("$TPGEN" tokenize --model "$TEK/tekken" --prompt "helloWorld [IMG]ABc" --chat --json)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "tokenize_gguf_dev_layout" || fail "tokenize_gguf_dev_layout: '$a' vs '$b'"
expect_fail "tokenize_gguf_without_tokenizer" "types.gguf has no tokenizer" "$TPGEN" tokenize --model tests/data/gguf/types.gguf --prompt x
head -c 4000 "$TMP/qwen3.gguf" > "$TMP/cut.gguf"
expect_fail "tokenize_gguf_truncated" "cut.gguf" "$TPGEN" tokenize --model "$TMP/cut.gguf" --prompt x
