# A file without its budget line.
echo "ok - noheader one"
