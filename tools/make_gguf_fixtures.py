#!/usr/bin/env python3
"""Generate the GGUF goldens of tests/test_gguf.cpp with the `gguf` package (llama.cpp's own Python library).

Usage (from any directory; offline, about a second):
    tools/.venv/bin/python tools/make_gguf_fixtures.py [--out tests/fixtures/gguf]

Needs tools/.venv with gguf==0.19.0 (tools/requirements.txt) and numpy. Everything is rewritten on every run.

What it writes (all little-endian):
  - values.f32: 8 rows x 256 fp32 inputs: N(0, 1) rows, a row of zeros and tiny values (fp16-subnormal scales), a row
    with one large outlier per block, a row of values that land exactly on half-way points of Q8_0's grid (k + 0.5
    times the block's scale) and a row of mixed magnitudes.
  - quant.<type> for F16, BF16, Q8_0, Q4_0 and Q5_0: gguf.quants.quantize(values, type) as bytes (gguf's numpy versions of
    ggml-quants.c's reference quantizers, bit-exact with them per gguf), and dequant.<type>: gguf.quants.dequantize
    of those bytes as fp32.
  - kvalues.f32: 64 rows x 256 fp32 inputs for the K-quants (see k_inputs), quant.q4_k / quant.q6_k: ggml's C
    reference quantizers (quantize_row_q4_K_ref, quantize_row_q6_K_ref) on them, called in llama-cpp-python's
    libggml-base.so (tools/requirements-llama.txt; these files are left as they are without it), and
    kdequant.q4_k / kdequant.q6_k: ggml's dequantize_row_q4_K / _q6_K of those bytes.
  - blocks.<type> for Q4_K and Q6_K (gguf 0.19 has no quantizer for them): 4 super-blocks of random bytes whose fp16
    scales are random finite values in [1e-3, 1e-1], and dequant.<type>: gguf.quants.dequantize of them.
  - writer.gguf: a file written by gguf.GGUFWriter (architecture "slicetrain-test"): one metadata value of every
    scalar type, a string with non-ASCII text, arrays of strings, int32, uint8 and float32, and four tensors
    (F32 [2, 3], F16 [4, 8], BF16 [3, 16], Q8_0 [2, 64] as torch shapes), and writer.json describing what is in it
    (metadata values with their GGUF type names, tensors with name, ne, ggml type and their values as fp32).
"""
import argparse
import ctypes
import json
import os
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V


def inputs() -> np.ndarray:
    rng = np.random.default_rng(1234)
    rows = [rng.standard_normal(256).astype(np.float32) for _ in range(3)]
    tiny = np.zeros(256, np.float32)
    tiny[32:64] = rng.standard_normal(32).astype(np.float32) * 1e-6  # scales below fp16's normal range
    tiny[64:96] = 1e-30
    rows.append(tiny)
    outlier = (rng.standard_normal(256) * 0.01).astype(np.float32)
    outlier[::32] = np.float32(37.5)  # the first value of each block dominates it
    outlier[16::32] = np.float32(-80.25)
    rows.append(outlier)
    # Q8_0 ties: max |x| = 127 d with d = 1/16, others at (k + 0.5) d: x / d lands on .5 exactly.
    ties = np.zeros(256, np.float32)
    for b in range(8):
        ties[b * 32] = 127.0 / 16
        for j in range(1, 32):
            ties[b * 32 + j] = ((j - 16) + 0.5) / 16
    rows.append(ties)
    mixed = (rng.standard_normal(256) * np.exp(rng.uniform(-8, 8, 256))).astype(np.float32)
    rows.append(mixed)
    rows.append((rng.uniform(-1, 1, 256) * 1000).astype(np.float32))
    return np.stack(rows)


def k_inputs() -> np.ndarray:
    """64 rows of 256 values (one K-quant super-block each) that take the quantizers' searches down every path:
    Gaussian rows over 12 binary orders of magnitude, rows with an offset (all positive: the min clamps to 0),
    all negative, sparse rows (mostly exact zeros), heavy-tailed rows, constant and all-zero sub-blocks, one outlier per
    sub-block, values far below fp16's range, the Q8_0 rows of values.f32."""
    rng = np.random.default_rng(4321)
    rows = []
    for k in range(24):
        rows.append(rng.standard_normal(256) * 2.0 ** rng.uniform(-10, 2))
    for k in range(8):
        rows.append(np.abs(rng.standard_normal(256)) + rng.uniform(0, 3))
    for k in range(4):
        rows.append(-np.abs(rng.standard_normal(256)) * rng.uniform(0.01, 5))
    for k in range(8):
        r = rng.standard_normal(256) * 0.05
        r[rng.uniform(size=256) < 0.8] = 0
        rows.append(r)
    for k in range(8):
        rows.append(rng.standard_t(2, 256) * 0.02)
    const = np.zeros(256)
    const[:32] = 0.75
    const[64:96] = -0.125
    const[128:] = rng.standard_normal(128)
    rows.append(const)
    rows.append(np.zeros(256))
    outlier = rng.standard_normal(256) * 0.01
    outlier[::32] = 9.0  # one value dominating each Q4_K sub-block
    rows.append(outlier)
    rows.append(rng.standard_normal(256) * 1e-9)  # scales far below fp16's normal range
    rows.extend(inputs().astype(np.float64))
    return np.stack(rows).astype(np.float32)


def ggml_base():
    """ggml's base library from llama-cpp-python, or None."""
    try:
        import llama_cpp
    except ImportError:
        return None
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    for f in ("quantize_row_q4_K_ref", "quantize_row_q6_K_ref", "dequantize_row_q4_K", "dequantize_row_q6_K"):
        getattr(lib, f).restype = None
        getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/fixtures/gguf"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    x = inputs()
    x.tofile(out / "values.f32")
    for name, qt in (("f16", Q.F16), ("bf16", Q.BF16), ("q8_0", Q.Q8_0), ("q4_0", Q.Q4_0), ("q5_0", Q.Q5_0)):
        q = gguf.quants.quantize(x, qt)
        q.tofile(out / f"quant.{name}")
        gguf.quants.dequantize(q, qt).astype(np.float32).tofile(out / f"dequant.{name}")

    rng = np.random.default_rng(99)
    for name, qt in (("q4_k", Q.Q4_K), ("q6_k", Q.Q6_K)):
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        blocks = rng.integers(0, 256, size=(4, block_bytes), dtype=np.uint8)
        scales = rng.uniform(1e-3, 1e-1, size=(4, 2)).astype(np.float16).view(np.uint8)
        if qt == Q.Q4_K:
            blocks[:, 0:4] = scales  # d and dmin
        else:
            blocks[:, block_bytes - 2:] = scales[:, 0:2]  # d is last
        blocks.tofile(out / f"blocks.{name}")
        gguf.quants.dequantize(blocks, qt).astype(np.float32).tofile(out / f"dequant.{name}")

    # The K-quants' quantizers: ggml's own C reference (quantize_row_q4_K_ref, quantize_row_q6_K_ref in
    # ggml-quants.c), called in the libggml-base.so that llama-cpp-python builds (tools/requirements-llama.txt);
    # gguf has no Python version of them. Skipped, keeping the files there, when llama-cpp-python is missing.
    ggml = ggml_base()
    if ggml is None:
        print("llama-cpp-python is not installed: kvalues.f32 and quant.q4_k/quant.q6_k are left as they are")
    else:
        kx = k_inputs()
        kx.tofile(out / "kvalues.f32")
        for name, fn, block_bytes in (("q4_k", ggml.quantize_row_q4_K_ref, 144),
                                      ("q6_k", ggml.quantize_row_q6_K_ref, 210)):
            q = np.zeros(kx.size // 256 * block_bytes, np.uint8)
            fn(kx.ctypes.data_as(ctypes.c_void_p), q.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(kx.size))
            q.tofile(out / f"quant.{name}")
            back = np.zeros(kx.size, np.float32)
            deq = getattr(ggml, "dequantize_row_" + name[:2] + name[2:].upper())
            deq(q.ctypes.data_as(ctypes.c_void_p), back.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(kx.size))
            back.tofile(out / f"kdequant.{name}")

    path = out / "writer.gguf"
    w = gguf.GGUFWriter(str(path), "slicetrain-test")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "Grüße, 世界")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", 1.0 / 3.0)
    w.add_array("test.strings", ["<pad>", "<eos>", "▁hello", ""])
    w.add_array("test.ints", [1, -2, 3])
    w.add_key_value("test.bytes", [0, 7, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_array("test.floats", [0.5, -1.25, 3.0e-5])
    tensors = []
    a = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5)
    w.add_tensor("a", a)
    tensors.append(("a", a.shape, "F32", a))
    b = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    w.add_tensor("b", b.astype(np.float16))
    tensors.append(("b", b.shape, "F16", b.astype(np.float16).astype(np.float32)))
    c = rng.standard_normal((3, 16)).astype(np.float32)
    cq = gguf.quants.quantize(c, Q.BF16)
    w.add_tensor("c", cq, raw_dtype=Q.BF16)
    tensors.append(("c", c.shape, "BF16", gguf.quants.dequantize(cq, Q.BF16)))
    d = rng.standard_normal((2, 64)).astype(np.float32)
    dq = gguf.quants.quantize(d, Q.Q8_0)
    w.add_tensor("d", dq, raw_dtype=Q.Q8_0)
    tensors.append(("d", d.shape, "Q8_0", gguf.quants.dequantize(dq, Q.Q8_0)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # What the file holds, read back with gguf's own reader.
    r = gguf.GGUFReader(str(path))
    meta = []
    for field in r.fields.values():
        if field.name.startswith("GGUF."):
            continue  # the reader's own view of the header (version and counts), not metadata
        t = field.types[0]
        entry = {"key": field.name, "type": t.name}
        if t == V.ARRAY:
            entry["elem"] = field.types[1].name
            entry["value"] = field.contents()
        else:
            entry["value"] = field.contents()
        if t in (V.UINT64,):
            entry["value"] = str(entry["value"])  # JSON numbers lose 64-bit integers
        meta.append(entry)
    desc = {
        "metadata": meta,
        "tensors": [{"name": n, "ne": list(reversed(shape)), "type": ty,
                     "values": [float(v) for v in np.asarray(vals, np.float32).ravel()]}
                    for n, shape, ty, vals in tensors],
        "file_bytes": os.path.getsize(path),
    }
    (out / "writer.json").write_text(json.dumps(desc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
