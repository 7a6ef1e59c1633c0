#!/usr/bin/env bash
# Start a single-node SLURM cluster (with slurmdbd + MariaDB accounting) on this machine,
# by hand (no systemd), on loopback only, with every file under one base folder.
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
#   SCALERL_SLURM_PORT_BASE  first of 4 loopback ports: slurmctld, slurmd, slurmdbd, mariadbd [16817]
#   SCALERL_SLURM_TIMEOUT    seconds to wait for each daemon [60]
#   SCALERL_SLURM_CLUSTER    ClusterName [scalerl]
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

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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

check_port_free() {  # check_port_free PORT WHO
  if port_busy "$1"; then
    die "127.0.0.1:$1 (for $2) is already in use by another process; set SCALERL_SLURM_PORT_BASE or stop it"
  fi
}

node_state() { timeout 10 sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1; }
node_idle() { case "$(node_state)" in idle|mixed|allocated|completing) return 0 ;; *) return 1 ;; esac; }
# Like node_idle, but resumes a node that an earlier run left DOWN/DRAINED (e.g. "Kill task
# failed" after a stop with jobs on it, or a RealMemory from an older config): this private
# cluster's config is regenerated on every start. If slurmd keeps failing to register, the
# wait times out pointing at the log (the reason is in `sinfo -R` and slurmctld.log).
node_ready() {
  case "$(node_state)" in
    idle|mixed|allocated|completing) return 0 ;;
    down|drained|draining|drain) timeout 10 scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true; return 1 ;;
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
    live_pid "$RUN/slurmd.pid" slurmd >/dev/null &&
    node_idle && sacct_ok
}

print_env() {
  printf 'export SLURM_CONF=%s\n' "$CONF" >"$BASE/env.sh"
  say "cluster '$CLUSTER' up in $(elapsed) s (node $NODE, $CPUS CPUs, ${MEM_MB} MB; logs in $LOG)"
  printf 'export SLURM_CONF=%s\n' "$CONF"
}

# ---------------------------------------------------------------- main
install_packages

NODE=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ { m = int($2 / 1024); r = int(m * 0.95); if (m - r < 256) r = m - 256; print r }' /proc/meminfo)
export SLURM_CONF="$CONF"

mkdir -p "$BASE"
# fd 9 holds the lock; every daemon is started with 9>&- so that it does not inherit it.
exec 9>"$BASE/.start.lock"
flock -w $((TIMEOUT * 5)) 9 || die "another start_slurm.sh holds $BASE/.start.lock"

if [ -f "$CONF" ] && all_up; then
  print_env
  exit 0
fi

mkdir -p "$ETC" "$LOG" "$RUN" "$BASE/state/slurmctld" "$BASE/spool/slurmd" "$BASE/db" \
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

# Write a file only when its content changes (keeps the running daemons' view stable).
write_file() {  # write_file PATH MODE  (content on stdin)
  local tmp
  tmp=$(mktemp "$1.XXXXXX")
  cat >"$tmp"
  chmod "$2" "$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

write_file "$CONF" 0644 <<EOF
# Generated by launch/start_slurm.sh -- single-node dev cluster, loopback only.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
# every daemon binds the loopback address it is given, not all interfaces
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (default 120 s) is also how long a requeued job waits before it may start again.
AuthInfo=socket=$MUNGE_SOCK,cred_expire=15

StateSaveLocation=$BASE/state/slurmctld
SlurmdSpoolDir=$BASE/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
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

NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF

write_file "$DBD_CONF" 0600 <<EOF
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

# ------------------------------------------------ slurmd
if ! live_pid "$RUN/slurmd.pid" slurmd >/dev/null; then
  check_port_free "$SLURMD_PORT" slurmd
  rm -f "$RUN/slurmd.pid"
  slurmd -N "$NODE" </dev/null 9>&- >>"$LOG/slurmd.log" 2>&1 || fail_daemon slurmd "$LOG/slurmd.log" "slurmd exited with an error"
fi
wait_for slurmd "$LOG/slurmd.log" "$RUN/slurmd.pid" slurmd node_ready

wait_for "slurmdbd (sacct)" "$LOG/slurmdbd.log" "$RUN/slurmdbd.pid" slurmdbd sacct_ok

print_env
