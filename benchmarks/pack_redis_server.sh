#!/usr/bin/env bash
# Packs Debian's redis-server (7.0, bookworm) and the libraries a machine without the package lacks into one
# directory, for running the remote-tier benchmark and tests where redis-server cannot be installed (the lent
# GPU machine).  Needs apt-get (a Debian or Ubuntu machine with the package lists: apt-get update).
#
#   bash benchmarks/pack_redis_server.sh [DIR]          # default .redis-bundle (git ignores it)
#   # on the other machine (glibc >= 2.34 and OpenSSL 3: Debian 12, Ubuntu 22.04 or later):
#   JITOPS_REDIS_SERVER=DIR/redis-server JITOPS_REDIS_LIBS=DIR/lib python benchmarks/bench_remote_cache.py
#
# redis-server is Debian's redis-check-rdb binary under another name: the one binary runs the server when its
# name is redis-server.  Files are copied, not linked, so the directory survives tools that drop symlinks.
set -euo pipefail
out=${1:-.redis-bundle}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q redis-tools liblzf1 libjemalloc2 libatomic1 2>/dev/null)
for deb in "$work"/*.deb; do
    dpkg -x "$deb" "$work/root"
done
mkdir -p "$out/lib"
cp "$work/root/usr/bin/redis-check-rdb" "$out/redis-server"
for lib in libjemalloc.so.2 liblzf.so.1 libatomic.so.1; do
    cp -L "$work/root/usr/lib/x86_64-linux-gnu/$lib" "$out/lib/$lib"
done
LD_LIBRARY_PATH="$out/lib" "$out/redis-server" --version
echo "packed into $out: JITOPS_REDIS_SERVER=$out/redis-server JITOPS_REDIS_LIBS=$out/lib"
