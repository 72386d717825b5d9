# Helpers for the tests of `tpgen serve` (sourced by tests/sh/serve*.sh after
# tests/lib.sh, with M set to the model folder).
# start_server LOG TPGEN_BINARY ARGS...: sets SRV (mpirun's pid), PORT, R0 (world rank 0's pid)
start_server() {
    local log=$1 bin=$2; shift 2
    $MPIRUN -np "${NP:-2}" "$bin" serve --model "$M" --listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
    SRV=$!
    PORT= R0=
    for _ in $(seq 1 300); do
        if grep -q "ready after" "$log"; then
            PORT=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$log" | head -1)
            R0=$(sed -n 's/.*to pid \([0-9]*\).*/\1/p' "$log" | head -1)
            return 0
        fi
        kill -0 $SRV 2>/dev/null || break
        sleep 0.2
    done
    return 1
}
# wait_exit SECONDS: mpirun's exit status, or 124 after SECONDS (then killed)
wait_exit() {
    for _ in $(seq 1 $(($1 * 5))); do
        if ! kill -0 $SRV 2>/dev/null; then wait $SRV; return $?; fi
        sleep 0.2
    done
    kill -9 $SRV 2>/dev/null; wait $SRV 2>/dev/null
    return 124
}
stop_server() { kill -USR1 $SRV 2>/dev/null; wait_exit 30; }
