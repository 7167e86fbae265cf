#!/bin/sh
# Installs the system packages the tests use, only those missing, and only as root with
# apt-get. Otherwise it says what is missing. No server is started here: the tests start
# their own PostgreSQL (tests/pgserver.py, as the postgres user when root) and Redis when
# none answers, and fail loudly under CI=true when they cannot.
set -u
missing=""
have() { command -v "$1" >/dev/null 2>&1; }

have redis-server || missing="$missing redis-server"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
have kubectl || missing="$missing kubernetes-client"
have prometheus || missing="$missing prometheus"
have chromium || have chromium-browser || missing="$missing chromium"
# the real control-plane tier: a private network namespace, its own CA, Go for the build
have ip || missing="$missing iproute2"
have openssl || missing="$missing openssl"
have setpriv || have unshare || missing="$missing util-linux"
have chromedriver || ls /usr/lib/chromium/chromedriver >/dev/null 2>&1 || missing="$missing chromium-driver"
# the product's image: podman with runc (see deploy/README.md), debootstrap for its base where
# no registry serves one, docker-compose to check docker-compose.yml
have podman || missing="$missing podman"
have runc || missing="$missing runc"
have debootstrap || missing="$missing debootstrap"
have docker-compose || missing="$missing docker-compose"

if [ -z "$missing" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && have apt-get; then
    echo "installing:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
else
    echo "note: missing system packages:$missing (run 'make test' as root with apt-get to install them)" >&2
fi
exit 0
