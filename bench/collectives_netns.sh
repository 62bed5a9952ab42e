#!/usr/bin/env bash
# Two hosts over a bandwidth-limited link, on one machine: two network namespaces joined by a veth
# pair whose both ends are shaped with tc (tbf: RATE, default "10gbit 1gbit"), each namespace one
# host of `slicetrain launch --nnodes 2`, running `allreduce-loop --report` on a 64 MiB f32 buffer.
# Prints, per rate and ranks per host, the time of one all_reduce and the fraction of the link it
# achieves: a ring all_reduce over H hosts must send 2 (H - 1) / H x bytes out of every host, so
# link fraction = that / time / rate. With 2 ranks per host the group is hierarchical
# (shared memory inside a host, one TCP ring per local rank across them).
#   sudo bench/collectives_netns.sh            # RATES="10gbit 1gbit" PER_HOST="1 2" MIB=64 ITERS=8
# Needs root and `ip netns` and `tc` (iproute2); removes its namespaces on exit.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
rates="${RATES:-10gbit 1gbit}"
per_host="${PER_HOST:-1 2}"
mib="${MIB:-64}"
iters="${ITERS:-8}"
tag="stb$$"
cleanup() {
  ip netns del "${tag}a" 2>/dev/null || true
  ip netns del "${tag}b" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "${tag}a"
ip netns add "${tag}b"
ip link add "${tag}x" type veth peer name "${tag}y"
ip link set "${tag}x" netns "${tag}a"
ip link set "${tag}y" netns "${tag}b"
ip -n "${tag}a" addr add 10.233.0.1/24 dev "${tag}x"
ip -n "${tag}b" addr add 10.233.0.2/24 dev "${tag}y"
for ns in a b; do
  ip -n "${tag}$ns" link set lo up
done
ip -n "${tag}a" link set "${tag}x" up
ip -n "${tag}b" link set "${tag}y" up
count=$((mib * 1024 * 1024 / 4))
echo "# 2 hosts (network namespaces, veth, tc tbf on both ends), all_reduce of ${mib} MiB f32, $(nproc) cores"
echo "| link | ranks per host | transport | time per all_reduce | bytes out of each host | achieved | fraction of link |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for rate in $rates; do
  # Burst of 1 ms at the rate (at least 64 KiB), queue of 20 ms.
  for ns in a b; do
    dev="${tag}x"
    [ "$ns" = b ] && dev="${tag}y"
    ip netns exec "${tag}$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 2mb latency 20ms
  done
  bits=$(echo "$rate" | sed -e 's/gbit/*1000000000/' -e 's/mbit/*1000000/' | bc)
  for L in $per_host; do
    port=$((20000 + RANDOM % 20000))
    run() {  # run <namespace> <node rank> <address>
      SLICETRAIN_SECRET=netns-bench SLICETRAIN_HOST_IP="$3" ip netns exec "${tag}$1" "$bin" launch \
        --nnodes 2 --node-rank "$2" --nproc-per-node "$L" --master-addr 10.233.0.1 \
        --master-port "$port" -- allreduce-loop --count "$count" --iters "$iters" --report
    }
    run b 1 10.233.0.2 >"/tmp/$tag.b" 2>&1 &
    b=$!
    out="$(run a 0 10.233.0.1 2>&1)" || { echo "$out"; cat "/tmp/$tag.b"; exit 1; }
    wait $b || { cat "/tmp/$tag.b"; exit 1; }
    rm -f "/tmp/$tag.b"
    line="$(echo "$out" | grep 'allreduce-loop:' | sed 's/^([^)]*) //')"
    ms="$(echo "$line" | sed -E 's/.*: ([0-9.]+) ms per all_reduce.*/\1/')"
    via="$(echo "$line" | sed -E 's/.* via ([^:]+):.*/\1/')"
    # Bytes each host must send: 2 (H - 1) / H x message, H = 2 hosts.
    python3 - "$rate" "$bits" "$L" "$via" "$ms" "$mib" <<'EOF'
import sys
rate, bits, L, via, ms, mib = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6])
out_bytes = 2 * (2 - 1) / 2 * mib * 2**20
achieved = out_bytes * 8 / (ms / 1e3)
print(f"| {rate} | {L} | {via} | {ms:.1f} ms | {mib} MiB | {achieved / 1e9:.2f} Gbit/s | {100 * achieved / bits:.0f}% |")
EOF
  done
done
