#!/usr/bin/env bash
# The module as a tarball for servers without Rust or libclang:
#   scripts/dist-module.sh <libwarden.so> <version> <out dir>
# writes <out dir>/warden-<version>-<arch>-<os>-glibc<min>.tar.gz, named for
# the target it was built for and the oldest glibc it runs on (the highest
# GLIBC_x.y symbol version the .so needs, read with objdump), holding one
# directory of the same name: libwarden.so, redis.conf.example, README.md,
# LICENSE. Its bytes depend only on its inputs (sorted names, owner 0, the
# last commit's time).
set -euo pipefail
so=$1 version=$2 out=$3
root=$(cd "$(dirname "$0")/.." && pwd)

host=$(rustc -vV | sed -n 's/^host: //p')          # x86_64-unknown-linux-gnu
arch=${host%%-*}
case $host in
  *-linux-gnu) os=linux-gnu ;;
  *) echo "dist-module: no tarball for $host (glibc Linux only)" >&2; exit 1 ;;
esac
glibc=$(objdump -T "$so" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
[ -n "$glibc" ] || { echo "dist-module: no GLIBC symbol versions in $so" >&2; exit 1; }

name=warden-$version-$arch-$os-glibc$glibc
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/$name"
install -m 0755 "$so" "$stage/$name/libwarden.so"
install -m 0644 "$root/redis.conf.example" "$root/README.md" "$root/LICENSE" "$stage/$name/"
epoch=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
  -cf - "$name" | gzip -n -9 > "$out/$name.tar.gz"
echo "$out/$name.tar.gz"
