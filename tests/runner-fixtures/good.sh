# budget: 1 s; checks: 2
# A file that passes: two checks, exit 0.
echo "ok - good one"
echo "# a comment line"
echo "ok - good two"
