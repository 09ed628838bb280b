#!/usr/bin/env bash
# Copies the jars a pom in peers/ pins into a cache outside the repository, once per
# machine: `install-kafka.sh` (peers/kafka: Apache Kafka's broker, Java clients, tools,
# Streams and Connect, with their dependencies) and `install-kafka.sh spark-kafka`
# (peers/spark-kafka: Spark's own Kafka source). The cache directory is named after the
# peer and the version its pom pins (its first `<NAME.version>` property). A marker file
# names the pom's content it holds, so a second run is instant and an edited pom fetches
# again. Needs Java and Maven.
set -euo pipefail
peer="${1:-kafka}"
pom="$(cd "$(dirname "$0")/.." && pwd)/peers/$peer/pom.xml"
version=$(sed -n 's:.*<[a-z.-]*\.version>\(.*\)</[a-z.-]*\.version>.*:\1:p' "$pom" | head -1)
default="${XDG_CACHE_HOME:-$HOME/.cache}/tierbroker/$peer-$version"
dir="$default"
[ "$peer" = kafka ] && dir="${TIERBROKER_KAFKA_JARS:-$default}"
sum=$(sha256sum "$pom" | cut -d' ' -f1)
[ "$(cat "$dir/.complete" 2>/dev/null)" = "$sum" ] && exit 0
command -v mvn >/dev/null || { echo "Maven (mvn) is needed to fetch the jars of peers/$peer/pom.xml: apt-get install -y maven" >&2; exit 1; }
echo "fetching the jars of peers/$peer/pom.xml ($version) with Maven into $dir"
rm -rf "$dir.partial"
log=$(mktemp)
# Test jars (a pom pins one with <classifier>test</classifier>) go to test-jars/, off the
# classpath of every program run from the cache: they carry test logging configs.
if ! { mvn -q -B -f "$pom" dependency:copy-dependencies -DexcludeClassifiers=test \
         -DoutputDirectory="$dir.partial" &&
       mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeClassifiers=test \
         -DexcludeTransitive=true -DoutputDirectory="$dir.partial/test-jars"; } >"$log" 2>&1; then
  missing=$(grep -oE '[[:alnum:]_.-]+:[[:alnum:]_.-]+:jar:[[:alnum:]_.-]+' "$log" | head -1 || true)
  if [ -n "$missing" ]; then
    echo "Maven Central has no $missing (pinned in peers/$peer/pom.xml)" >&2
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
