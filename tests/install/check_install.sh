#!/usr/bin/env bash
# The installed slicetrain runs from anywhere (docs/install.md), checked the way a user gets it:
#   1. `cmake --install BUILD --prefix STAGE`: the binary, bundled data, man page, docs and deploy
#      adapters land where they should;
#   2. `cpack -G DEB` builds the .deb; its file list and Depends are checked, it is unpacked into a
#      staging root (what dpkg -i would place under /);
#   3. with the checkout (and the build directory) hidden behind an empty tmpfs in a private mount
#      namespace, `cd / && slicetrain finetune` runs from both, with nothing else set;
#   4. the Ray adapter installs with pip from the installed share/slicetrain/deploy into a fresh
#      venv and finds the installed binary on PATH.
#   tests/install/check_install.sh BUILD_DIR SOURCE_DIR        (ctest: install_staged_and_deb)
# Needs root for unshare -m (exit 77 = skipped otherwise, except with CI=true).
set -euo pipefail
build="$(cd "$1" && pwd)"
src="$(cd "$2" && pwd)"
skip() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL: $*"; exit 1; fi
  echo "SKIP: $*"; exit 77
}
unshare -m true 2>/dev/null || skip "unshare -m is not permitted here (needs root)"
tmp="$(mktemp -d /tmp/st_install_XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== cmake --install into $tmp/stage"
cmake --install "$build" --prefix "$tmp/stage" > "$tmp/install.log"
for f in bin/slicetrain share/slicetrain/data/tokenizer/tokenizer.json \
         share/slicetrain/data/tiny_instruct/train.jsonl share/man/man1/slicetrain.1 \
         share/doc/slicetrain/README.md share/doc/slicetrain/errors.md \
         share/slicetrain/deploy/pyproject.toml share/slicetrain/deploy/ray/slicetrain_ray/adapter.py \
         share/slicetrain/deploy/k8s/indexed-job-tpu-v6e.yaml share/slicetrain/deploy/slurm/finetune.sbatch; do
  [ -s "$tmp/stage/$f" ] || fail "the install lacks $f"
done
if find "$tmp/stage" -name '.venv' -o -name '__pycache__' -o -name tests | grep -q .; then
  fail "the install holds build or test leftovers: $(find "$tmp/stage" -name '.venv' -o -name '__pycache__' -o -name tests)"
fi
grep -q '^\.SS finetune' "$tmp/stage/share/man/man1/slicetrain.1" || fail "the man page has no finetune section"

echo "== cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$tmp/pkg" > "$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; fail "cpack failed"; }
deb="$(ls "$tmp"/pkg/*.deb)"
echo "$(basename "$deb"): $(du -h "$deb" | cut -f1)"
dpkg-deb -c "$deb" > "$tmp/contents"
for f in ./usr/bin/slicetrain ./usr/share/slicetrain/data/tokenizer/tokenizer.json \
         ./usr/share/man/man1/slicetrain.1 ./usr/share/slicetrain/deploy/pyproject.toml; do
  grep -q " $f\$" "$tmp/contents" || fail "the .deb lacks $f"
done
echo "files in the .deb: $(wc -l < "$tmp/contents")"
depends="$(dpkg-deb -f "$deb" Depends)"
echo "Depends: $depends"
for lib in libopenblas libgloo libsentencepiece libcurl libgomp libstdc++6; do
  echo "$depends" | grep -q "$lib" || fail "Depends names no $lib package: $depends"
done
# Every dependency is a Debian package of this release (each alternative group has one installed,
# or provided by an installed package: libopenblas0 is the virtual package of the variants).
dpkg-query -W -f='${Package} ${Provides}\n' | tr -d ',' > "$tmp/provided"
IFS=',' read -ra groups <<< "$depends"
for g in "${groups[@]}"; do
  ok=0
  IFS='|' read -ra alts <<< "$g"
  for a in "${alts[@]}"; do
    name="$(echo "$a" | sed 's/(.*//; s/ //g')"
    dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed" && ok=1
    grep -qw -- "$name" "$tmp/provided" && ok=1
  done
  [ "$ok" = 1 ] || fail "dependency '$g' is not an installed Debian package here"
done
dpkg-deb -x "$deb" "$tmp/root"

echo "== the default job from / with the checkout hidden ($src)"
hide="mount -t tmpfs tmpfs '$src'"
case "$build/" in "$src"/*) ;; *) hide="$hide && mount -t tmpfs tmpfs '$build'" ;; esac
run() {  # run LABEL BINARY FLAGS...: slicetrain finetune from / in the namespace
  local label="$1" bin="$2"
  shift 2
  mkdir -p "$tmp/runs_$label"
  if ! env -i PATH=/usr/bin:/bin HOME="$tmp" unshare -m sh -c \
      "$hide && [ ! -e '$src/README.md' ] && cd / && '$bin' finetune --storage-path '$tmp/runs_$label' \
       --dashboard-port 0 --progress off $*" > "$tmp/$label.log" 2>&1; then
    cat "$tmp/$label.log"
    fail "$label: slicetrain finetune failed from / with the checkout hidden"
  fi
  grep -E '^(Epoch|Training completed)' "$tmp/$label.log" | sed "s/^/  $label: /"
  grep -q '^Training completed! Final metrics' "$tmp/$label.log" || fail "$label: no final metrics line"
}
run staged "$tmp/stage/bin/slicetrain" --num-epochs 1
run deb "$tmp/root/usr/bin/slicetrain"
# Not found anywhere is one line saying where it looked and what to set.
cp "$tmp/stage/bin/slicetrain" "$tmp/lonely"
set +e
env -i PATH=/usr/bin:/bin unshare -m sh -c "$hide && cd / && '$tmp/lonely' tokenize --text hi" > "$tmp/lonely.log" 2>&1
code=$?
set -e
[ "$code" = 1 ] || { cat "$tmp/lonely.log"; fail "a binary without data exited $code, not 1"; }
grep -q 'looked in .*SLICETRAIN_DATA_DIR' "$tmp/lonely.log" || { cat "$tmp/lonely.log"; fail "no 'looked in ... SLICETRAIN_DATA_DIR' line"; }
[ "$(wc -l < "$tmp/lonely.log")" = 1 ] || { cat "$tmp/lonely.log"; fail "more than one line"; }
echo "  no data: $(cat "$tmp/lonely.log")"

echo "== the Ray adapter from the installed share/slicetrain/deploy into a fresh venv"
python3 -m venv "$tmp/venv"
cp -r "$tmp/stage/share/slicetrain/deploy" "$tmp/deploy_src"  # pip builds in place
"$tmp/venv/bin/pip" install -q --disable-pip-version-check --no-deps "$tmp/deploy_src" > "$tmp/pip.log" 2>&1 \
  || { cat "$tmp/pip.log"; fail "pip install of the Ray adapter failed"; }
"$tmp/venv/bin/slicetrain-ray" --help | grep -q -- '--slicetrain-bin' || fail "slicetrain-ray --help"
found="$(PATH="$tmp/stage/bin:/usr/bin:/bin" "$tmp/venv/bin/python" -c \
  'import slicetrain_ray; print(slicetrain_ray.resolve_binary("slicetrain"))')"
[ "$found" = "$tmp/stage/bin/slicetrain" ] || fail "the adapter found '$found', not the installed binary"
echo "  slicetrain-ray finds $found"
echo "install checks passed"
