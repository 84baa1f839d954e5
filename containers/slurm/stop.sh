#!/usr/bin/env bash
# Stop the cluster containers/slurm/start.sh started: its jobs, daemons, namespaces, bridge and state.
#   sudo containers/slurm/stop.sh [STATE_DIR]      # default /tmp/tfgpu-slurm
set -uo pipefail

STATE=$(realpath -m "${1:-${TFGPU_SLURM_DIR:-/tmp/tfgpu-slurm}}")
[ "$(id -u)" = 0 ] || { echo "containers/slurm/stop.sh: run it as root (sudo $0)" >&2; exit 1; }
if [ -f "$STATE/slurm.conf" ]; then
    SLURM_CONF=$STATE/slurm.conf timeout 10 scancel --full --quiet --user=root 2>/dev/null
fi
stop_pid() {  # the daemon whose pid file is $1: TERM, then KILL after 3 s
    [ -f "$1" ] || return 0
    local pid
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 12); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null
}
for pidfile in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid" "$STATE/munge/munged.pid"; do
    stop_pid "$pidfile"
done
for ns in $(ip netns list 2>/dev/null | awk '/^tfgpu-/ {print $1}'); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null   # tasks a killed slurmd left
    ip netns del "$ns"
done
ip link del tfgpu-slurm0 2>/dev/null
rm -rf "$STATE"/{log,ctld,munge,spool} "$STATE"/slurm.conf "$STATE"/hosts "$STATE"/*.pid   # only what start.sh made
rmdir "$STATE" 2>/dev/null
exit 0
