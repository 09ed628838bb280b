#!/usr/bin/env bash
# Copies Apache Kafka's jars (the versions peers/kafka/pom.xml pins) with their dependencies
# into a cache outside the repository, once per machine: the tests run Kafka's broker, its
# Java clients and its tools from there. A marker file names the pom's content it holds,
# so a second run is instant and an edited pom fetches again. Needs Java and Maven.
set -euo pipefail
pom="$(cd "$(dirname "$0")/.." && pwd)/peers/kafka/pom.xml"
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
dir="${TIERBROKER_KAFKA_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/tierbroker/kafka-$version}"
sum=$(sha256sum "$pom" | cut -d' ' -f1)
[ "$(cat "$dir/.complete" 2>/dev/null)" = "$sum" ] && exit 0
command -v mvn >/dev/null || { echo "Maven (mvn) is needed to fetch Apache Kafka's jars: apt-get install -y maven" >&2; exit 1; }
echo "fetching Apache Kafka $version's jars with Maven into $dir"
rm -rf "$dir.partial"
log=$(mktemp)
if ! mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$dir.partial" >"$log" 2>&1; then
  missing=$(grep -oE '[[:alnum:]_.-]+:[[:alnum:]_.-]+:jar:[[:alnum:]_.-]+' "$log" | head -1 || true)
  if [ -n "$missing" ]; then
    echo "Maven Central has no $missing (pinned in peers/kafka/pom.xml)" >&2
  else
    echo "Maven failed: $(grep -m1 ERROR "$log" || tail -1 "$log")" >&2
  fi
  rm -f "$log"
  exit 1
fi
rm -f "$log"
rm -rf "$dir"
mv "$dir.partial" "$dir"
echo "$sum" > "$dir/.complete"
