#!/usr/bin/env bash
# Installs the system packages metasrv's local stack, demo and tests need, on a Debian-family
# machine. The one list of them lives here: `make stack|demo|test`, `.ci/run` and the
# `metasrv stack` error messages all point at this script.
#
#   deploy/bootstrap.sh          services: JDK 17+, Maven, etcd, PostgreSQL, Python 3.11 + venv
#   deploy/bootstrap.sh --test   the same, plus Chromium for the dashboard's browser test and
#                                Prometheus (with promtool) for the monitoring tests
#
# Idempotent and silent when nothing is missing. Exits non-zero naming the packages and the
# command to run when it cannot install them (not root and no sudo, or no apt-get).
set -euo pipefail

with_test=0
for arg in "$@"; do
  case "$arg" in
    --test) with_test=1 ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bootstrap: unknown argument '$arg' (expected --test)" >&2; exit 2 ;;
  esac
done

need=()
have() { command -v "$1" >/dev/null 2>&1; }

have etcd || need+=(etcd-server)
have etcdctl || need+=(etcd-client)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
java_major() {
  # `java -version` prints e.g.: openjdk version "17.0.15" 2025-04-15 (on stderr).
  local out
  out=$(java -version 2>&1) || return 0
  if [[ $out =~ version\ \"([0-9]+) ]]; then echo "${BASH_REMATCH[1]}"; fi
}
major=""
have java && major=$(java_major)
if [ -z "$major" ] || [ "$major" -lt 17 ]; then need+=(openjdk-17-jdk-headless); fi
have mvn || need+=(maven)
if ! have python3.11 || ! python3.11 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3.11 python3.11-venv)
fi
if [ "$with_test" = 1 ]; then
  have chromium || need+=(chromium)
  { have prometheus && have promtool; } || need+=(prometheus)
fi

[ "${#need[@]}" -eq 0 ] && exit 0

cannot() {
  echo "bootstrap: missing system packages: ${need[*]}" >&2
  echo "bootstrap: $1; install them with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
  exit 1
}
have apt-get || cannot "no apt-get here (metasrv's stack expects a Debian-family machine)"
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif have sudo && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  cannot "not root, and sudo is not available without a password"
fi

echo "bootstrap: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
# Debian's postgresql package would create and start a 'main' cluster on 5432; the stack runs
# its own cluster in its state dir, so none is created.
"${as_root[@]}" mkdir -p /etc/postgresql-common
echo "create_main_cluster = false" | "${as_root[@]}" tee /etc/postgresql-common/createcluster.conf >/dev/null
log=$(mktemp -t metasrv-bootstrap.XXXXXX)
if ! { "${as_root[@]}" apt-get update -q && "${as_root[@]}" apt-get install -y -q \
  -o Dpkg::Options::=--force-confold "${need[@]}"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "bootstrap: apt-get failed (full log: $log); packages: ${need[*]}" >&2
  exit 1
fi
rm -f "$log"
# Debian starts the services it installs; the stack runs its own, on its own ports, and the
# monitoring tests start their own Prometheus (the package recommends node-exporter).
for unit in etcd postgresql prometheus prometheus-node-exporter; do
  if have systemctl; then "${as_root[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true; fi
  if have service; then "${as_root[@]}" service "$unit" stop >/dev/null 2>&1 || true; fi
done
echo "bootstrap: done"
