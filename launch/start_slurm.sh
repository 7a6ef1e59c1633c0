#!/usr/bin/env bash
# Start a SLURM cluster (with slurmdbd + MariaDB accounting) on this machine, by hand (no
# systemd), on loopback only, with every file under one base folder: one node, or several
# (SCALERL_SLURM_NODES=2: one slurmd per node, each under its own node name, port and hostname).
#
#   launch/start_slurm.sh [BASE_DIR]        # default: $SCALERL_SLURM_DIR or /tmp/scalerl-slurm
#   source BASE_DIR/env.sh                  # or: export SLURM_CONF=BASE_DIR/etc/slurm.conf
#   launch/stop_slurm.sh [BASE_DIR]
#
# Idempotent: when the cluster is already up it only prints the export line.
# Needs root (slurmd runs jobs as the submitting user; SlurmUser=root) and Debian's packages
# (installed with apt-get when a binary is missing).
#
# Environment knobs:
#   SCALERL_SLURM_DIR        base folder (when no argument is given)
#   SCALERL_SLURM_PORT_BASE  first of 4 loopback ports: slurmctld, slurmd, slurmdbd, mariadbd [16817];
#                            with N nodes node k > 1's slurmd takes PORT_BASE + 2 + k
#   SCALERL_SLURM_TIMEOUT    seconds to wait for each daemon [60]
#   SCALERL_SLURM_CLUSTER    ClusterName [scalerl]
#   SCALERL_SLURM_NODES      compute nodes [1]. 1: the node is this machine (`hostname -s`,
#                            127.0.0.1). N > 1: nodes scalerl-n1..scalerl-nN, added to /etc/hosts,
#                            one slurmd each (see "Several nodes on one machine" below and in
#                            launch/README.md)
#   SCALERL_SLURM_CPUS_PER_NODE  CPUs each node advertises [nproc / N, at least 2]
#   SCALERL_SLURM_OWN_ADDRS  1: with N > 1, node k is at 127.0.0.k (its name resolves there, so its
#                            tasks use their node's own address); slurmd and srun then listen on
#                            every interface [0: every node at 127.0.0.1, everything loopback-only]
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
# Settings inherited from an enclosing job / another cluster must not leak into ours.
unset SLURM_JOB_ID SLURM_JOBID SLURM_CONF_SERVER 2>/dev/null || true

BASE="${1:-${SCALERL_SLURM_DIR:-/tmp/scalerl-slurm}}"
case "$BASE" in /*) ;; *) BASE="$(pwd)/$BASE" ;; esac
BASE="${BASE%/}"
PORT_BASE="${SCALERL_SLURM_PORT_BASE:-16817}"
TIMEOUT="${SCALERL_SLURM_TIMEOUT:-60}"
CLUSTER="${SCALERL_SLURM_CLUSTER:-scalerl}"
NODES="${SCALERL_SLURM_NODES:-1}"
OWN_ADDRS="${SCALERL_SLURM_OWN_ADDRS:-0}"
ACCOUNT="scalerl"

CTLD_PORT=$PORT_BASE
SLURMD_PORT=$((PORT_BASE + 1))
DBD_PORT=$((PORT_BASE + 2))
DB_PORT=$((PORT_BASE + 3))

ETC="$BASE/etc"
LOG="$BASE/log"
RUN="$BASE/run"
MUNGE_KEY_DIR="$BASE/munge-key"     # 0700
MUNGE_SOCK_DIR="$BASE/munge-sock"   # 0755: munged refuses a socket folder others cannot enter
MUNGE_SOCK="$MUNGE_SOCK_DIR/munge.socket"
DB_DATA="$BASE/db/data"
DB_SOCK="$RUN/mariadb.sock"
CONF="$ETC/slurm.conf"
DBD_CONF="$ETC/slurmdbd.conf"

T0=$(date +%s.%N)
say() { printf 'start_slurm: %s\n' "$*" >&2; }
die() { printf 'start_slurm: ERROR: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" -eq 0 ] || die "must run as root (slurmd has to run jobs as their user); try: sudo $0 $*"

# ---------------------------------------------------------------- packages
install_packages() {
  local need=0 b
  for b in munged slurmctld slurmd sinfo sbatch sacct sacctmgr slurmdbd mariadbd mariadb-install-db mariadb-admin mariadb; do
    command -v "$b" >/dev/null 2>&1 || { say "missing binary: $b"; need=1; }
  done
  [ "$need" -eq 0 ] && return 0
  say "installing Debian packages (slurmctld slurmd slurm-client slurmdbd munge mariadb-server)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2 || die "apt-get update failed"
  # postinst prints "invoke-rc.d: policy-rc.d denied execution of start": harmless.
  apt-get install -y -q --no-install-recommends \
    slurmctld slurmd slurm-client slurmdbd munge mariadb-server >&2 || die "apt-get install failed"
}

# ---------------------------------------------------------------- helpers
# A process that exited but was not reaped yet (zombie) counts as gone: PID 1 of some
# containers/VMs reaps orphans only every few seconds.
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# pid from a pid file if that process is alive and is the expected program, else nothing.
live_pid() {  # live_pid PIDFILE COMM
  local f=$1 comm=$2 pid
  [ -s "$f" ] || return 1
  pid=$(tr -dc '0-9' <"$f")
  [ -n "$pid" ] && alive "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
  echo "$pid"
}

port_busy() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }  # port_busy PORT [ADDR]

# wait_for NAME LOGFILE PIDSPEC COMM CHECK-COMMAND...
#   PIDSPEC: a pid file, "pid:<pid>" (a child of this shell), or "" (no liveness check)
wait_for() {
  local name=$1 log=$2 pidf=$3 comm=$4; shift 4
  local deadline=$(( $(date +%s) + TIMEOUT ))
  while :; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    case "$pidf" in
      "") ;;
      pid:*) alive "${pidf#pid:}" || fail_daemon "$name" "$log" "process exited" ;;
      *) # daemons write their pid file right after forking: allow a short grace period
        if [ "$(date +%s)" -gt $(( deadline - TIMEOUT + 3 )) ] && ! live_pid "$pidf" "$comm" >/dev/null; then
          fail_daemon "$name" "$log" "process is not running"
        fi ;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail_daemon "$name" "$log" "not up after ${TIMEOUT}s"
    fi
    sleep 0.2
  done
}

fail_daemon() {  # fail_daemon NAME LOG REASON
  {
    printf 'start_slurm: ERROR: %s did not come up (%s). Log: %s\n' "$1" "$3" "$2"
    if [ -f "$2" ]; then echo "---- last lines of $2 ----"; tail -n 20 "$2"; echo "----"; fi
    echo "start_slurm: see also $LOG/ ; stop everything with: $(dirname "$0")/stop_slurm.sh $BASE"
  } >&2
  exit 1
}

check_port_free() {  # check_port_free PORT WHO [ADDR]
  if port_busy "$1" "${3:-127.0.0.1}"; then
    die "${3:-127.0.0.1}:$1 (for $2) is already in use by another process; set SCALERL_SLURM_PORT_BASE or stop it"
  fi
}

# stop_pid PIDFILE COMM: SIGTERM, then SIGKILL after TIMEOUT s (a daemon to restart with a new config).
stop_pid() {
  local pid i
  pid=$(live_pid "$1" "$2") || { rm -f "$1"; return 0; }
  say "stopping $2 (pid $pid, $1) to restart it"
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < TIMEOUT * 10; i++)); do alive "$pid" || break; sleep 0.1; done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null
  for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
  alive "$pid" && die "$2 (pid $pid) does not stop"
  rm -f "$1"
}

node_state() { timeout 10 sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -n1; }  # node_state NODE
nodes_idle() {
  local n
  for n in "${NODE_NAMES[@]}"; do
    case "$(node_state "$n")" in idle|mixed|allocated|completing) ;; *) return 1 ;; esac
  done
}
# Like nodes_idle for one node, but resumes a node that an earlier run left DOWN/DRAINED (e.g. "Kill task
# failed" after a stop with jobs on it, or a RealMemory from an older config): this private
# cluster's config is regenerated on every start. If slurmd keeps failing to register, the
# wait times out pointing at the log (the reason is in `sinfo -R` and slurmctld.log).
node_ready() {  # node_ready NODE
  case "$(node_state "$1")" in
    idle|mixed|allocated|completing) return 0 ;;
    down|drained|draining|drain) timeout 10 scontrol update NodeName="$1" State=RESUME >/dev/null 2>&1 || true; return 1 ;;
    *) return 1 ;;
  esac
}
sacct_ok() { timeout 10 sacct -n -X -a -S now-1minutes -o JobID >/dev/null 2>&1; }
ctld_ok() { timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }
dbd_ok() { timeout 10 sacctmgr -n -P list cluster format=cluster >/dev/null 2>&1; }
db_ok() { mariadb-admin --no-defaults --socket="$DB_SOCK" -uroot --connect-timeout=2 ping >/dev/null 2>&1; }
munge_ok() { munge -S "$MUNGE_SOCK" -n </dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; }

all_up() {
  live_pid "$RUN/munged.pid" munged >/dev/null &&
    live_pid "$RUN/mariadbd.pid" mariadbd >/dev/null &&
    live_pid "$RUN/slurmdbd.pid" slurmdbd >/dev/null &&
    live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null &&
    slurmds_alive && nodes_idle && sacct_ok
}

slurmds_alive() {
  local n
  for n in "${NODE_NAMES[@]}"; do live_pid "$RUN/slurmd-$n.pid" slurmd >/dev/null || return 1; done
}

print_env() {
  printf 'export SLURM_CONF=%s\n' "$CONF" >"$BASE/env.sh"
  say "cluster '$CLUSTER' up in $(elapsed) s ($NODES node(s): ${NODE_NAMES[*]}, $CPUS CPUs and ${MEM_MB} MB each; logs in $LOG)"
  printf 'export SLURM_CONF=%s\n' "$CONF"
}

# ---------------------------------------------------------------- main
install_packages

NODE=$(hostname -s)   # the controller's host (and, with one node, the node)
case "$NODES" in
  [1-9] | [1-9][0-9] | 1[0-9][0-9] | 2[0-4][0-9] | 25[0-4]) ;;
  *) die "SCALERL_SLURM_NODES=$NODES: a node count from 1 to 254 is allowed (node k listens on 127.0.0.k)" ;;
esac
# Several nodes on one machine: each node is one slurmd started with `-N <name>` (in every
# build; Debian's is not built with --enable-multiple-slurmd, which only lets several NodeNames
# share one NodeHostname: each node here has its own), with its own Port, spool, log and pid
# file (%n in the paths). Each slurmd runs in a UTS namespace of its own whose hostname is the node's name,
# where the kernel allows one: a task then sees its node's hostname, as on a real cluster.
# A node's address (NodeAddr, and what its name resolves to in /etc/hosts: a task's MASTER_ADDR
# is the first node's name, and a task resolves its hostname, e.g. gloo's default device) is
# 127.0.0.1 for every node by default, so that every daemon and srun keep listening on loopback
# only (CommunicationParameters=NoInAddrAny). With NoInAddrAny slurmd and srun listen on the
# address of their hostname, and slurmstepd connects back to the source address of srun's
# request, which the kernel sets to 127.0.0.1 for every loopback destination: were node 2 at
# 127.0.0.2, a step started from a batch script on node 2 would never start ("connect io:
# Connection refused" in the node's slurmd log). SCALERL_SLURM_OWN_ADDRS=1 puts node k at
# 127.0.0.k (its slurmd reached there, its tasks listening there) and drops NoInAddrAny: the
# slurmd and srun listen on every interface, authenticated by the cluster's private munge key;
# slurmctld, slurmdbd and MariaDB stay on 127.0.0.1.
case "$OWN_ADDRS" in 0 | 1) ;; *) die "SCALERL_SLURM_OWN_ADDRS=$OWN_ADDRS: 0 or 1 is allowed" ;; esac
COMM_PARAMS=NoCtldInAddrAny,NoInAddrAny
[ "$NODES" -gt 1 ] && [ "$OWN_ADDRS" -eq 1 ] && COMM_PARAMS=NoCtldInAddrAny
NODE_NAMES=() NODE_ADDRS=() NODE_PORTS=()
if [ "$NODES" -eq 1 ]; then
  NODE_NAMES=("$NODE") NODE_ADDRS=(127.0.0.1) NODE_PORTS=("$SLURMD_PORT")
else
  for ((i = 1; i <= NODES; i++)); do
    NODE_NAMES+=("scalerl-n$i")
    if [ "$OWN_ADDRS" -eq 1 ]; then NODE_ADDRS+=("127.0.0.$i"); else NODE_ADDRS+=(127.0.0.1); fi
    if [ "$i" -eq 1 ]; then NODE_PORTS+=("$SLURMD_PORT"); else NODE_PORTS+=($((PORT_BASE + 2 + i))); fi
  done
fi
# Each of N nodes advertises nproc / N CPUs, but at least 2 so that the tests' 2-task jobs fit on
# one node (on a 2-core machine 2 nodes then advertise 4 CPUs: with TaskPlugin=task/none SLURM
# pins nothing, the count only decides how many tasks a node is given).
NPROC=$(nproc)
if [ "$NODES" -eq 1 ]; then CPUS=$NPROC; else CPUS=$((NPROC / NODES)); [ "$CPUS" -ge 2 ] || CPUS=2; fi
CPUS="${SCALERL_SLURM_CPUS_PER_NODE:-$CPUS}"
case "$CPUS" in [1-9] | [1-9][0-9] | [1-9][0-9][0-9]) ;; *) die "SCALERL_SLURM_CPUS_PER_NODE=$CPUS: a whole number of CPUs from 1 to 999 is allowed" ;; esac
MEM_MB=$(awk -v n="$NODES" '/^MemTotal:/ { m = int($2 / 1024); r = int(m * 0.95); if (m - r < 256) r = m - 256; print int(r / n) }' /proc/meminfo)
export SLURM_CONF="$CONF"

render_slurm_conf() {
  cat <<EOF
# Generated by launch/start_slurm.sh -- dev cluster on one machine, loopback only.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
# every daemon binds the loopback address it is given, not all interfaces (but with
# SCALERL_SLURM_OWN_ADDRS=1: see start_slurm.sh)
CommunicationParameters=$COMM_PARAMS
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (default 120 s) is also how long a requeued job waits before it may start again.
AuthInfo=socket=$MUNGE_SOCK,cred_expire=15

StateSaveLocation=$BASE/state/slurmctld
# %n: the node's name (several slurmd on one machine)
SlurmdSpoolDir=$BASE/spool/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info

ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MailProg=/bin/true
# Requeue/preemption (submitit: --signal=USR2@N, checkpoint, then scontrol requeue).
JobRequeue=1
KillWait=5
# Keep tests fast: frequent scheduling, short waits.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
UnkillableStepTimeout=30

# Accounting through slurmdbd (sacct is what submitit polls for job states).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# With a non-default munge socket slurmctld's link to slurmdbd ignores AuthInfo;
# AccountingStoragePass=<munge socket> makes it use ours.
AccountingStoragePass=$MUNGE_SOCK
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none

EOF
  local i
  for i in "${!NODE_NAMES[@]}"; do
    echo "NodeName=${NODE_NAMES[$i]} NodeAddr=${NODE_ADDRS[$i]} NodeHostname=${NODE_NAMES[$i]} Port=${NODE_PORTS[$i]} CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB State=UNKNOWN"
  done
  local IFS=,
  echo "PartitionName=debug Nodes=${NODE_NAMES[*]} Default=YES MaxTime=INFINITE State=UP"
}

# Node names must resolve to their addresses for every process on this machine: a task's
# MASTER_ADDR is the first node's name (scalerl.sweep.job), and tasks resolve their hostname.
ensure_hosts() {
  local i name addr have
  for i in "${!NODE_NAMES[@]}"; do
    name=${NODE_NAMES[$i]} addr=${NODE_ADDRS[$i]}
    have=$(getent ahostsv4 "$name" 2>/dev/null | awk 'NR == 1 { print $1 }' || true)
    [ "$have" = "$addr" ] && continue
    if [ -n "$have" ] && grep -Eq "^[0-9.]+ $name  # scalerl dev SLURM node" /etc/hosts; then
      # our own line from a start with the other SCALERL_SLURM_OWN_ADDRS: rewritten in place
      # (cat, not mv: /etc/hosts may be a bind mount)
      grep -Ev "^[0-9.]+ $name  # scalerl dev SLURM node" /etc/hosts >"$BASE.hosts.tmp" &&
        cat "$BASE.hosts.tmp" >/etc/hosts && rm -f "$BASE.hosts.tmp" || die "cannot rewrite /etc/hosts"
      have=""
    fi
    [ -z "$have" ] || die "node name $name resolves to $have, not $addr (/etc/hosts?): remove that entry or use SCALERL_SLURM_NODES=1"
    # a last line without its newline would swallow ours
    [ ! -s /etc/hosts ] || [ -z "$(tail -c 1 /etc/hosts)" ] || echo >>/etc/hosts
    printf '%s %s  # scalerl dev SLURM node (launch/start_slurm.sh)\n' "$addr" "$name" >>/etc/hosts ||
      die "cannot add '$addr $name' to /etc/hosts (node names must resolve); add it by hand"
    say "added '$addr $name' to /etc/hosts"
  done
}
[ "$NODES" -eq 1 ] || ensure_hosts

mkdir -p "$BASE"
# fd 9 holds the lock; every daemon is started with 9>&- so that it does not inherit it.
exec 9>"$BASE/.start.lock"
flock -w $((TIMEOUT * 5)) 9 || die "another start_slurm.sh holds $BASE/.start.lock"

if [ -f "$CONF" ] && [ "$(render_slurm_conf)" = "$(cat "$CONF")" ] && all_up; then
  print_env
  exit 0
fi

mkdir -p "$ETC" "$LOG" "$RUN" "$BASE/state/slurmctld" "$BASE/db" "$BASE/spool" \
  "$MUNGE_KEY_DIR" "$MUNGE_SOCK_DIR" "$BASE/munge-lib"
chmod 0755 "$BASE" "$ETC" "$LOG" "$RUN" "$MUNGE_SOCK_DIR"
chmod 0700 "$MUNGE_KEY_DIR" "$BASE/munge-lib"

# ------------------------------------------------ configuration files
if [ ! -s "$MUNGE_KEY_DIR/munge.key" ]; then
  dd if=/dev/urandom of="$MUNGE_KEY_DIR/munge.key" bs=1024 count=1 status=none
fi
chmod 0400 "$MUNGE_KEY_DIR/munge.key"

if [ ! -s "$ETC/db.pass" ]; then
  (umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$ETC/db.pass")
fi
DB_PASS=$(cat "$ETC/db.pass")

# Write a file only when its content changes (keeps the running daemons' view stable); returns
# 0 when it changed, 1 when it was already so.
write_file() {  # write_file PATH MODE  (content on stdin)
  local tmp
  tmp=$(mktemp "$1.XXXXXX")
  cat >"$tmp"
  chmod "$2" "$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
  mv -f "$tmp" "$1"
}

if render_slurm_conf | write_file "$CONF" 0644; then
  # A new slurm.conf (first start, another node count, other CPUs): slurmctld and the slurmd
  # that run (also those of nodes no longer configured, and a pre-%n "slurmd.pid") were started
  # with the old one and are restarted; slurmctld keeps its state (jobs on a removed node end).
  for f in "$RUN"/slurmd.pid "$RUN"/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f" slurmd; done
  stop_pid "$RUN/slurmctld.pid" slurmctld
fi

write_file "$DBD_CONF" 0600 <<EOF || true
# Generated by launch/start_slurm.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=$NODE
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
CommunicationParameters=NoInAddrAny
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF

# ------------------------------------------------ munged
if ! live_pid "$RUN/munged.pid" munged >/dev/null; then
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock" "$RUN/munged.pid"
  munged --key-file="$MUNGE_KEY_DIR/munge.key" --socket="$MUNGE_SOCK" --pid-file="$RUN/munged.pid" \
    --seed-file="$BASE/munge-lib/munged.seed" --log-file="$LOG/munged.log" \
    </dev/null 9>&- >>"$LOG/munged.log" 2>&1 || fail_daemon munged "$LOG/munged.log" "munged exited with an error"
fi
wait_for munged "$LOG/munged.log" "$RUN/munged.pid" munged munge_ok

# ------------------------------------------------ mariadbd
if ! live_pid "$RUN/mariadbd.pid" mariadbd >/dev/null; then
  check_port_free "$DB_PORT" mariadbd
  if [ ! -d "$DB_DATA/mysql" ]; then
    say "initialising MariaDB data dir $DB_DATA"
    rm -rf "$DB_DATA"; mkdir -p "$DB_DATA"
    mariadb-install-db --no-defaults --user=root --datadir="$DB_DATA" --skip-test-db \
      --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 ||
      fail_daemon "mariadb-install-db" "$LOG/mariadb-install.log" "initialisation failed"
  fi
  rm -f "$DB_SOCK" "$RUN/mariadbd.pid"
  setsid mariadbd --no-defaults --user=root --datadir="$DB_DATA" --socket="$DB_SOCK" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$RUN/mariadbd.pid" \
    --log-error="$LOG/mariadbd.log" --skip-name-resolve --innodb-buffer-pool-size=64M \
    --innodb-lock-wait-timeout=900 --max-connections=100 \
    </dev/null 9>&- >>"$LOG/mariadbd.log" 2>&1 &
  db_pidspec="pid:$!"
else
  db_pidspec="$RUN/mariadbd.pid"
fi
wait_for mariadbd "$LOG/mariadbd.log" "$db_pidspec" mariadbd db_ok
live_pid "$RUN/mariadbd.pid" mariadbd >/dev/null || fail_daemon mariadbd "$LOG/mariadbd.log" "no live pid file"

mariadb --no-defaults --socket="$DB_SOCK" -uroot >>"$LOG/mariadb-setup.log" 2>&1 <<EOF ||
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
  fail_daemon mariadbd "$LOG/mariadb-setup.log" "could not create the slurm database/user"

# ------------------------------------------------ slurmdbd
if ! live_pid "$RUN/slurmdbd.pid" slurmdbd >/dev/null; then
  check_port_free "$DBD_PORT" slurmdbd
  rm -f "$RUN/slurmdbd.pid"
  slurmdbd </dev/null 9>&- >>"$LOG/slurmdbd.log" 2>&1 || fail_daemon slurmdbd "$LOG/slurmdbd.log" "slurmdbd exited with an error"
fi
wait_for slurmdbd "$LOG/slurmdbd.log" "$RUN/slurmdbd.pid" slurmdbd dbd_ok

# Register the cluster (creates the 'root' account) and a project account, once.
if ! timeout 10 sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
  timeout 30 sacctmgr -i add cluster "$CLUSTER" >>"$LOG/sacctmgr.log" 2>&1 ||
    fail_daemon slurmdbd "$LOG/sacctmgr.log" "sacctmgr add cluster failed"
fi
if ! timeout 10 sacctmgr -n -P list account "$ACCOUNT" format=account 2>/dev/null | grep -qx "$ACCOUNT"; then
  timeout 30 sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description="scalerl dev" \
    Organization=scalerl >>"$LOG/sacctmgr.log" 2>&1 ||
    fail_daemon slurmdbd "$LOG/sacctmgr.log" "sacctmgr add account failed"
  timeout 30 sacctmgr -i add user root Account="$ACCOUNT" Cluster="$CLUSTER" >>"$LOG/sacctmgr.log" 2>&1 || true
fi

# ------------------------------------------------ slurmctld
if ! live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null; then
  check_port_free "$CTLD_PORT" slurmctld
  rm -f "$RUN/slurmctld.pid"
  slurmctld </dev/null 9>&- >>"$LOG/slurmctld.log" 2>&1 || fail_daemon slurmctld "$LOG/slurmctld.log" "slurmctld exited with an error"
fi
wait_for slurmctld "$LOG/slurmctld.log" "$RUN/slurmctld.pid" slurmctld ctld_ok

# ------------------------------------------------ slurmd (one per node)
# With several nodes each slurmd gets a UTS namespace whose hostname is its node's name (see the
# top); where the kernel refuses one (an unprivileged container), slurmd runs in this one and
# the node's tasks see this machine's hostname.
uts_ok=0
[ "$NODES" -gt 1 ] && unshare --uts true 2>/dev/null && uts_ok=1
[ "$NODES" -gt 1 ] && [ "$uts_ok" -eq 0 ] && say "no UTS namespace here (unshare --uts failed): every node's tasks see hostname $(hostname)"
for i in "${!NODE_NAMES[@]}"; do
  name=${NODE_NAMES[$i]} addr=${NODE_ADDRS[$i]}
  pidf="$RUN/slurmd-$name.pid" log="$LOG/slurmd-$name.log"
  if ! live_pid "$pidf" slurmd >/dev/null; then
    check_port_free "${NODE_PORTS[$i]}" "slurmd of $name" "$addr"
    rm -f "$pidf"
    if [ "$uts_ok" -eq 1 ]; then
      unshare --uts sh -c 'hostname "$1" && exec slurmd -N "$1"' slurmd-uts "$name" \
        </dev/null 9>&- >>"$log" 2>&1 || fail_daemon "slurmd ($name)" "$log" "slurmd exited with an error"
    else
      slurmd -N "$name" </dev/null 9>&- >>"$log" 2>&1 || fail_daemon "slurmd ($name)" "$log" "slurmd exited with an error"
    fi
  fi
done
for name in "${NODE_NAMES[@]}"; do
  wait_for "slurmd ($name)" "$LOG/slurmd-$name.log" "$RUN/slurmd-$name.pid" slurmd node_ready "$name"
done

wait_for "slurmdbd (sacct)" "$LOG/slurmdbd.log" "$RUN/slurmdbd.pid" slurmdbd sacct_ok

print_env
