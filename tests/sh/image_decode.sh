#!/usr/bin/env bash
# budget: 85 s; checks: 69
# Reference images built to hurt the decoder (issue 21 item 3): each file
# is made here (tests/tools/craft_image.py, tests/tools/mkjpeg.c) and must
# be refused with a clear error, a non-zero exit and no crash, in bounded
# time and memory, on the release build and under ASan + UBSan: a DHT
# declaring 300 codes, a DC symbol past the table, a Huffman code past
# every table, a repeated progressive scan (3000 times), a valid
# progression of 2000 tiny scans, truncated files, bad CRCs, a PNG
# declaring 8192x8192 with 64 rows of data. The bounded worst cases that
# are accepted decode within limits: the largest PNG (64 Mpx) and a
# progressive JPEG at the scan limit (100 scans, 64 Mpx).
[ -n "${TPGEN_ROOT:-}" ] && [ -n "${TPGEN:-}" ] && [ -n "${TPGEN_GOLDEN:-}" ] || { echo "FAIL - image_decode.sh: run it through tests/run.sh"; exit 1; }
. "$TPGEN_ROOT/tests/lib.sh"
CRAFT="python3 $TPGEN_ROOT/tests/tools/craft_image.py"
D=$TPGEN_ROOT/tests/data/image
KM=$TPGEN_GOLDEN/klein-tiny/model
H=$TMP/img
mkdir -p "$H"

# bounded NAME PATTERN SECONDS MB CMD...: expect_fail, within SECONDS of wall time and MB of peak RSS
bounded() {
    local name=$1 pat=$2 sec=$3 mb=$4; shift 4
    expect_fail "$name" "$pat" /usr/bin/time -f "%e %M" -o "$TMP/time" "$@"
    local t kb; read -r t kb < <(tail -1 "$TMP/time")
    if awk -v t="$t" -v s="$sec" 'BEGIN { exit !(t < s) }' && [ "$kb" -lt $((mb * 1024)) ]; then ok "$name: bounded (${t} s, $((kb / 1024)) MB)"
    else fail "$name: took ${t} s and $((kb / 1024)) MB (limits $sec s, $mb MB)"; fi
}

MKJPEG=$TMP/mkjpeg
cc -O2 -o "$MKJPEG" "$TPGEN_ROOT/tests/tools/mkjpeg.c" -ljpeg || { fail "building tests/tools/mkjpeg.c (libjpeg62-turbo-dev)"; exit 0; }
$CRAFT dht "$H/dht300.jpg" "$D/orient1.jpg"
$CRAFT dcsym "$H/dcsym.jpg" "$D/orient1.jpg"
$CRAFT badcode "$H/badcode.jpg" "$D/orient6.jpg"
"$MKJPEG" photo "$H/prog_base.jpg" 512 512 90   # a baseline file to cut
$CRAFT rescan "$H/rescan3000.jpg" "$D/orient7_progressive.jpg" 3000
"$MKJPEG" scans "$H/scans2000.jpg" 1024 1024 2000 10
$CRAFT cut "$H/cut_half.jpg" "$H/prog_base.jpg" 20000
$CRAFT cut "$H/no_eoi.jpg" "$D/orient1.jpg" -2
$CRAFT cut "$H/cut_prog.jpg" "$D/orient7_progressive.jpg" 400
$CRAFT cut "$H/cut.png" "$D/interlaced.png" 600
$CRAFT crc "$H/crc_idat.png" "$D/palette.png" IDAT
$CRAFT crc "$H/crc_ihdr.png" "$D/grey16.png" IHDR
$CRAFT crc "$H/crc_ztxt.png" "$D/orient8_raw.png" zTXt
$CRAFT pngbig "$H/big_tiny.png" 8192 8192 tiny
$CRAFT pngbig "$H/big_over.png" 8193 8192 tiny
"$MKJPEG" scans "$H/scans101.jpg" 64 64 101 1
"$MKJPEG" photo "$H/small.jpg" 64 64 90
$CRAFT flood "$H/app1_flood.jpg" "$H/small.jpg" 2000000   # libjpeg's marker saving was quadratic in these
$CRAFT pngbig "$H/black64.png" 64 64 full
$CRAFT flood "$H/text_flood.png" "$H/black64.png" 500000

cases() { # BIN PREFIX: each file through encode-image (the image is read before any weight)
    local b=$1 p=$2
    local enc=("$b" encode-image --model "$KM" --output "$H/out.st" --backend cpu --image)
    bounded "${p}jpeg DHT with 300 codes" "dht300.jpg: cannot decode it \(Bogus Huffman table definition\)" 5 300 "${enc[@]}" "$H/dht300.jpg"
    bounded "${p}jpeg DC symbol past the table" "dcsym.jpg: cannot decode it \(Bogus Huffman table" 5 300 "${enc[@]}" "$H/dcsym.jpg"
    bounded "${p}jpeg Huffman code past every table" "badcode.jpg: cannot decode it \(Corrupt JPEG data: bad Huffman code\)" 5 300 "${enc[@]}" "$H/badcode.jpg"
    bounded "${p}jpeg a scan repeated 3000 times" "rescan3000.jpg: cannot decode it \(Inconsistent progression|rescan3000.jpg: the JPEG has more than 100 scans" 5 300 "${enc[@]}" "$H/rescan3000.jpg"
    bounded "${p}jpeg 2000 valid tiny scans" "scans2000.jpg: the JPEG has more than 100 scans; refused" 5 300 "${enc[@]}" "$H/scans2000.jpg"
    bounded "${p}jpeg 101 scans (one over the limit)" "scans101.jpg: the JPEG has more than 100 scans" 5 300 "${enc[@]}" "$H/scans101.jpg"
    bounded "${p}jpeg cut in half" "cut_half.jpg: cannot decode it \(Premature end of JPEG file\)" 5 300 "${enc[@]}" "$H/cut_half.jpg"
    bounded "${p}jpeg without its EOI" "no_eoi.jpg: cannot decode it \(Premature end of JPEG file\)" 5 300 "${enc[@]}" "$H/no_eoi.jpg"
    bounded "${p}progressive jpeg cut" "cut_prog.jpg: cannot decode it \(Premature end" 5 300 "${enc[@]}" "$H/cut_prog.jpg"
    bounded "${p}png cut" "cut.png: cannot decode it .*truncated" 5 300 "${enc[@]}" "$H/cut.png"
    bounded "${p}png IDAT CRC" "crc_idat.png: cannot decode it \(IDAT: CRC error\)" 5 300 "${enc[@]}" "$H/crc_idat.png"
    bounded "${p}png IHDR CRC" "crc_ihdr.png: cannot decode it \(IHDR: CRC error\)" 5 300 "${enc[@]}" "$H/crc_ihdr.png"
    bounded "${p}png zTXt CRC" "crc_ztxt.png: cannot decode it \(zTXt: CRC error\)" 5 300 "${enc[@]}" "$H/crc_ztxt.png"
    bounded "${p}png 8192x8192 declared, 64 rows of data" "big_tiny.png: cannot decode it \(Not enough image data\)" 10 600 "${enc[@]}" "$H/big_tiny.png"
    # accepted, in linear time: 2 million empty APP1 segments (8 MB), 500 000 tEXt chunks (7.5 MB)
    local f t kb
    for f in app1_flood.jpg text_flood.png; do
        if /usr/bin/time -f "%e %M" -o "$TMP/time" "${enc[@]}" "$H/$f" >/dev/null 2>&1; then
            read -r t kb < <(tail -1 "$TMP/time")
            awk -v t="$t" 'BEGIN { exit !(t < 10) }' && [ "$kb" -lt $((400 * 1024)) ] && ok "${p}$f decoded in ${t} s, $((kb / 1024)) MB" ||
                fail "${p}$f: ${t} s, $((kb / 1024)) MB (limits 10 s, 400 MB)"
        else
            fail "${p}$f: $("${enc[@]}" "$H/$f" 2>&1 | tail -1)"
        fi
    done
    bounded "${p}png over 64 Mpx, refused from the header" "big_over.png: 8193x8192 pixels is more than the 64 Mpx tpgen decodes" 5 300 "${enc[@]}" "$H/big_over.png"
}
cases "$TPGEN" ""

# the limits of tpgen serve: --max-ref-pixels is range-checked (its effect: tests/test_image_decode.c)
expect_fail "serve --max-ref-pixels out of range" "--max-ref-pixels '10' must be an integer from 4096 to 67108864" \
    "$TPGEN" serve --model "$KM" --max-ref-pixels 10

# ... and applied to uploads: a 4097x4096 PNG header is over the 16 Mpx default, 1100x1000 over a 1 Mpx setting
M=$TMP/tiny
$TPGEN make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "make-tiny"
$CRAFT pngbig "$H/up17.png" 4097 4096 tiny
$CRAFT pngbig "$H/up11.png" 1100 1000 full
serve_edit() { # LOG PNG FLAGS...: the HTTP status and body of one edit request
    local log=$1 png=$2 port=; shift 2
    $MPIRUN -np 1 "$TPGEN" serve --model "$M" --listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
    local srv=$!
    for _ in $(seq 1 300); do
        grep -q "ready after" "$log" && { port=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$log" | head -1); break; }
        kill -0 $srv 2>/dev/null || break
        sleep 0.2
    done
    [ -n "$port" ] && curl -s -m 60 -o "$TMP/edit.json" -w '%{http_code} ' -F prompt=x -F steps=1 -F "image=@$png" \
        "http://127.0.0.1:$port/v1/images/edits" && cat "$TMP/edit.json"
    kill -USR1 $srv 2>/dev/null
    for _ in $(seq 1 150); do kill -0 $srv 2>/dev/null || break; sleep 0.2; done
    kill -9 $srv 2>/dev/null; wait $srv 2>/dev/null
}
r=$(serve_edit "$TMP/s1.log" "$H/up17.png")
case "$r" in "400 "*"4097x4096 pixels is more than the 16 Mpx this server decodes (--max-ref-pixels)"*) ok "serve: a 4097x4096 upload is refused at the 16 Mpx default (400)" ;;
    *) fail "serve 16 Mpx default: $r $(tail -3 "$TMP/s1.log")" ;; esac
r=$(serve_edit "$TMP/s2.log" "$H/up11.png" --max-ref-pixels 1000000)
case "$r" in "400 "*"1100x1000 pixels is more than the 0.9537 Mpx this server decodes (--max-ref-pixels)"*) ok "serve --max-ref-pixels 1000000: a 1100x1000 upload is refused (400)" ;;
    *) fail "serve --max-ref-pixels 1000000: $r $(tail -3 "$TMP/s2.log")" ;; esac

# the accepted worst cases, bounded: the largest PNG and a progressive JPEG at the scan limit, both 64 Mpx
$CRAFT pngbig "$H/big64.png" 8192 8192 full
"$MKJPEG" bands "$H/prog100.jpg" 8192 8192 33
for f in big64.png prog100.jpg; do
    out=$(/usr/bin/time -f "%e %M" -o "$TMP/time" "$TPGEN" encode-image --model "$KM" --image "$H/$f" --output "$H/ok.st" --backend cpu 2>&1); rc=$?
    read -r t kb < <(tail -1 "$TMP/time")
    if [ $rc -eq 0 ] && echo "$out" | grep -q "8192x8192 -> 1024x1024" && awk -v t="$t" 'BEGIN { exit !(t < 60) }' && [ "$kb" -lt $((900 * 1024)) ]; then
        ok "$f (8192x8192) decoded, resized and encoded in ${t} s, $((kb / 1024)) MB peak (limits 60 s, 900 MB)"
    else
        fail "$f (rc $rc, ${t} s, $((kb / 1024)) MB): $(echo "$out" | tail -2)"
    fi
done

ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1   # ASAN_OPTIONS and LSAN_OPTIONS (leaks on) come from tests/run.sh
    cases "$ASAN/tpgen" "asan_"
fi
