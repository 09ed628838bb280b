#!/usr/bin/env bash
# Installs the Debian packages the integration tests talk to: kcat.
set -euo pipefail
missing=()
command -v kcat >/dev/null || missing+=(kcat)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing ${missing[*]} from Debian's packages"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
