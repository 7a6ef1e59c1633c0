#!/usr/bin/env bash
# Stop the dev SLURM cluster started by launch/start_slurm.sh, by PID (pid files under
# BASE_DIR/run), in the order slurmd (every node's: run/slurmd-<node>.pid), slurmctld, slurmdbd,
# mariadbd, munged, waiting for each to exit (SIGTERM, then SIGKILL after a timeout). Exit 0
# when nothing runs.
#
#   launch/stop_slurm.sh [BASE_DIR]      # default: $SCALERL_SLURM_DIR or /tmp/scalerl-slurm
#
# Jobs still running or pending are cancelled first (so that no job process outlives
# slurmd); set SCALERL_SLURM_KEEP_JOBS=1 to keep them (slurmctld requeues/recovers them
# on the next start, running job steps keep running without slurmd).
# SCALERL_SLURM_STOP_TIMEOUT: seconds to wait per daemon before SIGKILL [20].
set -uo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
BASE="${1:-${SCALERL_SLURM_DIR:-/tmp/scalerl-slurm}}"
case "$BASE" in /*) ;; *) BASE="$(pwd)/$BASE" ;; esac
BASE="${BASE%/}"
RUN="$BASE/run"
WAIT="${SCALERL_SLURM_STOP_TIMEOUT:-20}"
export SLURM_CONF="$BASE/etc/slurm.conf"

say() { printf 'stop_slurm: %s\n' "$*" >&2; }

# A process that exited but was not reaped yet (zombie) counts as gone: PID 1 of some
# containers/VMs reaps orphans only every few seconds.
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

live_pid() {  # live_pid PIDFILE COMM
  local f=$1 comm=$2 pid
  [ -s "$f" ] || return 1
  pid=$(tr -dc '0-9' <"$f")
  [ -n "$pid" ] && alive "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
  echo "$pid"
}

rc=0
stop_one() {  # stop_one NAME [PIDFILE] (default pid file RUN/NAME.pid, process name NAME)
  local name=$1 pidf="${2:-$RUN/$1.pid}" pid i
  if ! pid=$(live_pid "$pidf" "$name"); then
    rm -f "$pidf"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < WAIT * 10; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  if alive "$pid"; then
    say "$name (pid $pid) still running after ${WAIT}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then say "ERROR: $name (pid $pid) does not die"; rc=1; return; fi
  fi
  rm -f "$pidf"
  say "stopped $name (pid $pid${2:+, $(basename "$2")})"
}

# Every node's slurmd (run/slurmd-<node>.pid; run/slurmd.pid from before nodes had names).
any_slurmd() {
  local f
  for f in "$RUN"/slurmd.pid "$RUN"/slurmd-*.pid; do [ -e "$f" ] && live_pid "$f" slurmd >/dev/null && return 0; done
  return 1
}

[ -d "$RUN" ] || { say "nothing to stop under $BASE"; exit 0; }

if [ "${SCALERL_SLURM_KEEP_JOBS:-0}" != 1 ] && live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null &&
  any_slurmd; then
  jobs=$(timeout 10 squeue -h -t PENDING,RUNNING,SUSPENDED,CONFIGURING,REQUEUED -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    say "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for ((i = 0; i < 150; i++)); do  # KillWait=5 plus epilog; give it up to 15 s
      [ -z "$(timeout 5 squeue -h -t RUNNING,COMPLETING,CONFIGURING -o '%A' 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
fi

for f in "$RUN"/slurmd.pid "$RUN"/slurmd-*.pid; do [ -e "$f" ] && stop_one slurmd "$f"; done
for d in slurmctld slurmdbd mariadbd munged; do stop_one "$d"; done
exit "$rc"
