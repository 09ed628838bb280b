#!/usr/bin/env bash
# Installs the Debian packages the project needs: with `venv`, only what creating the
# virtualenv needs (python3-venv, where the Python lacks ensurepip); otherwise what the
# integration tests need too: kcat, curl (the README's examples use both), a Java
# runtime for PySpark (the pipeline tests run Spark on local[*]), and ZooKeeper (the
# multi-process cluster tests run Debian's server), Maven; then Apache Kafka's jars
# (install-kafka.sh) and Spark's own Kafka source (install-kafka.sh spark-kafka).
# Node.js and npm, and the kafkajs peers/kafkajs pins (npm ci, again when its lock changes);
# Quix Streams in a virtualenv of its own (peers/quixstreams), again when its pin changes.
set -euo pipefail
missing=()
${PYTHON:-python3} -c "import ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ "${1:-}" != venv ]; then
  command -v kcat >/dev/null || missing+=(kcat)
  command -v curl >/dev/null || missing+=(curl)
  command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
  [ -e /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
  command -v mvn >/dev/null || missing+=(maven)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  # The tests launch Java programs from their source, which takes the JDK's compiler.
  java --list-modules 2>/dev/null | grep jdk.compiler >/dev/null || missing+=(openjdk-17-jdk-headless)
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${missing[*]} from Debian's packages"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "${1:-}" != venv ]; then
  "$(dirname "$0")/install-kafka.sh"
  "$(dirname "$0")/install-kafka.sh" spark-kafka
  kafkajs="$(dirname "$0")/../peers/kafkajs"
  if [ ! -e "$kafkajs/node_modules/.package-lock.json" ] ||
     [ "$kafkajs/package-lock.json" -nt "$kafkajs/node_modules/.package-lock.json" ]; then
    echo "installing kafkajs into peers/kafkajs with npm ci"
    npm ci --prefix "$kafkajs" --no-audit --no-fund --loglevel=error >/dev/null
  fi
  quix="$(dirname "$0")/../peers/quixstreams"
  if [ ! -e "$quix/.venv/.installed" ] || [ "$quix/requirements.txt" -nt "$quix/.venv/.installed" ]; then
    echo "installing Quix Streams into peers/quixstreams/.venv"
    ${PYTHON:-python3} -m venv "$quix/.venv"
    "$quix/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$quix/requirements.txt"
    touch "$quix/.venv/.installed"
  fi
fi

