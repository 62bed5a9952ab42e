#!/usr/bin/env bash
# Checks that the runtime stage of each deploy/docker/Dockerfile* installs every shared
# libraries the built slicetrain binary loads: every library `ldd` resolves belongs to a Debian
# package that the `base` stage names in its apt-get line, or that such a package (or the
# debian:12-slim base, i.e. the Priority: required packages) pulls in; every library the binary
# links directly (ELF NEEDED) is named itself (or is in the base). A named package that the binary
# does not use is reported as a warning.
# Runs on the Debian build host (dpkg database); no Docker engine needed.
#   deploy/tests/check_docker_libs.sh build/slicetrain [Dockerfile...]
# Exit 77 (skipped) when dpkg or the binary is missing, unless CI=true, where that is a failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-}"
shift || true
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$here/../docker/Dockerfile" "$here/../docker/Dockerfile.cuda")

skip() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL: $*"; exit 1; fi
  echo "SKIP: $*"; exit 77
}
[ -x "$bin" ] || skip "no slicetrain binary at '$bin'"
command -v dpkg-query >/dev/null && command -v ldd >/dev/null && command -v objdump >/dev/null \
  || skip "needs dpkg-query, ldd and objdump (a Debian host)"

# Package owning a file (merged /usr: /lib/x is /usr/lib/x in dpkg's database).
owner() {
  local f="$1" real
  real="$(readlink -f "$f")"
  for p in "$f" "$real" "/usr$f" "/usr$real"; do
    if out="$(dpkg-query -S "$p" 2>/dev/null)"; then echo "${out%%:*}" | cut -d, -f1; return; fi
  done
  echo "?"
}

declare -A lib_pkg=()   # soname -> package
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] && [ -n "$path" ] && [ "$path" != "not" ] || continue
  lib_pkg["$name"]="$(owner "$path")"
done < <(ldd "$bin")
needed=$(objdump -p "$bin" | awk '/NEEDED/ {print $2}')
for n in $needed; do
  [ -n "${lib_pkg[$n]:-}" ] || { echo "FAIL: ldd did not resolve $n"; exit 1; }
done

# Closure of Depends/Pre-Depends over installed packages (the database read once).
declare -A deps_of=() installed=()
while IFS=$'\t' read -r p st deps; do
  [ "$st" = "install ok installed" ] || continue
  installed["$p"]=1
  deps_of["$p"]="$(echo "$deps" | tr ',|' '\n\n' | sed -e 's/(.*)//' -e 's/:any//' -e 's/ //g' | tr '\n' ' ')"
done < <(dpkg-query -W -f='${Package}\t${Status}\t${Pre-Depends}, ${Depends}\n')
declare -A seen=()
close() {
  local queue=("$@") p d
  while [ ${#queue[@]} -gt 0 ]; do
    p="${queue[0]}"; queue=("${queue[@]:1}")
    [ -z "${seen[$p]:-}" ] || continue
    seen["$p"]=1
    for d in ${deps_of[$p]:-}; do
      [ -n "${installed[$d]:-}" ] && queue+=("$d")
    done
  done
}
required=$(dpkg-query -W -f='${Package} ${Priority}\n' | awk '$2 == "required" {print $1}')
close $required
declare -A base=()
for p in "${!seen[@]}"; do base["$p"]=1; done

status=0
for df in "${files[@]}"; do
  # Package names of the apt-get install in the `base` stage (CUDA packages with ${...} excluded).
  pkgs=$(awk '/^FROM .* AS base/ {on=1; next} /^FROM / {on=0} on' "$df" \
    | sed -n '/apt-get install/,/&&[^\\]*rm -rf/p' | tr ' \\' '\n\n' \
    | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(apt-get|install|rm|update)$' | sort -u)
  [ -n "$pkgs" ] || { echo "FAIL: $df: no apt-get install found in the base stage"; status=1; continue; }
  seen=()
  for p in "${!base[@]}"; do seen["$p"]=1; done
  close $pkgs
  named=" $(echo $pkgs) "
  for lib in "${!lib_pkg[@]}"; do
    p="${lib_pkg[$lib]}"
    if [ -z "${seen[$p]:-}" ]; then
      echo "FAIL: $df: $lib comes from $p, which the runtime stage does not install"; status=1
    fi
  done
  for n in $needed; do
    p="${lib_pkg[$n]}"
    if [[ "$named" != *" $p "* ]] && [ -z "${base[$p]:-}" ]; then
      echo "FAIL: $df: the binary links $n ($p) directly; name $p in the runtime stage"; status=1
    fi
  done
  used=" $(printf '%s ' "${lib_pkg[@]}") "
  for p in $pkgs; do
    case "$p" in ca-certificates | libnccl2) continue ;; esac  # HTTPS roots; the coming GPU backend
    if [[ "$used" != *" $p "* ]]; then
      # Only a warning: an extra package costs image size, not correctness (and lets the image
      # name a library that a change in flight is about to link, e.g. the dashboard's httplib).
      echo "warning: $df: $p is installed but the binary loads no library of it"
    fi
  done
  [ $status -ne 0 ] || echo "ok: $(basename "$df"): ${#lib_pkg[@]} libraries from $(echo $pkgs | wc -w) named packages + dependencies"
done
exit $status
