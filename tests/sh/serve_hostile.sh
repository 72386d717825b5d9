#!/usr/bin/env bash
# budget: 120 s; checks: 25
# `tpgen serve` against hostile clients (issue 21), on a make-tiny model at
# tp 2, 127.0.0.1 only, every test bounded in count and time: the pre-auth
# crash request (a multipart part without Content-Disposition), unauthenticated
# 45 MB uploads answered 401 on their headers without rank 0 buffering them;
# 250 idle and slowloris connections (/health within 1 s, 503 at once past
# --max-connections, all closed at the header deadline, the keep-alive idle
# timeout) and the per-address limit; work nobody waits for: a client that
# hangs up mid-render frees the server within one step, one that hangs up
# while queued is dropped, also on the second TP group at dp 2,
# --request-timeout answers 504; SIGTERM at dp 2
# with requests arriving after it (all 503, the running renders finish,
# exit 0); on the release build and on the ASan + UBSan build; and a leak soak:
# 1000 mixed requests, rank 0 growing by at most 5 MB after the first 100.
# This file runs them on the release build; serve_hostile_asan.sh on the
# sanitized build and serve_soak.sh the soak, side by side (tests/lib_hostile.sh).
. "$TPGEN_ROOT/tests/lib.sh"
. "$TPGEN_ROOT/tests/lib_hostile.sh"
hostile_build release
