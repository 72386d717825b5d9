# budget: 1 s; checks: 1
# Dies on a signal after one check, without a FAIL line.
echo "ok - crash before"
kill -SEGV $$
