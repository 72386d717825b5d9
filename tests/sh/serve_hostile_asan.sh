#!/usr/bin/env bash
# budget: 150 s; checks: 25
# The hostile-client cases of tests/sh/serve_hostile.sh on the ASan + UBSan +
# LeakSanitizer build (tests/lib_hostile.sh): every server exits cleanly with
# no sanitizer report.
. "$TPGEN_ROOT/tests/lib.sh"
. "$TPGEN_ROOT/tests/lib_hostile.sh"
hostile_build asan
