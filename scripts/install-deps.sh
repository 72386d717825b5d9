#!/usr/bin/env bash
# Install the Debian packages tpgen builds against (run as root or with sudo).
set -euo pipefail
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential ca-certificates openmpi-bin libopenmpi-dev libopenblas-openmp-dev \
    libyaml-dev libjansson-dev libpcre2-dev libutf8proc-dev libstb-dev nettle-dev zlib1g-dev libmicrohttpd-dev libpng-dev libjpeg62-turbo-dev \
    python3-minimal jq xz-utils git clang libomp-dev qemu-user iproute2 bc curl util-linux chromium chromium-driver >/dev/null   # chromium, chromium-driver: tests/sh/ui.sh drives the page of tpgen serve headless; python3, jq: tests read golden files; iproute2, bc, curl, util-linux: tests/sh/twonode.sh and watchdog.sh; xz: the golden data is stored compressed; git: tests/sh/selfcontained.sh; clang, libomp-dev: the fuzz harnesses (make fuzz); qemu-user: tests/sh/portable.sh emulates older CPUs
