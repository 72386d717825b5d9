# budget: 1 s; checks: 1
# Hangs past the hard time limit that the meta-test sets (TPGEN_HARD_LIMIT).
echo "ok - hang before"
sleep 60
