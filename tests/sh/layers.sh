#!/usr/bin/env bash
# budget: 10 s; checks: 5
# The layer order (docs/architecture.md): no file includes or calls a file of
# a higher layer, and no call circles in the front ends, the pipeline and the
# models (tests/tools/layers.py). Checked on the tree and on build/'s objects,
# then on small made-up trees that break each rule, so the check can fail.
. "$TPGEN_ROOT/tests/lib.sh"
L="python3 $TPGEN_ROOT/tests/tools/layers.py"
if out=$($L "$TPGEN_ROOT" "$TPGEN_ROOT/build" 2>&1); then
    ok "layers: includes and calls follow the layer order ($(echo "$out" | tail -1 | sed 's/^# //'))"
else
    fail "layers: $(echo "$out" | head -5)"
fi

# a made-up tree: one file per layer, built into objects
mk() { mkdir -p "$(dirname "$T/$1")"; printf '%s\n' "$2" >"$T/$1"; }
objs() {
    rm -rf "$T/build"
    for c in $(cd "$T" && find . -name '*.c' | sed 's#^\./##'); do
        mkdir -p "$T/build/$(dirname "$c")"
        gcc -c -I"$T" -o "$T/build/${c%.c}.o" "$T/$c" || return 1
    done
}
fresh() {
    T=$TMP/tree$1; rm -rf "$T"
    mk kernels/k.h 'int k(void);'
    mk kernels/k.c '#include "k.h"
int k(void) { return 1; }'
    mk core/formats/f.h 'int f(void);'
    mk core/formats/f.c '#include "f.h"
#include "kernels/k.h"
int f(void) { return k(); }'
    mk core/models/m.c '#include "core/formats/f.h"
int m(void) { return f(); }'
}
fresh 0; objs && $L "$T" "$T/build" >/dev/null && ok "layers: a tree in order passes" || fail "layers: a tree in order fails"

fresh 1; mk kernels/bad.c '#include "core/formats/f.h"'
out=$($L "$T" 2>&1) && fail "layers: kernels including core/formats passed" ||
    { echo "$out" | grep -q 'kernels/bad.c:1: includes core/formats/f.h: layer 5 (kernels) may not include layer 3' &&
      ok "layers: an upward include is named (file, line, layers)" || fail "layers: message: $out"; }

fresh 2; mk kernels/up.c 'int f(void);
int up(void) { return f(); }'
objs; out=$($L "$T" "$T/build" 2>&1) && fail "layers: kernels calling core/formats passed" ||
    { echo "$out" | grep -q 'kernels/up.o calls f of core/formats/f' && ok "layers: an upward call (no include) is named" ||
      fail "layers: message: $out"; }

fresh 3; mk core/models/a.c 'int b(void);
int a(int n) { return n ? b() : 0; }'; mk core/models/b.c 'int a(int);
int b(void) { return a(0); }'
objs; out=$($L "$T" "$T/build" 2>&1) && fail "layers: a call circle in core/models passed" ||
    { echo "$out" | grep -q 'call circle: core/models/a -> core/models/b' && ok "layers: a call circle inside core/models is named" ||
      fail "layers: message: $out"; }
