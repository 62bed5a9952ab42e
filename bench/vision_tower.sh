#!/usr/bin/env bash
# The vision tower's forward at E2B's widths (16 layers of 768, 12 heads, patch 16, pooling 3; random
# weights, written by bench/peers/vision_tower_peer.py --write-e2b): `slicetrain images --model-id`
# beside transformers' get_image_features (bench/peers/vision_tower_peer.py: sdpa, fp32 and bf16
# autocast) on the same image, in the same run. Prints seconds per image and GFLOP/s.
#   bench/vision_tower.sh                       # one 640x480 image at the default budget (280)
#   BUDGET=70 IMAGE=photo.jpg bench/vision_tower.sh
# THREADS (default: all CPUs) applies to both; REPEATS (3) runs each, the median is printed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SLICETRAIN:-$root/build/slicetrain}"
py="${PYTHON:-$root/tools/.venv/bin/python}"
threads="${THREADS:-$(nproc)}"
repeats="${REPEATS:-3}"
budget="${BUDGET:-280}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
model="$tmp/e2b_vision"
"$py" "$root/bench/peers/vision_tower_peer.py" --write-e2b "$model" 2>/dev/null
# max_soft_tokens of the model's processor, for both sides
"$py" - "$model" "$budget" <<'PY'
import json, sys
p = f"{sys.argv[1]}/processor_config.json"
c = json.load(open(p)); c["image_processor"]["max_soft_tokens"] = int(sys.argv[2]); json.dump(c, open(p, "w"))
PY
image="${IMAGE:-$tmp/photo.png}"
if [ -z "${IMAGE:-}" ]; then
  "$py" -c "
import numpy as np; from PIL import Image
y, x = np.mgrid[0:480, 0:640]
Image.fromarray(np.stack([x % 256, y % 256, (x + y) % 256], -1).astype(np.uint8)).save('$image')"
fi
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads; budget $budget"
for r in $(seq "$repeats"); do
  OMP_NUM_THREADS=$threads "$bin" images --model-id "$model" --json "$image" >> "$tmp/ours"
done
"$py" - "$tmp/ours" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = statistics.median(r["tower_seconds"] for r in rows)
g = statistics.median(r["tower_gflops_per_s"] for r in rows)
r = rows[0]
print(f"slicetrain fp32: {r['patches']} patches -> {r['soft_tokens']} soft tokens: {s:.3f} s ({g:.1f} GFLOP/s)")
open(sys.argv[1] + ".flops", "w").write(str(r["tower_gflops_per_s"] * r["tower_seconds"]))
PY
"$py" "$root/bench/peers/vision_tower_peer.py" --model "$model" --images "$image" --threads "$threads" \
  --repeats "$repeats" 2>/dev/null | "$py" -c '
import json, sys
gflop = float(open(sys.argv[1]).read())
for l in sys.stdin:
    r = json.loads(l)
    print("transformers %s (%s): %d soft tokens: %.3f s (%.1f GFLOP/s)"
          % (r["dtype"], r["attn"], r["soft_tokens"], r["seconds"], gflop / r["seconds"]))' "$tmp/ours.flops"
