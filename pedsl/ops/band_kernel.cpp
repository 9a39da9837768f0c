// Sliding-window causal attention on the CPU, forward and backward, in O(L N) time and memory.
//
// Query i sees keys max(0, i - N + 1) .. i. The queries are cut into blocks of Bq; block r0 .. r0 + m - 1
// reads the contiguous run of keys c0 = max(0, r0 - N + 1) .. r0 + m - 1 (at most Bq + N - 1 of them), so
// each block is two GEMMs forward (S = Q K^T, O = P V) and five backward, over exactly the keys its
// queries can see plus the two triangles at the run's ends (masked per row). The softmax of a block is
// exact in one pass (the block holds its whole rows: no online rescaling); the backward recomputes
// P = exp(S - lse) and uses dS = P (dP - rowsum(dO O)). The GEMMs are BLAS's (the sgemm_/dgemm_ that
// libtorch_cpu exports), the row loops cpu_kernels.h's.
//
// A window N >= L is full causal attention. Two biases may be added to the scores, both optional: a key
// term g (B, Hq, L) float64, bias(i, j) = g_j - g_i (ALiBi's slope * (j - i), a forget gate's G_i - G_j; the
// difference taken in float64 and rounded once), and a distance table t (Hq, L) in the compute dtype, given
// reversed (tr[n] = t[L - 1 - n], so that a row's run of keys reads it forward), bias(i, j) = t[i - j]. The
// backward also returns their float64 gradients: dg (B, Hq, L) and dtr (B, Hq, L), per query head and batch
// row (the caller sums what it broadcast). The (head, block) pairs with a bias cost one more pass over their
// rows forward and two backward (the bias again, the gradients).
//
// After the bias, two modifiers of the scores, both optional: a soft cap c (Gemma 2: s -> c tanh(s / c), a
// vectorised tanh; its derivative 1 - tanh^2 scales dS in the backward) and a sink (GPT-OSS; softmax plus one):
// one more logit per query, sink (B, Hq, L) in the compute dtype, in the softmax's denominator with a zero value,
// whose gradient is -P_sink rowsum(dO O). With either, a constant of a row no longer cancels: the key term's
// g_i gets its own gradient -rowsum(dS).
//
// Layout: q (B, Hq, L, D), k and v (B, Hk, L, D), contiguous, Hq a multiple of Hk (query head h reads
// key/value head h / (Hq / Hk)); float32 or float64; default scale 1 / sqrt(D). The forward runs its
// (head, block) pairs in parallel, the backward its key/value heads, each cut into segments of query
// blocks where there are fewer heads than threads (a key's gradient sums over the blocks that see it).
#include "cpu_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;
using namespace pedsl_kernels;

// One head's band: L queries and keys, window N, blocks of Bq queries, head dim D.
struct Band {
  int64_t L, N, Bq, D;
  int64_t rows(int64_t r0) const { return std::min(Bq, L - r0); }
  int64_t first_key(int64_t r0) const { return std::max<int64_t>(0, r0 - N + 1); }
  int64_t widest() const { return std::min(L, Bq + N - 1); }  // keys of the largest block's run
  // the keys query i sees, as [lo, hi) inside its block's run starting at key c0
  int64_t lo(int64_t i, int64_t c0) const { return std::max<int64_t>(c0, i - N + 1) - c0; }
  int64_t hi(int64_t i, int64_t c0) const { return i - c0 + 1; }
};

// One query head's biases (null: none) and, in the backward, their gradients (null: not wanted).
template <typename T>
struct Bias {
  const double* g = nullptr;  // key term, L values
  const T* tr = nullptr;      // reversed distance table, L values
  double* dg = nullptr;
  double* dtr = nullptr;
  // adds query i's bias to its row of scores over the keys c0 + lo .. c0 + hi - 1
  void add(T* row, int64_t L, int64_t i, int64_t c0, int64_t lo, int64_t hi) const {
    if (g) add_key_term(row + lo, g + c0 + lo, g[i], hi - lo);
    if (tr) add_row(row + lo, tr + (L - 1 - i + c0) + lo, hi - lo);
  }
  // adds query i's dS (over the same keys) to the gradients. g_i's own term, -rowsum(dS), is zero for a plain
  // softmax (it ignores a constant of its row: the sum of P (dP - delta) is delta - delta) and is left out
  // then (``own`` false); a sink or a soft cap makes the row's constant count (``own`` true).
  void grad(const T* ds, int64_t L, int64_t i, int64_t c0, int64_t lo, int64_t hi, bool own) const {
    if (dg) add_into(dg + c0 + lo, ds + lo, hi - lo);
    if (dg && own) dg[i] -= row_sum(ds + lo, hi - lo);
    if (dtr) add_into(dtr + (L - 1 - i + c0) + lo, ds + lo, hi - lo);
  }
};

// One query head's score modifiers after the bias: a soft cap c > 0 (s -> c tanh(s / c); 0: none) and a sink, one
// more logit per query (L values; null: none) in the softmax's denominator whose value is zero; in the backward,
// the sink logits' gradient (L values, null: not wanted).
template <typename T>
struct Mods {
  T cap = 0;
  const T* sink = nullptr;
  double* dsink = nullptr;
  bool any() const { return cap > 0 || sink; }
};

template <typename T>
void forward_block(const Band& g, const Bias<T>& bias, const Mods<T>& mods, const T* Q, const T* K, const T* V, T* O,
                   T* lse, int64_t r0, T* S) {
  const int64_t m = g.rows(r0), c0 = g.first_key(r0), w = r0 + m - c0, D = g.D;
  const T scale = T(1) / std::sqrt(T(D));
  gemm<T>(false, true, m, w, D, scale, Q + r0 * D, D, K + c0 * D, D, T(0), S, w);
  T inv[256];
  for (int64_t a = 0; a < m; ++a) {
    const int64_t i = r0 + a;
    const int64_t lo = g.lo(i, c0), hi = g.hi(i, c0);
    bias.add(S + a * w, g.L, i, c0, lo, hi);
    if (mods.cap > 0) soft_cap(S + a * w + lo, hi - lo, mods.cap, static_cast<T*>(nullptr));
    const auto [mx, sum] = softmax_row(S + a * w, lo, hi, w, mods.sink ? mods.sink + i : nullptr);
    lse[i] = mx + std::log(sum);
    inv[a] = T(1) / sum;
  }
  gemm<T>(false, false, m, D, w, T(1), S, w, V + c0 * D, D, T(0), O + r0 * D, D);
  for (int64_t a = 0; a < m; ++a) {
    T* o = O + (r0 + a) * D;
    for (int64_t d = 0; d < D; ++d) o[d] *= inv[a];
  }
}

// The block's gradients: dQ of its queries written, dK and dV of its keys added to (``slope``: one row's scratch).
template <typename T>
void backward_block(const Band& g, const Bias<T>& bias, const Mods<T>& mods, const T* Q, const T* K, const T* V,
                    const T* O, const T* dO, const T* lse, T* dQ, T* dK, T* dV, int64_t r0, T* P, T* dP, T* slope) {
  const int64_t m = g.rows(r0), c0 = g.first_key(r0), w = r0 + m - c0, D = g.D;
  const T scale = T(1) / std::sqrt(T(D));
  gemm<T>(false, true, m, w, D, scale, Q + r0 * D, D, K + c0 * D, D, T(0), P, w);
  gemm<T>(false, true, m, w, D, T(1), dO + r0 * D, D, V + c0 * D, D, T(0), dP, w);
  for (int64_t a = 0; a < m; ++a) {
    const int64_t i = r0 + a, lo = g.lo(i, c0), hi = g.hi(i, c0);
    T *p = P + a * w, *dp = dP + a * w;
    bias.add(p, g.L, i, c0, lo, hi);
    if (mods.cap > 0) soft_cap(p + lo, hi - lo, mods.cap, slope);
    exp_sum(p + lo, hi - lo, lse[i]);
    std::fill(p, p + lo, T(0));
    std::fill(p + hi, p + w, T(0));
    T delta = 0;  // rowsum(dO O) of query i
    for (int64_t d = 0; d < D; ++d) delta += O[i * D + d] * dO[i * D + d];
    std::fill(dp, dp + lo, T(0));
    std::fill(dp + hi, dp + w, T(0));
    ds_row(p + lo, dp + lo, delta, hi - lo);
    if (mods.dsink) mods.dsink[i] = -std::exp(double(mods.sink[i]) - double(lse[i])) * double(delta);
    if (mods.cap > 0) mul_row(dp + lo, slope, hi - lo);  // dS of the scores before the cap
    bias.grad(dp, g.L, i, c0, lo, hi, mods.any());
  }
  gemm<T>(true, false, w, D, m, T(1), P, w, dO + r0 * D, D, T(1), dV + c0 * D, D);
  gemm<T>(false, false, m, D, w, scale, dP, w, K + c0 * D, D, T(0), dQ + r0 * D, D);
  gemm<T>(true, false, w, D, m, scale, dP, w, Q + r0 * D, D, T(1), dK + c0 * D, D);
}

// What a call adds to the plain band: the biases, the sink logits and the soft cap (0: none).
struct Extras {
  const std::optional<Tensor>& key_term;
  const std::optional<Tensor>& table;
  const std::optional<Tensor>& sink;
  double cap;
};

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window, int64_t block, const Extras& x) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "band attention: q, k, v must be (B, H, L, D)");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "band attention: inputs must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble),
              "band attention: q, k, v must all be float32 or all float64");
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3) &&
                  k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "band attention: k and v must be (B, Hk, L, D) with Hq a multiple of Hk");
  TORCH_CHECK(window >= 1 && block >= 1 && block <= 256, "band attention: window >= 1 and 1 <= block <= 256");
  const std::vector<int64_t> rows{q.size(0), q.size(1), q.size(2)};  // owned: an IntArrayRef of a braced list dangles
  if (x.key_term)
    TORCH_CHECK(x.key_term->is_contiguous() && x.key_term->scalar_type() == at::kDouble &&
                    x.key_term->sizes() == at::IntArrayRef(rows),
                "band attention: the key term must be (B, Hq, L) float64, contiguous");
  if (x.table)
    TORCH_CHECK(x.table->is_contiguous() && x.table->scalar_type() == q.scalar_type() &&
                    x.table->sizes() == at::IntArrayRef({q.size(1), q.size(2)}),
                "band attention: the reversed distance table must be (Hq, L) in q's dtype, contiguous");
  if (x.sink)
    TORCH_CHECK(x.sink->is_contiguous() && x.sink->scalar_type() == q.scalar_type() &&
                    x.sink->sizes() == at::IntArrayRef(rows),
                "band attention: the sink logits must be (B, Hq, L) in q's dtype, contiguous");
  TORCH_CHECK(x.cap >= 0 && std::isfinite(x.cap), "band attention: the soft cap must be finite, >= 0 (0: none)");
}

template <typename T>
Bias<T> head_bias(const Extras& x, int64_t h, int64_t Hq, int64_t L) {
  Bias<T> b;
  if (x.key_term) b.g = x.key_term->const_data_ptr<double>() + h * L;
  if (x.table) b.tr = x.table->const_data_ptr<T>() + (h % Hq) * L;
  return b;
}

template <typename T>
Mods<T> head_mods(const Extras& x, int64_t h, int64_t L) {
  Mods<T> m;
  m.cap = T(x.cap);
  if (x.sink) m.sink = x.sink->const_data_ptr<T>() + h * L;
  return m;
}

template <typename T>
std::tuple<Tensor, Tensor> forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window,
                                        int64_t block, const Extras& x) {
  const int64_t B = q.size(0), Hq = q.size(1), Hk = k.size(1), L = q.size(2), D = q.size(3), group = Hq / Hk;
  Tensor out = at::empty_like(q), lse = at::empty({B, Hq, L}, q.options());
  const Band g{L, window, block, D};
  const int64_t nb = (L + block - 1) / block;
  const T *Q = q.const_data_ptr<T>(), *K = k.const_data_ptr<T>(), *V = v.const_data_ptr<T>();
  T *O = out.mutable_data_ptr<T>(), *LS = lse.mutable_data_ptr<T>();
  at::parallel_for(0, B * Hq * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> S(block * g.widest());
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / nb, kv = (h / Hq) * Hk + (h % Hq) / group;
      forward_block<T>(g, head_bias<T>(x, h, Hq, L), head_mods<T>(x, h, L), Q + h * L * D, K + kv * L * D,
                       V + kv * L * D, O + h * L * D, LS + h * L, (t % nb) * block, S.data());
    }
  });
  return {out, lse};
}

// Which gradients of the extras a backward returns (float64, per query head and batch row; empty: not wanted).
struct ExtraGrads {
  Tensor dg, dtr, dsink;
};

template <typename T>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward_impl(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    int64_t window, int64_t block, const Extras& x, ExtraGrads eg) {
  const int64_t B = q.size(0), Hq = q.size(1), Hk = k.size(1), L = q.size(2), D = q.size(3), group = Hq / Hk;
  Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  const Band g{L, window, block, D};
  const T *Q = q.const_data_ptr<T>(), *K = k.const_data_ptr<T>(), *V = v.const_data_ptr<T>();
  const T *O = out.const_data_ptr<T>(), *dO = dout.const_data_ptr<T>(), *LS = lse.const_data_ptr<T>();
  T *dQ = dq.mutable_data_ptr<T>(), *dK = dk.mutable_data_ptr<T>(), *dV = dv.mutable_data_ptr<T>();
  const auto data = [](Tensor& t) { return t.numel() ? t.mutable_data_ptr<double>() : nullptr; };
  double *dG = data(eg.dg), *dTR = data(eg.dtr), *dSINK = data(eg.dsink);
  // Each key/value head's query blocks in segments, enough of them to fill the threads when B * Hk does
  // not; a segment spans at least N - 1 queries, so segments two apart add to disjoint keys: the even
  // segments run in parallel, then the odd ones. A query head's table gradient sums over all its rows:
  // one segment per head then.
  const int64_t nb = (L + block - 1) / block, heads = B * Hk, threads = at::get_num_threads();
  const int64_t want = heads < threads && !dTR ? (threads + heads - 1) / heads : 1;
  const int64_t seg = std::max((nb + want - 1) / want, (window - 1 + block - 1) / block), nseg = (nb + seg - 1) / seg;
  for (int64_t parity = 0; parity < 2; ++parity) {
    const int64_t count = (nseg - parity + 1) / 2;  // segments of this parity per head
    at::parallel_for(0, heads * count, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> P(block * g.widest()), dP(block * g.widest()), slope(g.widest());
      for (int64_t t = begin; t < end; ++t) {
        const int64_t kv = t / count, s = 2 * (t % count) + parity, kvo = kv * L * D;
        for (int64_t j = 0; j < group; ++j) {
          const int64_t h = (kv / Hk) * Hq + (kv % Hk) * group + j, o = h * L * D;
          Bias<T> bias = head_bias<T>(x, h, Hq, L);
          Mods<T> mods = head_mods<T>(x, h, L);
          if (dG) bias.dg = dG + h * L;
          if (dTR) bias.dtr = dTR + h * L;
          if (dSINK) mods.dsink = dSINK + h * L;
          for (int64_t b = s * seg; b < std::min(nb, (s + 1) * seg); ++b)
            backward_block<T>(g, bias, mods, Q + o, K + kvo, V + kvo, O + o, dO + o, LS + h * L, dQ + o, dK + kvo,
                              dV + kvo, b * block, P.data(), dP.data(), slope.data());
        }
      }
    });
  }
  return {dq, dk, dv, eg.dg, eg.dtr, eg.dsink};
}

std::tuple<Tensor, Tensor> band_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window,
                                        int64_t block, const std::optional<Tensor>& key_term,
                                        const std::optional<Tensor>& table, const std::optional<Tensor>& sink,
                                        double cap) {
  const Extras x{key_term, table, sink, cap};
  check_inputs(q, k, v, window, block, x);
  if (q.scalar_type() == at::kDouble) return forward_impl<double>(q, k, v, window, block, x);
  return forward_impl<float>(q, k, v, window, block, x);
}

// The gradients a backward returns: (B, Hq, L) float64 zeros where wanted and given, empty otherwise.
ExtraGrads extra_grads(const Tensor& q, const Extras& x, bool key_grad, bool table_grad, bool sink_grad, bool meta) {
  const auto f64 = q.options().dtype(at::kDouble);
  const auto grad = [&](bool on) {
    if (!on) return at::empty({0}, f64);
    return meta ? at::empty({q.size(0), q.size(1), q.size(2)}, f64) : at::zeros({q.size(0), q.size(1), q.size(2)}, f64);
  };
  return {grad(key_grad && x.key_term.has_value()), grad(table_grad && x.table.has_value()),
          grad(sink_grad && x.sink.has_value())};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> band_backward(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    int64_t window, int64_t block, const std::optional<Tensor>& key_term, const std::optional<Tensor>& table,
    const std::optional<Tensor>& sink, double cap, bool key_grad, bool table_grad, bool sink_grad) {
  const Extras x{key_term, table, sink, cap};
  check_inputs(q, k, v, window, block, x);
  TORCH_CHECK(dout.is_contiguous() && out.is_contiguous() && lse.is_contiguous() && dout.sizes() == q.sizes() &&
                  out.sizes() == q.sizes() && dout.scalar_type() == q.scalar_type() &&
                  lse.scalar_type() == q.scalar_type(),
              "band attention backward: dout and out must be q's shape and dtype, contiguous");
  const ExtraGrads eg = extra_grads(q, x, key_grad, table_grad, sink_grad, false);
  if (q.scalar_type() == at::kDouble) return backward_impl<double>(dout, q, k, v, out, lse, window, block, x, eg);
  return backward_impl<float>(dout, q, k, v, out, lse, window, block, x, eg);
}

// Shapes only, for torch.compile's tracing (fake tensors run the Meta kernels).
std::tuple<Tensor, Tensor> band_forward_meta(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window,
                                             int64_t block, const std::optional<Tensor>& key_term,
                                             const std::optional<Tensor>& table, const std::optional<Tensor>& sink,
                                             double cap) {
  return {at::empty_like(q), at::empty({q.size(0), q.size(1), q.size(2)}, q.options())};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> band_backward_meta(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    int64_t window, int64_t block, const std::optional<Tensor>& key_term, const std::optional<Tensor>& table,
    const std::optional<Tensor>& sink, double cap, bool key_grad, bool table_grad, bool sink_grad) {
  const ExtraGrads eg = extra_grads(q, Extras{key_term, table, sink, cap}, key_grad, table_grad, sink_grad, true);
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v), eg.dg, eg.dtr, eg.dsink};
}

}  // namespace

TORCH_LIBRARY(pedsl_band, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, int window, int block, Tensor? key_term=None, Tensor? table=None, "
        "Tensor? sink=None, float cap=0.) -> (Tensor, Tensor)");
  m.def("backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, int window, int block, "
        "Tensor? key_term=None, Tensor? table=None, Tensor? sink=None, float cap=0., bool key_grad=False, "
        "bool table_grad=False, bool sink_grad=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pedsl_band, CPU, m) {
  m.impl("forward", &band_forward);
  m.impl("backward", &band_backward);
}

TORCH_LIBRARY_IMPL(pedsl_band, Meta, m) {
  m.impl("forward", &band_forward_meta);
  m.impl("backward", &band_backward_meta);
}
