#!/usr/bin/env bash
# A one-node SLURM on this machine (Debian's slurm-wlm and munge): munged, slurmctld and slurmd for
# this host with all its CPUs, for tests/test_studies_slurm.py. Idempotent: daemons already up are
# left as they are. Needs root. Prints the seconds it took.
set -euo pipefail
start=$(date +%s)
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /run/munge /var/lib/munge /var/log/munge
old=$(cat /etc/slurm/slurm.conf 2>/dev/null || true)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmUser=root
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
# a test node: schedule (and start requeued jobs) within seconds
SchedulerParameters=sched_interval=2,bf_interval=2
KillWait=10
# a requeued job waits cred_expire seconds before it starts again (default 120)
AuthInfo=cred_expire=10
CONF
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
if [ "$old" != "$(cat /etc/slurm/slurm.conf)" ] && pgrep -x slurmctld >/dev/null; then
    scontrol shutdown || true  # daemons started with another configuration (AuthInfo needs a restart)
    for _ in $(seq 20); do pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break; sleep 0.5; done
fi
pgrep -x munged >/dev/null || su -s /bin/sh munge -c munged 2>/dev/null || munged --force
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 60); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
    case "$state" in
        idle*|mix*|alloc*) echo "slurm: node $host $state, $cpus CPUs, set up in $(( $(date +%s) - start )) s"; exit 0 ;;
        down*|drain*|unk*) scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
done
echo "slurm: node $host not up after 60 s (state: ${state:-none}); see /var/log/slurm/" >&2
exit 1
