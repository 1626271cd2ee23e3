#!/usr/bin/env bash
# A one-node Slurm cluster inside one folder: its own munge key and socket, slurm.conf, state,
# spool, logs and ports; nothing outside the folder is written, and `stop` removes it.
#   tests/support/local_slurm.sh start DIR CTLD_PORT SLURMD_PORT   # then: export SLURM_CONF=DIR/slurm.conf
#   tests/support/local_slurm.sh stop DIR
# Used by tools_slurm_tests (tests/tools/test_slurm.cpp); also a way to try examples/slurm on
# one machine. `start` exits 77 after a line "SKIPPED: slurm: <why>" when Slurm or munge is
# not installed or will not start here (scripts/setup.sh installs slurmd, slurmctld,
# slurm-client and munge from Debian).
set -euo pipefail
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start DIR CTLD_PORT SLURMD_PORT | stop DIR" >&2; exit 2; }

stop() {
  for f in slurmd slurmctld munge/munged; do
    [ -f "$dir/$f.pid" ] && kill "$(cat "$dir/$f.pid")" 2>/dev/null || true
  done
  for _ in $(seq 50); do  # up to 5 s for the daemons to go
    alive=0
    for f in slurmd slurmctld munge/munged; do
      [ -f "$dir/$f.pid" ] && kill -0 "$(cat "$dir/$f.pid")" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for f in slurmd slurmctld munge/munged; do
    [ -f "$dir/$f.pid" ] && kill -9 "$(cat "$dir/$f.pid")" 2>/dev/null || true
  done
  rm -rf "$dir"
}

skip() {
  echo "SKIPPED: slurm: $*"
  stop
  exit 77
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "$0: unknown command '$cmd'" >&2; exit 2; }
ctld_port=${3:?CTLD_PORT}
slurmd_port=${4:?SLURMD_PORT}
for b in munged slurmctld slurmd srun sbatch sinfo; do
  command -v "$b" >/dev/null || PATH=$PATH:/usr/sbin command -v "$b" >/dev/null ||
    { echo "SKIPPED: slurm: '$b' is not installed (Debian: slurmd slurmctld slurm-client munge)"; exit 77; }
done
export PATH=$PATH:/usr/sbin
mkdir -p "$dir"/{state,spool,log,munge}
chmod 700 "$dir/munge"
head -c 1024 /dev/urandom > "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" -f \
  >"$dir/log/munged.out" 2>&1 || skip "munged did not start: $(tail -1 "$dir/log/munged.out")"

host=$(hostname -s)
user=$(id -un)
cat > "$dir/slurm.conf" <<CONF
ClusterName=phalanx
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -c >"$dir/log/slurmctld.out" 2>&1 || skip "slurmctld did not start: $(tail -1 "$dir/log/slurmctld.out")"
slurmd >"$dir/log/slurmd.out" 2>&1 || skip "slurmd did not start: $(tail -1 "$dir/log/slurmd.out")"
for _ in $(seq 100); do  # up to 20 s for the node to come up
  state=$(sinfo -h -o %T 2>/dev/null || true)
  [ "$state" = idle ] && { echo "slurm: one node ($host) up; export SLURM_CONF=$dir/slurm.conf"; exit 0; }
  sleep 0.2
done
skip "the node did not come up (sinfo says '${state:-nothing}'; $(tail -1 "$dir/log/slurmd.log" 2>/dev/null))"
