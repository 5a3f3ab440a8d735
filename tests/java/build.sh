#!/usr/bin/env bash
# Compile tests/java/CuratorTool.java into <repo>/target/java-classes and write
# <repo>/target/java-classes/classpath.txt (runtime classpath, colon-separated).
# Silent on success; recompiles only when the .java is newer than the class file.
# Usage afterwards:  java -cp "$(cat target/java-classes/classpath.txt)" CuratorTool ...
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
src="$here/CuratorTool.java"
out="$root/target/java-classes"
jardir="${CURATOR_JAR_DIR:-/usr/share/java}"

# Runtime jars (Debian packages libcurator-recipes-java, libcurator-framework-java, zookeeper).
# slf4j-simple is the only slf4j binding on the path; CuratorTool sets it to WARN on stderr.
jars=(curator-recipes curator-framework curator-client guava zookeeper zookeeper-jute slf4j-api slf4j-simple
      netty-handler netty-common netty-buffer netty-transport netty-codec netty-resolver
      netty-transport-native-epoll netty-transport-native-unix-common)

cp=""
for j in "${jars[@]}"; do
    f="$jardir/$j.jar"
    if [[ ! -f "$f" ]]; then
        echo "build.sh: missing $f (apt-get install -y libcurator-recipes-java libcurator-framework-java zookeeper libslf4j-java)" >&2
        exit 1
    fi
    cp="$cp:$f"
done
cp="${cp#:}"

mkdir -p "$out"
# Serialise concurrent builds (cargo runs tests in parallel).
exec 9>"$out/.build.lock"
flock 9

if [[ ! -f "$out/CuratorTool.class" || "$src" -nt "$out/CuratorTool.class" ]]; then
    tmp="$(mktemp -d "$out/.tmp.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    if ! javac -nowarn -encoding UTF-8 --release 17 -Xlint:none -d "$tmp" -cp "$cp" "$src" >"$tmp/javac.log" 2>&1; then
        cat "$tmp/javac.log" >&2
        exit 1
    fi
    rm -f "$out"/CuratorTool*.class
    mv "$tmp"/CuratorTool*.class "$out"/
fi

cpfile="$out/classpath.txt"
want="$out:$cp"
if [[ ! -f "$cpfile" || "$(cat "$cpfile")" != "$want" ]]; then
    printf '%s\n' "$want" >"$cpfile.tmp.$$"
    mv "$cpfile.tmp.$$" "$cpfile"
fi
