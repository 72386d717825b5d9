# budget: 1 s; checks: 1
# Exits non-zero without saying why.
echo "ok - silent before"
exit 3
