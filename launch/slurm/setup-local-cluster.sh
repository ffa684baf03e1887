#!/usr/bin/env bash
# A one-node Slurm cluster on localhost, for tests (tests/launcher/test_slurm_cluster.py).
#
#   sudo launch/slurm/setup-local-cluster.sh          # install (Debian), configure, start
#   sudo launch/slurm/setup-local-cluster.sh stop     # stop the daemons
#
# Node "localhost" with every CPU and ~90% of the memory of this machine, one partition
# "debug" (default), no accounting, no cgroups: proctrack/linuxproc tracks a step's
# processes by parent pid, so `scancel` still reaches every process a step started.
# Runs as root (SlurmUser=root); not for a shared machine.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm

stop() {
  for d in slurmd slurmctld munged; do
    if pid=$(pgrep -x "$d"); then kill $pid; fi
  done
}

if [[ "${1:-}" == stop ]]; then stop; exit 0; fi
[[ $EUID -eq 0 ]] || { echo "run as root" >&2; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge
fi

# munge: one key, readable by the munge user only
mkdir -p /etc/munge /var/run/munge /var/log/munge /var/lib/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /var/run/munge /var/log/munge /var/lib/munge
chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key

CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
mkdir -p "$STATE" "$SPOOL" "$LOGS" /etc/slurm
cat > "$CONF" <<EOF
ClusterName=areal-local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=10
MinJobAge=60
JobRequeue=1
MpiDefault=none
NodeName=localhost CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
# slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc + task/none: name the
# mounted hierarchy and keep it away from systemd (containers have none); nothing is constrained.
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then CG=cgroup/v2; else CG=cgroup/v1; fi
printf 'CgroupPlugin=%s\nIgnoreSystemd=yes\n' "$CG" > /etc/slurm/cgroup.conf

stop; sleep 1
runuser -u munge -- /usr/sbin/munged
/usr/sbin/slurmctld
/usr/sbin/slurmd
for _ in $(seq 30); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    sinfo; exit 0
  fi
  sleep 1
done
echo "the node did not come up; see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
sinfo -N -l >&2 || true
exit 1
