// Tiled causal attention on the CPU, FlashAttention-2's scheme: scores, probabilities and their
// gradients exist only as tiles (a block of query rows x a block of 128 keys), so memory is linear
// in T. Forward: per query block an online softmax (running max m, running sum l, rescaled
// accumulator) over the key blocks that hold any visible key; saves out and lse = m + log l.
// Backward: recomputes P = exp(S - lse) tile by tile, Di = rowsum(dout * out),
// dS = P * (dP - Di), dq = dS K, dk += dS^T Q, dv += P^T dout.
//
// A tile's rows are the query heads of one kv head (GQA group) stacked over a block of queries:
// row r = query q0 + r / group, head h0 + r % group (64 rows: 16 queries x 4 heads at GQA 4:1).
// They share the K/V block, so each product is one cblas_sgemm for the whole group (the group's
// heads of a query are contiguous in q: packing a block is one copy per query), and the causal
// diagonal is cut at a finer query granularity than 64 queries (less masked work).
// Tasks own disjoint outputs and sum in a fixed order: results are bit-identical from run to run
// for a given thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/ops_cpu.h"

namespace st::cpu {
namespace {

// Tile shape, measured with bench/bench_kernels.cpp (64 or 128 rows and 128 keys are best there;
// 256 keys or 256 rows are slower, 64 keys much slower).
constexpr int64_t kTileRows = 64;   // query rows (queries x group heads)
constexpr int64_t kKeyBlock = 128;  // key columns

int64_t Blocks(int64_t n, int64_t block) {
  return (n + block - 1) / block;
}

// Queries per tile for a GQA group size, and an upper bound of a tile's rows for any group of H.
int64_t QueryBlock(int64_t group) {
  return std::max<int64_t>(1, kTileRows / group);
}
int64_t MaxTileRows(int64_t H) {
  return std::max(kTileRows, H);
}

// Per-thread tile scratch for tiles of up to R rows: S/P and dP/dS [R, 128]; the packed q, dout
// and dq (the forward's accumulator) [R, D]; the packed lse (running max) and Di (running sum) [R].
struct TileScratch {
  float *s, *ds, *qs, *gos, *dqs, *lse, *di;
};

int64_t ThreadFloats(int64_t R, int64_t D) {
  return 2 * R * kKeyBlock + 3 * R * D + 2 * R;
}

TileScratch ThreadScratch(int64_t R, int64_t D) {
  thread_local std::vector<float> buffer;
  const int64_t count = ThreadFloats(R, D);
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
  TileScratch t;
  t.s = buffer.data();
  t.ds = t.s + R * kKeyBlock;
  t.qs = t.ds + R * kKeyBlock;
  t.gos = t.qs + R * D;
  t.dqs = t.gos + R * D;
  t.lse = t.dqs + R * D;
  t.di = t.lse + R;
  return t;
}

// Per-call tables, on the calling thread and shared (read-only) by the team.
struct CallScratch {
  std::vector<int64_t> count;  // [B, T+1] real tokens among keys [0, t)
  std::vector<uint8_t> empty;  // [B, query blocks]: the block has a row with no visible key
  std::vector<float> f;        // forward: [B, Hkv, D] mean of V; backward: [B, H, T] Di
};

struct CallSizes {
  int64_t count, empty, f;
};

// Upper bounds (query blocks <= T whatever the group size).
CallSizes CallScratchSizes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  return {B * (T + 1), B * T, std::max(B * Hkv * D, B * H * T)};
}

template <typename V>
void Grow(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

CallScratch& Shared(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  thread_local CallScratch s;
  const CallSizes n = CallScratchSizes(B, T, H, Hkv, D);
  Grow(s.count, n.count);
  Grow(s.empty, n.empty);
  Grow(s.f, n.f);
  return s;
}

// One call's shape and mask, with O(1) visibility queries from the prefix counts.
struct Geometry {
  int64_t B, T, H, Hkv, D, group, ldq, ldk;
  AttnMask mask;                   // window and document starts
  int64_t bq, nqb, nkb, rows_max;  // queries per tile, query and key blocks, rows per tile
  const uint8_t* pad;              // [B, T] or null
  const int64_t* count;            // [B, T+1] or null (no padding)
  const uint8_t* empty_block;      // [B, nqb]

  // First key query i of row b may see (window, document); its last is the query itself.
  // Nondecreasing in i, so a query block's first row has the block's lowest.
  int64_t RowLo(int64_t b, int64_t i) const { return mask.Lo(b, T, i); }
  // Real (non-padding) keys among [c0, c1) of batch row b.
  int64_t Real(int64_t b, int64_t c0, int64_t c1) const {
    return count ? count[b * (T + 1) + c1] - count[b * (T + 1) + c0] : c1 - c0;
  }
  bool RowEmpty(int64_t b, int64_t i) const { return Real(b, RowLo(b, i), i + 1) == 0; }

  int64_t Q0(int64_t qb) const { return qb * bq; }
  int64_t Q1(int64_t qb) const { return std::min(T, (qb + 1) * bq); }
  bool Full(int64_t b, int64_t qb) const { return empty_block[b * nqb + qb] != 0; }
  // Key blocks [lo, hi) that a query block visits: those that hold a key visible to any of its
  // rows, or all of them when `full` (a row with no visible key attends to all T keys).
  int64_t KbLo(int64_t b, int64_t qb, bool full) const {
    return full ? 0 : RowLo(b, Q0(qb)) / kKeyBlock;
  }
  int64_t KbHi(int64_t qb, bool full) const { return full ? nkb : (Q1(qb) - 1) / kKeyBlock + 1; }

  // The columns [c0, c1) of tile (qb, kb): the key block clipped to the union of the query
  // block's visible ranges, or the whole key block when `full`. False: nothing visible there.
  bool TileCols(int64_t b, int64_t qb, int64_t kb, bool full, int64_t* c0, int64_t* c1) const {
    int64_t k0 = kb * kKeyBlock, k1 = std::min(T, k0 + kKeyBlock);
    if (!full) {
      k0 = std::max(k0, RowLo(b, Q0(qb)));
      k1 = std::min(k1, Q1(qb));
      if (k0 >= k1 || Real(b, k0, k1) == 0) return false;
    }
    *c0 = k0;
    *c1 = k1;
    return true;
  }

  // The visible columns of query i inside [c0, c1), as [a, e) relative to c0, clamped to
  // [0, c1 - c0] with a <= e (padding inside is masked separately).
  void Span(int64_t b, int64_t i, int64_t c0, int64_t c1, int64_t* a, int64_t* e) const {
    *a = std::min(std::max(c0, RowLo(b, i)), c1) - c0;
    *e = std::max(std::min(c1, i + 1) - c0, *a);
  }
};

// Prefix counts of real tokens and the per-query-block "has a row with no visible key" flags.
Geometry MakeGeometry(CallScratch& s, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                      const AttnMask& mask) {
  ST_CHECK(Hkv > 0 && H % Hkv == 0) << "H " << H << " is not a multiple of Hkv " << Hkv;
  const int64_t group = H / Hkv, bq = QueryBlock(group);
  const Geometry g{.B = B,
                   .T = T,
                   .H = H,
                   .Hkv = Hkv,
                   .D = D,
                   .group = group,
                   .ldq = H * D,
                   .ldk = Hkv * D,
                   .mask = mask,
                   .bq = bq,
                   .nqb = Blocks(T, bq),
                   .nkb = Blocks(T, kKeyBlock),
                   .rows_max = bq * group,
                   .pad = mask.pad,
                   .count = mask.pad ? s.count.data() : nullptr,
                   .empty_block = s.empty.data()};
  if (mask.pad) {
    for (int64_t b = 0; b < B; ++b) {
      int64_t* c = s.count.data() + b * (T + 1);
      c[0] = 0;
      for (int64_t t = 0; t < T; ++t) c[t + 1] = c[t] + (mask.pad[b * T + t] != 0);
    }
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t qb = 0; qb < g.nqb; ++qb) {
      uint8_t any = 0;
      if (mask.pad)
        for (int64_t i = g.Q0(qb); i < g.Q1(qb); ++i) any |= g.RowEmpty(b, i);
      s.empty[b * g.nqb + qb] = any;
    }
  return g;
}

// Copies rows [q0, q1) of the group's heads [h0, h0 + group) of x[B,T,H,D] into xs[R, D]
// (one contiguous copy per query), or back (unpack).
void PackRows(const Geometry& g, const float* x, float* xs, int64_t b, int64_t kvh, int64_t q0,
              int64_t q1) {
  const size_t bytes = static_cast<size_t>(g.group * g.D) * sizeof(float);
  for (int64_t i = q0; i < q1; ++i)
    std::memcpy(xs + (i - q0) * g.group * g.D, x + (b * g.T + i) * g.ldq + kvh * g.group * g.D,
                bytes);
}
void UnpackRows(const Geometry& g, const float* xs, float* x, int64_t b, int64_t kvh, int64_t q0,
                int64_t q1) {
  const size_t bytes = static_cast<size_t>(g.group * g.D) * sizeof(float);
  for (int64_t i = q0; i < q1; ++i)
    std::memcpy(x + (b * g.T + i) * g.ldq + kvh * g.group * g.D, xs + (i - q0) * g.group * g.D,
                bytes);
}

// ---------------------------------------------------------------------------------------------
// Forward

// One query block of kv head kvh's group: out rows [q0, q1) of its heads and their lse.
void ForwardBlock(const Geometry& g, const float* q, const float* k, const float* v,
                  const float* mean_v, float* out, float* lse, int64_t b, int64_t kvh, int64_t qb) {
  const int64_t T = g.T, D = g.D, group = g.group;
  const int64_t q0 = g.Q0(qb), q1 = g.Q1(qb), R = (q1 - q0) * group;
  const TileScratch t = ThreadScratch(g.rows_max, D);
  float *acc = t.dqs, *m = t.lse, *l = t.di;  // [R, D], [R], [R]
  PackRows(g, q, t.qs, b, kvh, q0, q1);
  std::fill(acc, acc + R * D, 0.0f);
  std::fill(m, m + R, -INFINITY);
  std::fill(l, l + R, 0.0f);
  const uint8_t* pad = g.pad ? g.pad + b * T : nullptr;
  for (int64_t kb = g.KbLo(b, qb, false); kb < g.KbHi(qb, false); ++kb) {
    int64_t c0, c1;
    if (!g.TileCols(b, qb, kb, false, &c0, &c1)) continue;
    const int64_t cols = c1 - c0;
    const uint8_t* pr = pad && g.Real(b, c0, c1) < cols ? pad + c0 : nullptr;  // mask padding
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, cols, D, 1.0f, t.qs, D,
                k + (b * T + c0) * g.ldk + kvh * D, g.ldk, 0.0f, t.s, cols);
    for (int64_t r = 0; r < R; ++r) {
      float* sr = t.s + r * cols;
      int64_t a, e;
      g.Span(b, q0 + r / group, c0, c1, &a, &e);
      float mx = -INFINITY;
      if (pr) {
        for (int64_t j = a; j < e; ++j) mx = std::max(mx, pr[j] ? sr[j] : -INFINITY);
      } else {
#pragma omp simd reduction(max : mx)
        for (int64_t j = a; j < e; ++j) mx = std::max(mx, sr[j]);
      }
      if (mx == -INFINITY) {  // nothing visible to this row here: it adds nothing
        std::fill(sr, sr + cols, 0.0f);
        continue;
      }
      const float m_new = std::max(m[r], mx);
      const float alpha = m[r] == -INFINITY ? 0.0f : FastExp(m[r] - m_new);
      std::fill(sr, sr + a, 0.0f);
      std::fill(sr + e, sr + cols, 0.0f);
      float sum = 0;
      if (pr) {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = a; j < e; ++j) {
          const float p = pr[j] ? FastExp(sr[j] - m_new) : 0.0f;
          sr[j] = p;
          sum += p;
        }
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = a; j < e; ++j) {
          const float p = FastExp(sr[j] - m_new);
          sr[j] = p;
          sum += p;
        }
      }
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
      if (alpha != 1.0f) {
        float* ar = acc + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, D, cols, 1.0f, t.s, cols,
                v + (b * T + c0) * g.ldk + kvh * D, g.ldk, 1.0f, acc, D);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = q0 + r / group, h = kvh * group + r % group;
    float* ar = acc + r * D;
    if (g.RowEmpty(b, i)) {  // uniform over all T keys: the mean of V, lse marker +inf
      std::memcpy(ar, mean_v + (b * g.Hkv + kvh) * D, static_cast<size_t>(D) * sizeof(float));
      lse[(b * g.H + h) * T + i] = INFINITY;
      continue;
    }
    const float inv = 1.0f / l[r];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) ar[d] *= inv;
    lse[(b * g.H + h) * T + i] = m[r] + std::log(l[r]);
  }
  UnpackRows(g, acc, out, b, kvh, q0, q1);
}

}  // namespace

void AttentionForward(const float* q, const float* k, const float* v, float* out, float* lse,
                      int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                      const AttnMask& mask) {
  if (B == 0 || T == 0 || H == 0) return;
  CallScratch& s = Shared(B, T, H, Hkv, D);
  const Geometry g = MakeGeometry(s, B, T, H, Hkv, D, mask);
  // [B, Hkv, D]: the output of a row with no visible key (only where a batch row has one).
  float* mean_v = s.f.data();
  for (int64_t b = 0; b < B; ++b) {
    if (!std::any_of(g.empty_block + b * g.nqb, g.empty_block + (b + 1) * g.nqb,
                     [](uint8_t e) { return e != 0; }))
      continue;
    for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
      float* mv = mean_v + (b * Hkv + kvh) * D;
      std::fill(mv, mv + D, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const float* vr = v + (b * T + t) * g.ldk + kvh * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) mv[d] += vr[d];
      }
      const float inv = 1.0f / static_cast<float>(T);
      for (int64_t d = 0; d < D; ++d) mv[d] *= inv;
    }
  }
  // One (batch, kv head, query block) per task, the most expensive (last) query blocks first;
  // each task writes its own rows of out and lse. Always a parallel region, even for one task:
  // BLAS called inside one runs single-threaded (a multi-threaded sgemm per small tile costs a
  // thread hand-off per call, ruinous on a busy machine).
  const int64_t groups = B * Hkv, tasks = groups * g.nqb;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t qb = g.nqb - 1 - t / groups, bg = t % groups;
    ForwardBlock(g, q, k, v, mean_v, out, lse, bg / Hkv, bg % Hkv, qb);
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// Backward

struct BackwardArgs {
  const float *q, *k, *v, *lse, *di, *dout;
  float *dq, *dk, *dv;
};

// Packs query block qb of kv head kvh's group (q, dout, lse, Di) into the thread's tiles.
TileScratch PackBackward(const Geometry& g, const BackwardArgs& x, int64_t b, int64_t kvh,
                         int64_t qb) {
  const TileScratch t = ThreadScratch(g.rows_max, g.D);
  const int64_t q0 = g.Q0(qb), q1 = g.Q1(qb);
  PackRows(g, x.q, t.qs, b, kvh, q0, q1);
  PackRows(g, x.dout, t.gos, b, kvh, q0, q1);
  for (int64_t i = q0; i < q1; ++i)
    for (int64_t hh = 0; hh < g.group; ++hh) {
      const int64_t r = (i - q0) * g.group + hh, row = (b * g.H + kvh * g.group + hh) * g.T + i;
      t.lse[r] = x.lse[row];
      t.di[r] = x.di[row];
    }
  return t;
}

// One tile (packed query block qb x key columns [c0, c1)): recomputes P, forms dS and adds dS K
// into the packed dq (with_dq) and dS^T Q, P^T dout into dk, dv (with_dkv).
void BackwardTile(const Geometry& g, const BackwardArgs& x, const TileScratch& t, int64_t b,
                  int64_t kvh, int64_t qb, int64_t c0, int64_t c1, bool with_dq, bool with_dkv) {
  const int64_t T = g.T, D = g.D, group = g.group;
  const int64_t q0 = g.Q0(qb), R = (g.Q1(qb) - q0) * group, cols = c1 - c0;
  const float* kblk = x.k + (b * T + c0) * g.ldk + kvh * D;
  const float* vblk = x.v + (b * T + c0) * g.ldk + kvh * D;
  const uint8_t* pr = g.pad && g.Real(b, c0, c1) < cols ? g.pad + b * T + c0 : nullptr;
  const float uniform = 1.0f / static_cast<float>(T);

  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, cols, D, 1.0f, t.qs, D, kblk, g.ldk, 0.0f,
              t.s, cols);
  for (int64_t r = 0; r < R; ++r) {
    float* prow = t.s + r * cols;
    const int64_t i = q0 + r / group;
    if (g.RowEmpty(b, i)) {  // attends uniformly to all T keys
      std::fill(prow, prow + cols, uniform);
      continue;
    }
    int64_t a, e;
    g.Span(b, i, c0, c1, &a, &e);
    const float m = t.lse[r];
    std::fill(prow, prow + a, 0.0f);
    std::fill(prow + e, prow + cols, 0.0f);
    if (pr) {
#pragma omp simd
      for (int64_t j = a; j < e; ++j) prow[j] = pr[j] ? FastExp(prow[j] - m) : 0.0f;
    } else {
#pragma omp simd
      for (int64_t j = a; j < e; ++j) prow[j] = FastExp(prow[j] - m);
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, cols, D, 1.0f, t.gos, D, vblk, g.ldk,
              0.0f, t.ds, cols);
  for (int64_t r = 0; r < R; ++r) {
    const float* prow = t.s + r * cols;
    float* drow = t.ds + r * cols;
    const float d = t.di[r];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) drow[j] = prow[j] * (drow[j] - d);
  }
  if (with_dq)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, D, cols, 1.0f, t.ds, cols, kblk,
                g.ldk, 1.0f, t.dqs, D);
  if (with_dkv) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, R, 1.0f, t.ds, cols, t.qs, D,
                1.0f, x.dk + (b * T + c0) * g.ldk + kvh * D, g.ldk);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, R, 1.0f, t.s, cols, t.gos, D,
                1.0f, x.dv + (b * T + c0) * g.ldk + kvh * D, g.ldk);
  }
}

// dq of one query block of kv head kvh's group, over every key block it visits (in order), and
// with_dkv: their dk/dv too.
void DqBlock(const Geometry& g, const BackwardArgs& x, int64_t b, int64_t kvh, int64_t qb,
             bool with_dkv) {
  const TileScratch t = PackBackward(g, x, b, kvh, qb);
  const int64_t q0 = g.Q0(qb), q1 = g.Q1(qb);
  std::fill(t.dqs, t.dqs + (q1 - q0) * g.group * g.D, 0.0f);
  const bool full = g.Full(b, qb);
  for (int64_t kb = g.KbLo(b, qb, full); kb < g.KbHi(qb, full); ++kb) {
    int64_t c0, c1;
    if (g.TileCols(b, qb, kb, full, &c0, &c1))
      BackwardTile(g, x, t, b, kvh, qb, c0, c1, true, with_dkv);
  }
  UnpackRows(g, t.dqs, x.dq, b, kvh, q0, q1);
}

// dk/dv of one key block of kv head kvh, over every query block that sees it (in order).
void DkvBlock(const Geometry& g, const BackwardArgs& x, int64_t b, int64_t kvh, int64_t kb) {
  for (int64_t qb = 0; qb < g.nqb; ++qb) {
    const bool full = g.Full(b, qb);
    int64_t c0, c1;
    if (!g.TileCols(b, qb, kb, full, &c0, &c1)) continue;
    const TileScratch t = PackBackward(g, x, b, kvh, qb);
    BackwardTile(g, x, t, b, kvh, qb, c0, c1, false, true);
  }
}

}  // namespace

void AttentionBackward(const float* q, const float* k, const float* v, const float* out,
                       const float* lse, const float* dout, float* dq, float* dk, float* dv,
                       int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       const AttnMask& mask) {
  if (B == 0 || T == 0 || H == 0) return;
  CallScratch& s = Shared(B, T, H, Hkv, D);
  const Geometry g = MakeGeometry(s, B, T, H, Hkv, D, mask);
  float* di = s.f.data();  // [B, H, T] rowsum(dout * out)
  const int64_t N = B * T;
#pragma omp parallel for schedule(static) if (N * H * D > (1 << 14))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const float* o = out + n * g.ldq + h * D;
      const float* go = dout + n * g.ldq + h * D;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += o[d] * go[d];
      di[((n / T) * H + h) * T + n % T] = dot;
    }
  const BackwardArgs x{q, k, v, lse, di, dout, dq, dk, dv};
  const int64_t groups = B * Hkv;
  if (groups >= omp_get_max_threads()) {
    // One (batch, kv head) per task: it owns dk/dv of that kv head and dq of its query heads.
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < groups; ++bg)
      for (int64_t qb = 0; qb < g.nqb; ++qb) DqBlock(g, x, bg / Hkv, bg % Hkv, qb, true);
    return;
  }
  // Fewer (batch, kv head) pairs than threads (long sequences, small batches): two passes whose
  // tasks each own their outputs, at 7 tile products instead of 5. dq per (batch, kv head, query
  // block); dk/dv per (batch, kv head, key block), visiting every query block that sees its keys.
  const int64_t dq_tasks = groups * g.nqb, dkv_tasks = groups * g.nkb;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < dq_tasks; ++t) {
      const int64_t qb = g.nqb - 1 - t / groups, bg = t % groups;
      DqBlock(g, x, bg / Hkv, bg % Hkv, qb, false);
    }
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < dkv_tasks; ++t) {
      const int64_t kb = t / groups, bg = t % groups;
      DkvBlock(g, x, bg / Hkv, bg % Hkv, kb);
    }
  }
}

void ReserveAttentionScratch(int64_t max_B, int64_t max_T, int64_t H, int64_t max_Hkv,
                             int64_t max_D) {
  Shared(max_B, max_T, H, max_Hkv, max_D);
#pragma omp parallel
  ThreadScratch(MaxTileRows(H), max_D);
}

double AttentionWorkspaceBytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                               int threads) {
  const CallSizes n = CallScratchSizes(B, T, H, Hkv, D);
  return double(threads) * double(ThreadFloats(MaxTileRows(H), D)) * sizeof(float) +
         double(n.count) * sizeof(int64_t) + double(n.empty) + double(n.f) * sizeof(float);
}

}  // namespace st::cpu
