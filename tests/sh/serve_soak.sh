#!/usr/bin/env bash
# budget: 120 s; checks: 2
# The leak soak of `tpgen serve` (tests/lib_hostile.sh): 1000 mixed requests
# (generations, edits, bad requests, clients that hang up, probes) on the
# make-tiny model at tp 2; world rank 0's resident memory grows by at most
# 5 MB after the first 100.
. "$TPGEN_ROOT/tests/lib.sh"
. "$TPGEN_ROOT/tests/lib_hostile.sh"
hostile_soak
