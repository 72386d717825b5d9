# budget: 1 s; checks: 1
# Open MPI's own line for a rank that aborted, with exit status 0 from the script.
echo "ok - mpisig before"
echo "mpirun noticed that process rank 1 with PID 4242 on node ci exited on signal 6 (Aborted)."
