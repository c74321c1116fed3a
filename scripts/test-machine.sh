#!/usr/bin/env bash
# What `make test` needs beyond pip and npm, on a fresh machine: Debian's Chromium (the console's browser
# tests drive it), Node.js and npm (the client matrix and the coding agents), and PostgreSQL and Redis
# running (their tests never skip). As root it installs what is missing with apt and starts the
# services that are installed but down; otherwise it stops at once with the one command to run.
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || [ -x "${ROUTER_TEST_CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "make test needs ${missing[*]}: run  sudo apt-get install -y ${missing[*]}  (or make test as root)" >&2
        exit 1
    fi
    echo "installing ${missing[*]} (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y "${missing[@]}" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y "${missing[@]}" >/dev/null; }
fi

postgres_up() { pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; }
if ! postgres_up && command -v pg_ctlcluster >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    echo "starting PostgreSQL"
    for version in /etc/postgresql/*; do
        pg_ctlcluster --skip-systemctl-redirect "$(basename "$version")" main start || true
    done
fi
if ! redis_up && command -v redis-server >/dev/null 2>&1; then
    echo "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null || true
fi
for _ in $(seq 1 30); do
    postgres_up && redis_up && exit 0
    sleep 1
done
postgres_up || echo "make test needs PostgreSQL on 127.0.0.1:5432 (trust auth, database test): start it (as root: pg_ctlcluster <version> main start)" >&2
redis_up || echo "make test needs Redis on 127.0.0.1:6379: start it (redis-server --daemonize yes)" >&2
exit 1
