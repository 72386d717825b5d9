#!/usr/bin/env bash
# Install a single-node Slurm from Debian's packages (munge, slurmctld,
# slurmd, the client commands and the PMIx plugin that `srun --mpi=pmix`
# needs). Used by tests/sh/slurm.sh when slurmctld is missing; run as root
# or with sudo. The daemons are not started or enabled here: the test
# writes its own slurm.conf and starts them itself.
set -euo pipefail
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the packages' maintainer scripts from starting daemons
# (there may be no init system, as in containers)
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
for i in 1 2 3 4 5 6; do   # another apt may hold the lock for a while
    $SUDO apt-get update -qq && break
    sleep 10
done
for i in 1 2 3 4 5 6; do
    $SUDO apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client >/dev/null && break
    [ "$i" = 6 ] && exit 1
    sleep 10
done
