#!/usr/bin/env bash
# Installs the Debian packages the test suite needs (Debian 12, run as root).
#  - SLURM single-node cluster with accounting: launch/start_slurm.sh
#  - chromium + chromium-driver: browser tests
#  - bubblewrap: the code sandbox's OS boundary (namespaces, read-only system), src/scalerl/task/sandbox.py
# Idempotent: apt is not touched at all when every package is already installed.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

PACKAGES=(
  slurmctld slurmd slurm-client slurmdbd munge mariadb-server
  chromium chromium-driver
  bubblewrap
)

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for p in "${PACKAGES[@]}"; do
  if is_installed "$p"; then
    echo "install_system: $p already installed"
  else
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install_system: all packages present, skipping apt"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo -E); else
    echo "install_system: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi

echo "install_system: installing: ${missing[*]}"
start=$(date +%s)
"${SUDO[@]}" apt-get update -q
# Debian's postinst scripts try to start services through invoke-rc.d; without systemd/
# init that prints "policy-rc.d denied execution of start": harmless, nothing starts.
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

still=()
for p in "${missing[@]}"; do is_installed "$p" || still+=("$p"); done
if [ "${#still[@]}" -ne 0 ]; then
  echo "install_system: FAILED, still missing: ${still[*]}" >&2
  exit 1
fi
echo "install_system: done in $(( $(date +%s) - start )) s"
