#!/usr/bin/env bash
# Line coverage of each parser by a fuzz corpus: fuzz/coverage.sh [CORPUS_ROOT]
# builds each harness with clang source-based coverage (build-fuzz-cov/),
# runs every input of CORPUS_ROOT/NAME once (default: the corpora that
# `make fuzz` grew in build-fuzz/run/NAME/corpus, else fuzz/corpus/NAME)
# and prints llvm-cov's line coverage of the parser files of that harness
# (FUZZ_COV_NAMES="gguf" for some of them only).
set -eu
cd "$(dirname "$0")/.."
root=${1:-}
out=build-fuzz-cov
mkdir -p "$out"
CF="-std=c17 -D_GNU_SOURCE -O1 -g -fopenmp -I. $(mpicc --showme:compile) -I/usr/include/x86_64-linux-gnu/openblas-openmp"
LIBS="-L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lyaml -ljansson -lpcre2-8 -lutf8proc -lnettle -lmicrohttpd -lz -lm $(mpicc --showme:link) -ldl -rdynamic"
src=$(ls core/*.c core/*/*.c plans/*.c kernels/*.c kernels/cpu/*.c cli/*.c cli/bench/*.c | grep -v '^cli/main.c$')
declare -A files=(
    [safetensors]="core/formats/safetensors.c core/formats/checkpoint.c plans/plan.c"
    [runspec]="cli/runspec.c cli/generate_jobs.c cli/generate_prompts.c"
    [tokenizer]="core/models/tokenizer/tokenizer.c core/models/tokenizer/tokenizer_hf.c core/models/tokenizer/tokenizer_scan.c core/models/tokenizer/tokenizer_tekken.c core/models/tokenizer/tokenizer_vocab.c"
    [config]="core/models/flux2/flux2_host.c plans/flux2_plan.c core/models/llm/llm.c core/models/vae/vae_config.c core/formats/checkpoint.c"
    [gguf]="core/formats/gguf.c core/formats/gguf_access.c core/formats/gguf_write.c kernels/quant.c"
)
if [ ! -f "$out/lib.a" ]; then
    objs=()
    for f in $src; do
        o=$out/obj/${f%.c}.o; mkdir -p "$(dirname "$o")"
        clang $CF -fprofile-instr-generate -fcoverage-mapping -c -o "$o" "$f"; objs+=("$o")
    done
    ar rcs "$out/lib.a" "${objs[@]}"
fi
for name in ${FUZZ_COV_NAMES:-safetensors runspec tokenizer config gguf}; do
    corpus=${root:+$root/$name}
    [ -n "$corpus" ] || { corpus=build-fuzz/run/$name/corpus; [ -d "$corpus" ] || corpus=fuzz/corpus/$name; }
    bin=$out/fuzz_$name
    clang $CF -fprofile-instr-generate -fcoverage-mapping -fsanitize=fuzzer -o "$bin" fuzz/fuzz_$name.c "$out/lib.a" $LIBS
    rm -f "$out/$name.profraw"
    LLVM_PROFILE_FILE="$out/$name.profraw" "$bin" -runs=0 "$corpus" >/dev/null 2>&1 || true
    llvm-profdata merge -sparse -o "$out/$name.profdata" "$out/$name.profraw"
    echo "# fuzz_$name ($(ls "$corpus" | wc -l) inputs from $corpus)"
    llvm-cov report "$bin" -instr-profile="$out/$name.profdata" ${files[$name]} |
        awk '$2 ~ /^[0-9]+$/ { printf "  %-22s %5d lines, %5d missed: line coverage %s\n", $1, $8, $9, $10 }'
done
