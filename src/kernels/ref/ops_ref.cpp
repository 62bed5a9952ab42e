#include "kernels/ref/ops_ref.h"

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/gelu.h"

namespace st::ref {

void LinearForward(const float* x, const float* w, float* y, int64_t N, int64_t in, int64_t out,
                   float alpha, bool accumulate) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(x[n * in + i]) * w[o * in + i];
      float v = alpha * static_cast<float>(acc);
      y[n * out + o] = accumulate ? y[n * out + o] + v : v;
    }
  }
}

void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    int64_t N, int64_t in, int64_t out, float alpha, bool accumulate_dx) {
  if (dx) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (int64_t o = 0; o < out; ++o) acc += double(dy[n * out + o]) * w[o * in + i];
        float v = alpha * static_cast<float>(acc);
        dx[n * in + i] = accumulate_dx ? dx[n * in + i] + v : v;
      }
    }
  }
  if (dw) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += double(dy[n * out + o]) * x[n * in + i];
        dw[o * in + i] += alpha * static_cast<float>(acc);
      }
    }
  }
}

namespace {
// A copy of x[n] rounded to bf16 and widened back (empty for a null x).
std::vector<float> RoundedCopy(const float* x, int64_t n) {
  std::vector<float> r;
  if (!x) return r;
  r.resize(n);
  for (int64_t i = 0; i < n; ++i) r[i] = BF16ToFloat(FloatToBF16(x[i]));
  return r;
}
const float* DataOrNull(const std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}
}  // namespace

// The operands rounded to bf16, then the exact (double-accumulated) products above.
void LinearForwardMixed(const float* x, const float* w, float* y, int64_t N, int64_t in,
                        int64_t out, float alpha, bool accumulate) {
  const std::vector<float> xr = RoundedCopy(x, N * in), wr = RoundedCopy(w, out * in);
  LinearForward(xr.data(), wr.data(), y, N, in, out, alpha, accumulate);
}

void LinearBackwardMixed(const float* x, const float* w, const float* dy, float* dx, float* dw,
                         int64_t N, int64_t in, int64_t out, float alpha, bool accumulate_dx) {
  const std::vector<float> xr = RoundedCopy(dw ? x : nullptr, N * in);
  const std::vector<float> wr = RoundedCopy(dx ? w : nullptr, out * in);
  const std::vector<float> dyr = RoundedCopy(dy, N * out);
  LinearBackward(DataOrNull(xr), DataOrNull(wr), dyr.data(), dx, dw, N, in, out, alpha,
                 accumulate_dx);
}

void EmbeddingForward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C,
                      float scale) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = table[int64_t(ids[n]) * C + c] * scale;
}

void EmbeddingBackward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C,
                       float scale, int32_t padding_id) {
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] == padding_id) continue;
    for (int64_t c = 0; c < C; ++c) dtable[int64_t(ids[n]) * C + c] += scale * dout[n * C + c];
  }
}

void RmsNormForward(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                    float eps) {
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[n * C + c]) * x[n * C + c];
    float r = static_cast<float>(1.0 / std::sqrt(ss / C + eps));
    rstd[n] = r;
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = x[n * C + c] * r * (w ? w[c] : 1.0f);
  }
}

void RmsNormBackward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                     float* dw, int64_t N, int64_t C, bool accumulate_dx) {
  for (int64_t n = 0; n < N; ++n) {
    const float r = rstd[n];
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      double g = double(dy[n * C + c]) * (w ? w[c] : 1.0f);
      dot += g * x[n * C + c] * r;
    }
    dot /= C;
    for (int64_t c = 0; c < C; ++c) {
      double g = double(dy[n * C + c]) * (w ? w[c] : 1.0f);
      double xhat = double(x[n * C + c]) * r;
      float v = static_cast<float>(r * (g - xhat * dot));
      dx[n * C + c] = accumulate_dx ? dx[n * C + c] + v : v;
      if (dw) dw[c] += static_cast<float>(dy[n * C + c] * xhat);
    }
  }
}

void Rope(float* x, const float* cos, const float* sin, const int32_t* pos, int64_t B, int64_t T,
          int64_t heads, int64_t D, bool inverse) {
  const int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x + ((b * T + t) * heads + h) * D;
        for (int64_t j = 0; j < half; ++j) {
          const int64_t p_t = pos ? pos[b * T + t] : t;
          float c = cos[p_t * half + j], s = sin[p_t * half + j];
          if (inverse) s = -s;
          float x1 = p[j], x2 = p[j + half];
          p[j] = x1 * c - x2 * s;
          p[j + half] = x2 * c + x1 * s;
        }
      }
}

namespace {
// Whether a row sees any key; a row that sees none attends uniformly to every key.
bool RowHasVisibleKey(const AttnMask& mask, int64_t b, int64_t T, int64_t q) {
  for (int64_t k = 0; k <= q; ++k)
    if (mask.Visible(b, T, q, k)) return true;
  return false;
}

// The probabilities p[T] of query row i of head h (the forward's math, rounded to float as the
// saved [B,H,T,T] probabilities were) and its log-sum-exp over the visible scores (+inf for a row
// that sees no key: p = 1/T on every key).
float RowProbs(const float* q, const float* k, int64_t b, int64_t h, int64_t i, int64_t T,
               int64_t H, int64_t Hkv, int64_t D, const AttnMask& mask, std::vector<double>& s,
               float* p) {
  const int64_t g = h / (H / Hkv);
  const bool any = RowHasVisibleKey(mask, b, T, i);
  double mx = -INFINITY;
  for (int64_t j = 0; j < T; ++j) {
    double acc = 0;
    for (int64_t d = 0; d < D; ++d)
      acc += double(q[((b * T + i) * H + h) * D + d]) * k[((b * T + j) * Hkv + g) * D + d];
    s[j] = acc;
    if (mask.Visible(b, T, i, j)) mx = std::max(mx, acc);
  }
  double sum = 0;
  for (int64_t j = 0; j < T; ++j) {
    double e = !any ? 1.0 : (mask.Visible(b, T, i, j) ? std::exp(s[j] - mx) : 0.0);
    s[j] = e;
    sum += e;
  }
  for (int64_t j = 0; j < T; ++j) p[j] = static_cast<float>(s[j] / sum);
  return any ? static_cast<float>(mx + std::log(sum)) : INFINITY;
}
}  // namespace

void AttentionForward(const float* q, const float* k, const float* v, float* out, float* lse,
                      int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                      const AttnMask& mask) {
  const int64_t group = H / Hkv;
  std::vector<double> s(T);
  std::vector<float> p(T);  // one row of the probabilities
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < T; ++i) {
        lse[(b * H + h) * T + i] = RowProbs(q, k, b, h, i, T, H, Hkv, D, mask, s, p.data());
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < T; ++j) acc += double(p[j]) * v[((b * T + j) * Hkv + g) * D + d];
          out[((b * T + i) * H + h) * D + d] = static_cast<float>(acc);
        }
      }
    }
}

// Recomputes each row's probabilities from q, k and the mask (out and lse are not needed by this
// naive version), then dS = P * (dP - rowsum(P * dP)) over all T keys, as the old probs backward.
void AttentionBackward(const float* q, const float* k, const float* v, const float* /*out*/,
                       const float* /*lse*/, const float* dout, float* dq, float* dk, float* dv,
                       int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       const AttnMask& mask) {
  const int64_t group = H / Hkv;
  std::vector<double> dp(T), s(T);
  std::vector<float> p(T);
  for (int64_t i = 0; i < B * T * H * D; ++i) dq[i] = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < T; ++i) {
        RowProbs(q, k, b, h, i, T, H, Hkv, D, mask, s, p.data());
        const float* go = dout + ((b * T + i) * H + h) * D;
        double rowdot = 0;
        for (int64_t j = 0; j < T; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += double(go[d]) * v[((b * T + j) * Hkv + g) * D + d];
          dp[j] = acc;
          rowdot += acc * p[j];
        }
        for (int64_t j = 0; j < T; ++j) {
          if (p[j] == 0.0f) continue;
          double ds = p[j] * (dp[j] - rowdot);
          for (int64_t d = 0; d < D; ++d) {
            dq[((b * T + i) * H + h) * D + d] +=
                static_cast<float>(ds * k[((b * T + j) * Hkv + g) * D + d]);
            dk[((b * T + j) * Hkv + g) * D + d] +=
                static_cast<float>(ds * q[((b * T + i) * H + h) * D + d]);
            dv[((b * T + j) * Hkv + g) * D + d] += static_cast<float>(double(p[j]) * go[d]);
          }
        }
      }
    }
}

void GeluMulForward(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeluTanh(a[i]) * b[i];
}

void GeluMulBackward(const float* a, const float* b, const float* dout, float* da, float* db,
                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float ai = a[i], bi = b[i], go = dout[i];
    da[i] = go * bi * GeluTanhGrad(ai);
    if (db) db[i] = go * GeluTanh(ai);
  }
}

void SoftcapForward(float* z, int64_t n, float cap) {
  if (cap <= 0) return;
  for (int64_t i = 0; i < n; ++i) z[i] = std::tanh(z[i] / cap) * cap;
}

double CrossEntropyForward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t* valid) {
  double total = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == -100) continue;
    ST_CHECK(targets[n] >= 0 && targets[n] < V) << "target out of range: " << targets[n];
    const float* z = logits + n * V;
    double mx = -INFINITY;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(z[j]));
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
    total += std::log(sum) + mx - z[targets[n]];
    ++count;
  }
  *valid = count;
  return total;
}

void CrossEntropySoftcapBackward(float* logits, const int32_t* targets, int64_t N, int64_t V,
                                 float cap, float scale) {
  for (int64_t n = 0; n < N; ++n) {
    float* z = logits + n * V;
    if (targets[n] == -100) {
      for (int64_t j = 0; j < V; ++j) z[j] = 0;
      continue;
    }
    double mx = -INFINITY;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(z[j]));
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
    for (int64_t j = 0; j < V; ++j) {
      double p = std::exp(z[j] - mx) / sum;
      double g = (p - (j == targets[n] ? 1.0 : 0.0)) * scale;
      if (cap > 0) {
        double t = z[j] / cap;
        g *= 1.0 - t * t;
      }
      z[j] = static_cast<float>(g);
    }
  }
}

void Add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
void Scale(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

}  // namespace st::ref
