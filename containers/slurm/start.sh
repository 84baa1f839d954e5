#!/usr/bin/env bash
# A throw-away two-node Slurm cluster on this machine, to try tfgpu's Slurm jobs (docs/multiworker.md, "What a real
# Slurm does") and for tests/cluster/test_slurm.py.
#
#   sudo containers/slurm/start.sh [STATE_DIR]      # default /tmp/tfgpu-slurm; prints the SLURM_CONF to export
#   export SLURM_CONF=/tmp/tfgpu-slurm/slurm.conf; sinfo; sbatch job.sbatch
#   sudo containers/slurm/stop.sh [STATE_DIR]
#
# One slurmctld and two slurmd (nodes n1 and n2, 2 CPUs each), a munged of its own (its key and socket in
# STATE_DIR), all as root. Each node runs in its own network namespace with its own address, as real hosts have:
# a bridge tfgpu-slurm0 (10.77.0.1, the controller) and n1 = 10.77.0.2, n2 = 10.77.0.3, so two workers can listen
# on the same port (distribute.port) as on two machines. Nothing is routed off the machine (no default route in
# the namespaces, no forwarding). Node names resolve on the nodes through STATE_DIR/hosts, bind-mounted over
# /etc/hosts in each slurmd's own mount namespace; the host's /etc/hosts is not touched. Everything else (the
# file system, /sys and its cgroups) is the host's, as a cluster's shared file system is. A requeued job waits
# cred_expire before it runs again: 10 s here, 120 s by Slurm's default. Needs root, Debian's slurm-wlm and
# munge, and iproute2 (ip):
#   apt-get install slurm-wlm munge iproute2
set -euo pipefail

STATE=$(realpath -m "${1:-${TFGPU_SLURM_DIR:-/tmp/tfgpu-slurm}}")
NODES=(n1 n2)
BRIDGE=tfgpu-slurm0
NET=10.77.0
CTL_ADDR=$NET.1

die() { echo "containers/slurm/start.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run it as root: slurmd and the network namespaces need it (sudo $0)."
for tool in slurmctld slurmd munged sinfo ip nsenter unshare; do
    command -v "$tool" >/dev/null || die "'$tool' is not installed: apt-get install slurm-wlm munge iproute2."
done
if [ -f "$STATE/slurm.conf" ] && SLURM_CONF=$STATE/slurm.conf timeout 5 sinfo -h >/dev/null 2>&1; then
    echo "a cluster is already running from $STATE; stop it first: containers/slurm/stop.sh $STATE" >&2
    echo "export SLURM_CONF=$STATE/slurm.conf"
    exit 0
fi
"$(dirname "$0")/stop.sh" "$STATE" >/dev/null 2>&1 || true   # what a killed earlier cluster left
mkdir -p "$STATE"/{log,ctld,munge,spool}
chmod 755 "$STATE/munge"

# munge: a key and a daemon of this cluster's own (Slurm's AuthInfo names its socket)
dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$STATE/munge/munge.key"
munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/munged.seed"

# the network: a bridge for the controller, a namespace and a veth pair per node
ip link add "$BRIDGE" type bridge
ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
hosts="127.0.0.1 localhost
$CTL_ADDR $(hostname -s)"
for i in "${!NODES[@]}"; do hosts+=$'\n'"$NET.$((i + 2)) ${NODES[$i]}"; done
for i in "${!NODES[@]}"; do
    node=${NODES[$i]} ns=tfgpu-${NODES[$i]}
    ip netns add "$ns"
    ip link add "tfgpu-$node" type veth peer name eth0 netns "$ns"
    ip link set "tfgpu-$node" master "$BRIDGE" up
    ip -n "$ns" addr add "$NET.$((i + 2))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
done
printf '%s\n' "$hosts" > "$STATE/hosts"

cpus=2
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / ${#NODES[@]} ))
cat > "$STATE/slurm.conf" <<EOF
# Written by containers/slurm/start.sh: a throw-away cluster of ${#NODES[@]} nodes on $(hostname -s).
ClusterName=tfgpu-local
SlurmctldHost=$(hostname -s)($CTL_ADDR)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
SlurmdTimeout=30
KillWait=30
MinJobAge=600
EOF
for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeAddr=$NET.$((i + 2)) CPUs=$cpus RealMemory=$memory State=UNKNOWN" >> "$STATE/slurm.conf"
done
echo "PartitionName=local Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP" >> "$STATE/slurm.conf"

export SLURM_CONF=$STATE/slurm.conf
slurmctld -f "$SLURM_CONF" || die "slurmctld did not start: $(tail -3 "$STATE/log/slurmctld.log" 2>/dev/null)"
for node in "${NODES[@]}"; do
    mkdir -p "$STATE/spool/$node"
    # the node's network namespace only (ip netns exec would also mount a /sys without the cgroups slurmd reads)
    nsenter --net="/run/netns/tfgpu-$node" unshare --mount --propagation private sh -c \
        "mount --bind '$STATE/hosts' /etc/hosts && exec slurmd -f '$SLURM_CONF' -N $node" \
        || die "slurmd -N $node did not start: $(tail -3 "$STATE/log/slurmd-$node.log" 2>/dev/null)"
done
for _ in $(seq 60); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$idle" = "${#NODES[@]}" ] && break
    sleep 0.5
done
if [ "$idle" != "${#NODES[@]}" ]; then
    sinfo -N >&2 || true
    tail -5 "$STATE"/log/*.log >&2 || true
    die "the nodes did not become idle in 30 s (logs in $STATE/log)."
fi
echo "export SLURM_CONF=$SLURM_CONF"
