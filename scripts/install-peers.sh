#!/usr/bin/env bash
# Installs the Debian packages the integration tests need: kcat, and a Java runtime for
# PySpark (the pipeline tests run Spark on local[*]).
set -euo pipefail
missing=()
command -v kcat >/dev/null || missing+=(kcat)
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing ${missing[*]} from Debian's packages"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
