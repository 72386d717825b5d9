# budget: 1 s; checks: 1
# An internal error printed by a command whose status the script ignored.
echo "ok - internal before"
echo "tpgen: internal error: a check that cannot fail failed (core/x.c:1)"
