#!/usr/bin/env bash
# A Slurm cluster inside one folder: its own munge key and socket, slurm.conf, state, spool,
# logs and ports; `stop` removes everything it made.
#   tests/support/local_slurm.sh start DIR CTLD_PORT SLURMD_PORT [NODES]
#   export SLURM_CONF=DIR/slurm.conf
#   tests/support/local_slurm.sh stop DIR
# NODES=1 (the default): one slurmd, this machine under its own host name. NODES=2 (root,
# iproute2): two slurmd named n1 and n2, each in a network namespace of its own (addresses
# 10.<A>.<B>.1 and .2 on a bridge that also holds slurmctld's, .254) with its own host name
# (a UTS namespace) and an /etc/hosts naming both nodes (ip netns exec mounts
# /etc/netns/<ns>/hosts); /sys/fs/cgroup is bound into each, since slurmd needs it and
# `ip netns exec` mounts a fresh /sys. Used by slurm_tests (tests/tools/test_slurm.cpp); also a
# way to try examples/slurm on one machine. `start` exits 77 after a line
# "SKIPPED: slurm: <why>" when Slurm or munge is missing or will not start here.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start DIR CTLD_PORT SLURMD_PORT [NODES] | stop DIR" >&2; exit 2; }
export PATH=$PATH:/usr/sbin:/sbin

kill_pidfile() {  # signal, pid file
  [ -f "$2" ] && kill "-$1" "$(cat "$2")" 2>/dev/null || true
}

stop() {
  local pidfiles=("$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid")
  for f in "${pidfiles[@]}"; do kill_pidfile TERM "$f"; done
  for _ in $(seq 50); do  # up to 5 s for the daemons to go
    alive=0
    for f in "${pidfiles[@]}"; do
      [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for f in "${pidfiles[@]}"; do kill_pidfile KILL "$f"; done
  if [ -f "$dir/netns" ]; then  # the two-node layout: "<tag>" of its names
    tag=$(cat "$dir/netns")
    for i in 1 2; do
      ip netns pids "phxsl${tag}n$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "phxsl${tag}n$i" 2>/dev/null || true
      rm -rf "/etc/netns/phxsl${tag}n$i"
    done
    ip link del "phxslbr$tag" 2>/dev/null || true
  fi
  if mountpoint -q "$dir/cgroup" 2>/dev/null; then umount -R "$dir/cgroup" || umount -lR "$dir/cgroup" || true; fi
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
nodes=${5:-1}
for b in munged slurmctld slurmd srun sbatch sinfo; do
  command -v "$b" >/dev/null ||
    { echo "SKIPPED: slurm: '$b' is not installed (Debian: slurmd slurmctld slurm-client munge)"; exit 77; }
done
if [ "$nodes" = 2 ]; then
  [ "$(id -u)" = 0 ] || { echo "SKIPPED: slurm: two nodes need network namespaces, which need root"; exit 77; }
  for b in ip unshare mount; do
    command -v "$b" >/dev/null || { echo "SKIPPED: slurm: two nodes need '$b'"; exit 77; }
  done
fi
mkdir -p "$dir"/{state,spool,log,munge}
chmod 700 "$dir/munge"
head -c 1024 /dev/urandom > "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" -f \
  >"$dir/log/munged.out" 2>&1 || skip "munged did not start: $(tail -1 "$dir/log/munged.out")"

host=$(hostname -s)
user=$(id -un)
if [ "$nodes" = 2 ]; then
  tag=$(( $$ % 200 + 1 ))
  net="10.78.$tag"
  echo "$tag" > "$dir/netns"
  ctld_addr=$net.254
  node_lines="NodeName=n1 NodeAddr=$net.1 CPUs=$(nproc) State=UNKNOWN
NodeName=n2 NodeAddr=$net.2 CPUs=$(nproc) State=UNKNOWN"
  partition_nodes="n[1-2]"
  ip link add "phxslbr$tag" type bridge || skip "cannot make a bridge"
  ip addr add "$ctld_addr/24" dev "phxslbr$tag"
  ip link set "phxslbr$tag" up
  for i in 1 2; do
    ns="phxsl${tag}n$i"
    ip netns add "$ns" || skip "cannot make network namespace $ns"
    ip link add "phxsl${tag}v$i" type veth peer name "phxsl${tag}p$i"
    ip link set "phxsl${tag}v$i" master "phxslbr$tag"
    ip link set "phxsl${tag}v$i" up
    ip link set "phxsl${tag}p$i" netns "$ns"
    ip -n "$ns" link set "phxsl${tag}p$i" name eth0
    ip -n "$ns" addr add "$net.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n%s n1\n%s n2\n%s %s\n' "$net.1" "$net.2" "$ctld_addr" "$host" > "/etc/netns/$ns/hosts"
  done
else
  ctld_addr=127.0.0.1
  node_lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN"
  partition_nodes=$host
fi
cat > "$dir/slurm.conf" <<CONF
ClusterName=phalanx
SlurmctldHost=$host($ctld_addr)
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
$node_lines
PartitionName=debug Nodes=$partition_nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -c >"$dir/log/slurmctld.out" 2>&1 || skip "slurmctld did not start: $(tail -1 "$dir/log/slurmctld.out")"
if [ "$nodes" = 2 ]; then
  mkdir -p "$dir/cgroup" "$dir/spool/n1" "$dir/spool/n2"
  mount --rbind /sys/fs/cgroup "$dir/cgroup" || skip "cannot bind /sys/fs/cgroup"
  for i in 1 2; do
    ip netns exec "phxsl${tag}n$i" unshare --uts sh -c \
      "mount --rbind '$dir/cgroup' /sys/fs/cgroup && hostname n$i && exec slurmd -N n$i" \
      >"$dir/log/slurmd.n$i.out" 2>&1 || skip "slurmd n$i did not start: $(tail -1 "$dir/log/slurmd.n$i.out")"
  done
  want="idle idle"
else
  mkdir -p "$dir/spool/$host"
  slurmd >"$dir/log/slurmd.out" 2>&1 || skip "slurmd did not start: $(tail -1 "$dir/log/slurmd.out")"
  want=idle
fi
for _ in $(seq 100); do  # up to 20 s for the nodes to come up
  state=$(sinfo -h -N -o %T 2>/dev/null | tr '\n' ' ' | sed 's/ $//' || true)
  [ "$state" = "$want" ] && { echo "slurm: $nodes node(s) up; export SLURM_CONF=$dir/slurm.conf"; exit 0; }
  sleep 0.2
done
skip "the nodes did not come up (sinfo says '${state:-nothing}'; $(grep -hv '^[0-9]*:' "$dir"/log/slurmd*.log 2>/dev/null | tail -1))"
