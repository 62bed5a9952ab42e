#!/usr/bin/env bash
# The .deb on a clean Debian 12: debootstrap a minimal bookworm into a folder, install the package
# there with apt (which pulls its Depends from Debian's archive), and run `cd ~ && slicetrain
# finetune` as a new user would. Needs root, debootstrap and the network to Debian's archive; takes
# a few minutes, so it is not part of ctest (tests/install/check_install.sh runs there).
#   scripts/check_deb_clean_debian.sh build/slicetrain_0.1.0_amd64.deb [ROOT_DIR]
set -euo pipefail
deb="$(realpath "$1")"
root="${2:-/tmp/slicetrain-clean-debian}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if ! command -v debootstrap >/dev/null; then
  echo "== installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap > /dev/null
fi
if [ ! -x "$root/usr/bin/apt-get" ]; then
  echo "== debootstrap --variant=minbase bookworm $root"
  debootstrap --variant=minbase bookworm "$root" "$mirror" > "$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log"; exit 1; }
fi
mounts=()
cleanup() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
for m in proc sys dev; do mount --bind "/$m" "$root/$m"; mounts+=("$root/$m"); done
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
echo "== apt install ./$(basename "$deb") in the clean root"
chroot "$root" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends /tmp/$(basename "$deb")" > "$root.apt.log" 2>&1 || { tail -30 "$root.apt.log"; exit 1; }
chroot "$root" sh -c 'dpkg -l | grep -c "^ii"' | sed 's/^/packages installed in the clean root: /'
echo "== cd ~ && slicetrain finetune (HOME=/root in the clean root)"
chroot "$root" env -i HOME=/root PATH=/usr/bin:/bin sh -c 'cd ~ && slicetrain finetune --progress off --dashboard-port 0'
chroot "$root" sh -c 'man -w slicetrain 2>/dev/null || ls /usr/share/man/man1/slicetrain.1'
echo "clean Debian check passed"
