// Causal attention with FIRE's bias b(h, i, j) = f_h(u[i - j] w[i]) on the CPU, forward and backward, where
// f_h(x) = b2[h] + sum_k W2[h, k] relu(W1[k] x + b1[k]) is a one-hidden-layer ReLU MLP of one scalar.
//
// The kernel takes u monotone over the distances (FIRE's u = log(c d + 1); the caller checks it) and w of any
// sign (FIRE's w = 1 / log(c max(i, L_thr) + 1)): along a row i, x(d) = u[d] w[i] is then monotone in d, so each unit
// switches on or off at most once, at a distance found by bisection on its pre-activation (evaluated as the
// reference does, W1 (u w) + b1 > 0: monotone in rounding too). A row is cut into at most K + 1 segments of
// distances; on a segment the bias is A_h + B_h u[d] (A_h = b2 + sum_on W2 b1, B_h = w_i sum_on W2 W1), one FMA
// per score. Blocks of Bq queries read keys 0 .. r0 + m - 1 in one run: S = Q K^T, the bias added per
// segment, an exact one-pass softmax (the block holds whole rows), O = P V. The backward recomputes
// P = exp(S - lse) and dS = P (dP - rowsum(dO O)); per row, head and segment it sums dA = sum dS and
// dB = sum dS u[d], adds dS B_h to u's gradient, and from those sums follow b2, W2, b1, W1 and w's.
//
// Layout: q, k, v (B, H, L, D) contiguous, float32 or float64; u (L,), w (L,), w1, b1 (K,), w2 (H, K),
// b2 (H,), contiguous, q's dtype. Keys are stored forward; u reversed (ur[L - 1 - d] = u[d]) so that along a
// row u[i - j] is contiguous in j.
#include "cpu_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <mutex>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;
using namespace pedsl_kernels;

// Where each unit switches along each row: per row i, the units on at distance 0 (on0, L x K), and the switches
// sorted by distance (count n, distance sd and unit sk, L x K each). Segment s of row i covers the distances
// sd[s - 1] .. sd[s] - 1 (0 and i + 1 at the ends): the switch n opens segment n + 1.
template <typename T>
struct Switches {
  int64_t L, K;
  std::vector<uint8_t> on0;
  std::vector<int32_t> n, sd, sk;

  Switches(const T* u, const T* w, const T* w1, const T* b1, int64_t L_, int64_t K_)
      : L(L_), K(K_), on0(L_ * K_), n(L_), sd(L_ * K_), sk(L_ * K_) {
    at::parallel_for(0, L, 64, [&](int64_t begin, int64_t end) {
      std::vector<std::pair<int32_t, int32_t>> sw;
      for (int64_t i = begin; i < end; ++i) {
        sw.clear();
        const T wi = w[i];
        for (int64_t k = 0; k < K; ++k) {
          auto on = [&](int64_t d) { return w1[k] * (u[d] * wi) + b1[k] > T(0); };
          const bool first = on(0);
          on0[i * K + k] = first;
          if (on(i) == first) continue;
          int64_t lo = 0, hi = i;  // on(lo) == first, on(hi) != first
          while (hi - lo > 1) {
            const int64_t mid = (lo + hi) / 2;
            (on(mid) == first ? lo : hi) = mid;
          }
          sw.emplace_back(int32_t(hi), int32_t(k));
        }
        std::sort(sw.begin(), sw.end());
        n[i] = int32_t(sw.size());
        for (size_t s = 0; s < sw.size(); ++s) {
          sd[i * K + s] = sw[s].first;
          sk[i * K + s] = sw[s].second;
        }
      }
    });
  }
};

// The MLP's weights and the inputs' pointers of one call.
template <typename T>
struct Mlp {
  const T *ur, *w, *w1, *b1, *w2, *b2;  // ur: u reversed, L entries
  int64_t L, K, H;
  // Row i's intercept A and slope C (B = w_i C) of head h at distance 0.
  void start(const Switches<T>& sw, int64_t i, int64_t h, T& A, T& C) const {
    A = b2[h];
    C = 0;
    const uint8_t* on = sw.on0.data() + i * K;
    for (int64_t k = 0; k < K; ++k)
      if (on[k]) {
        A += w2[h * K + k] * b1[k];
        C += w2[h * K + k] * w1[k];
      }
  }
  // The unit k toggled: on when it was off and back.
  void toggle(const Switches<T>& sw, int64_t i, int64_t h, int64_t k, T& A, T& C) const {
    const T sgn = sw.on0[i * K + k] ? T(-1) : T(1);
    A += sgn * w2[h * K + k] * b1[k];
    C += sgn * w2[h * K + k] * w1[k];
  }
};

template <typename T>
void forward_block(const Mlp<T>& f, const Switches<T>& sw, int64_t h, int64_t Bq, int64_t D, T scale, const T* Q,
                   const T* K, const T* V, T* O, T* lse, int64_t r0, T* S) {
  using Vec = at::vec::Vectorized<T>;
  const int64_t L = f.L, m = std::min(Bq, L - r0), w = r0 + m;
  gemm<T>(false, true, m, w, D, scale, Q + r0 * D, D, K, D, T(0), S, w);
  T inv[256];
  for (int64_t a = 0; a < m; ++a) {
    const int64_t i = r0 + a, ns = sw.n[i];
    T* row = S + a * w;
    const T* ui = f.ur + (L - 1 - i);  // u[i - j] = ui[j]
    const T wi = f.w[i];
    T A, C;
    f.start(sw, i, h, A, C);
    for (int64_t s = 0; s <= ns; ++s) {
      const int64_t d0 = s == 0 ? 0 : sw.sd[i * f.K + s - 1], d1 = s == ns ? i + 1 : sw.sd[i * f.K + s];
      if (d1 > d0) {  // keys i - d1 + 1 .. i - d0
        const T Bh = wi * C;
        const Vec Av(A), Bv(Bh);
        int64_t j = i - d1 + 1;
        const int64_t e = i - d0 + 1;
        for (; j + Vec::size() <= e; j += Vec::size())
          (Vec::loadu(row + j) + at::vec::fmadd(Bv, Vec::loadu(ui + j), Av)).store(row + j);
        for (; j < e; ++j) row[j] += A + Bh * ui[j];
      }
      if (s < ns) f.toggle(sw, i, h, sw.sk[i * f.K + s], A, C);
    }
    const auto [mx, sum] = softmax_row(row, 0, i + 1, w);
    lse[i] = mx + std::log(sum);
    inv[a] = T(1) / sum;
  }
  gemm<T>(false, false, m, D, w, T(1), S, w, V, D, T(0), O + r0 * D, D);
  for (int64_t a = 0; a < m; ++a) {
    T* o = O + (r0 + a) * D;
    for (int64_t d = 0; d < D; ++d) o[d] *= inv[a];
  }
}

// One thread's share of the MLP's and u's, w's gradients, added into the totals at its end.
template <typename T>
struct MlpGrads {
  std::vector<T> du, dw, dw1, db1, dw2, db2;  // du over reversed distances (as ur)
  MlpGrads(int64_t L, int64_t K, int64_t H) : du(L), dw(L), dw1(K), db1(K), dw2(H * K), db2(H) {}
};

// Row i's parameter gradients of head h from the sums dA, dB per segment (ns + 1 of them) and the slopes C.
template <typename T>
void row_grads(const Mlp<T>& f, const Switches<T>& sw, int64_t i, int64_t h, const T* dA, const T* dB, const T* Cs,
               MlpGrads<T>& g, T* pA, T* pB, T* at) {
  const int64_t K = f.K, ns = sw.n[i];
  const T wi = f.w[i];
  pA[0] = pB[0] = 0;  // prefix sums: pA[s] = dA[0] + .. + dA[s - 1]
  T dwi = 0;
  for (int64_t s = 0; s <= ns; ++s) {
    pA[s + 1] = pA[s] + dA[s];
    pB[s + 1] = pB[s] + dB[s];
    dwi += Cs[s] * dB[s];
  }
  g.dw[i] += dwi;
  g.db2[h] += pA[ns + 1];
  // per unit its first segment after its switch (the n-th switch opens segment n + 1; ns + 1: none)
  for (int64_t k = 0; k < K; ++k) at[k] = T(ns + 1);
  for (int64_t s = 0; s < ns; ++s) at[sw.sk[i * K + s]] = T(s + 1);
  const uint8_t* on0 = sw.on0.data() + i * K;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t c = int64_t(at[k]);
    const T SA = on0[k] ? pA[c] : pA[ns + 1] - pA[c], SB = on0[k] ? pB[c] : pB[ns + 1] - pB[c];
    if (SA == T(0) && SB == T(0)) continue;
    const T w2k = f.w2[h * K + k];
    g.dw2[h * K + k] += f.b1[k] * SA + f.w1[k] * wi * SB;
    g.db1[k] += w2k * SA;
    g.dw1[k] += w2k * wi * SB;
  }
}

template <typename T>
void backward_block(const Mlp<T>& f, const Switches<T>& sw, int64_t h, int64_t Bq, int64_t D, T scale, const T* Q,
                    const T* K, const T* V, const T* O, const T* dO, const T* lse, T* dQ, T* dK, T* dV, int64_t r0,
                    T* P, T* dP, MlpGrads<T>& g, T* scratch) {
  using Vec = at::vec::Vectorized<T>;
  const int64_t L = f.L, Kn = f.K, m = std::min(Bq, L - r0), w = r0 + m;
  gemm<T>(false, true, m, w, D, scale, Q + r0 * D, D, K, D, T(0), P, w);
  gemm<T>(false, true, m, w, D, T(1), dO + r0 * D, D, V, D, T(0), dP, w);
  T *dA = scratch, *dB = dA + (Kn + 1), *Cs = dB + (Kn + 1), *rest = Cs + (Kn + 1);
  for (int64_t a = 0; a < m; ++a) {
    const int64_t i = r0 + a, ns = sw.n[i];
    T *p = P + a * w, *dp = dP + a * w;
    const T* ui = f.ur + (L - 1 - i);
    T* dui = g.du.data() + (L - 1 - i);
    const T wi = f.w[i];
    T delta = 0;
    for (int64_t d = 0; d < D; ++d) delta += O[i * D + d] * dO[i * D + d];
    const Vec dl(delta);
    T A, C;
    f.start(sw, i, h, A, C);
    for (int64_t s = 0; s <= ns; ++s) {
      const int64_t d0 = s == 0 ? 0 : sw.sd[i * Kn + s - 1], d1 = s == ns ? i + 1 : sw.sd[i * Kn + s];
      Cs[s] = C;
      T sa = 0, sb = 0;
      if (d1 > d0) {
        const T Bh = wi * C;
        const Vec Av(A), Bv(Bh), lv(lse[i]);
        Vec va(T(0)), vb(T(0));
        int64_t j = i - d1 + 1;
        const int64_t e = i - d0 + 1;
        for (; j + Vec::size() <= e; j += Vec::size()) {
          const Vec uv = Vec::loadu(ui + j);
          const Vec pv = (Vec::loadu(p + j) + at::vec::fmadd(Bv, uv, Av) - lv).exp_u20();
          const Vec ds = pv * (Vec::loadu(dp + j) - dl);
          pv.store(p + j);
          ds.store(dp + j);
          va = va + ds;
          vb = at::vec::fmadd(ds, uv, vb);
          at::vec::fmadd(ds, Bv, Vec::loadu(dui + j)).store(dui + j);
        }
        sa = at::vec::vec_reduce_all<T>([](Vec& x, Vec& y) { return x + y; }, va);
        sb = at::vec::vec_reduce_all<T>([](Vec& x, Vec& y) { return x + y; }, vb);
        for (; j < e; ++j) {
          const T pj = std::exp(p[j] + A + Bh * ui[j] - lse[i]);
          const T ds = pj * (dp[j] - delta);
          p[j] = pj;
          dp[j] = ds;
          sa += ds;
          sb += ds * ui[j];
          dui[j] += ds * Bh;
        }
      }
      dA[s] = sa;
      dB[s] = sb;
      if (s < ns) f.toggle(sw, i, h, sw.sk[i * Kn + s], A, C);
    }
    std::fill(p + i + 1, p + w, T(0));
    std::fill(dp + i + 1, dp + w, T(0));
    row_grads(f, sw, i, h, dA, dB, Cs, g, rest, rest + (Kn + 2), rest + 2 * (Kn + 2));
  }
  gemm<T>(true, false, w, D, m, T(1), P, w, dO + r0 * D, D, T(1), dV, D);
  gemm<T>(false, false, m, D, w, scale, dP, w, K, D, T(0), dQ + r0 * D, D);
  gemm<T>(true, false, w, D, m, scale, dP, w, Q + r0 * D, D, T(1), dK, D);
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& u, const Tensor& w,
                  const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2, int64_t block) {
  TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(), "mlp attention: q, k, v (B, H, L, D)");
  const auto dt = q.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble, "mlp attention: float32 or float64");
  const int64_t H = q.size(1), L = q.size(2), K = w1.numel();
  for (const Tensor* t : {&q, &k, &v, &u, &w, &w1, &b1, &w2, &b2})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == dt, "mlp attention: contiguous inputs of q's dtype");
  TORCH_CHECK(u.numel() == L && w.numel() == L && b1.numel() == K && w2.numel() == H * K && b2.numel() == H,
              "mlp attention: u, w (L,), w1, b1 (K,), w2 (H, K), b2 (H,)");
  TORCH_CHECK(block >= 1 && block <= 256, "mlp attention: 1 <= block <= 256");
}

template <typename T>
Mlp<T> mlp_of(const Tensor& ur, const Tensor& w, const Tensor& w1, const Tensor& b1, const Tensor& w2,
              const Tensor& b2, int64_t L, int64_t H) {
  return {ur.const_data_ptr<T>(), w.const_data_ptr<T>(),  w1.const_data_ptr<T>(), b1.const_data_ptr<T>(),
          w2.const_data_ptr<T>(), b2.const_data_ptr<T>(), L, w1.numel(), H};
}

template <typename T>
std::tuple<Tensor, Tensor> forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& u,
                                        const Tensor& w, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                        const Tensor& b2, double scale, int64_t block) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  Tensor out = at::empty_like(q), lse = at::empty({B, H, L}, q.options()), ur = u.flip(0).contiguous();
  const Mlp<T> f = mlp_of<T>(ur, w, w1, b1, w2, b2, L, H);
  const Switches<T> sw(u.const_data_ptr<T>(), f.w, f.w1, f.b1, L, f.K);
  const int64_t nb = (L + block - 1) / block;
  const T *Q = q.const_data_ptr<T>(), *K = k.const_data_ptr<T>(), *V = v.const_data_ptr<T>();
  T *O = out.mutable_data_ptr<T>(), *LS = lse.mutable_data_ptr<T>();
  at::parallel_for(0, B * H * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> S(block * L);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / nb, o = bh * L * D;
      forward_block<T>(f, sw, bh % H, block, D, T(scale), Q + o, K + o, V + o, O + o, LS + bh * L, (t % nb) * block,
                       S.data());
    }
  });
  return {out, lse};
}

template <typename T>
std::vector<Tensor> backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& u, const Tensor& w,
                                  const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2, double scale,
                                  int64_t block) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3), Kn = w1.numel();
  Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v), ur = u.flip(0).contiguous();
  const Mlp<T> f = mlp_of<T>(ur, w, w1, b1, w2, b2, L, H);
  const Switches<T> sw(u.const_data_ptr<T>(), f.w, f.w1, f.b1, L, Kn);
  const T *Q = q.const_data_ptr<T>(), *K = k.const_data_ptr<T>(), *V = v.const_data_ptr<T>();
  const T *O = out.const_data_ptr<T>(), *dO = dout.const_data_ptr<T>(), *LS = lse.const_data_ptr<T>();
  T *dQ = dq.mutable_data_ptr<T>(), *dK = dk.mutable_data_ptr<T>(), *dV = dv.mutable_data_ptr<T>();
  const int64_t nb = (L + block - 1) / block;
  MlpGrads<T> total(L, Kn, H);
  std::mutex lock;
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {  // one (batch, head) per task: its dK, dV alone
    std::vector<T> P(block * L), dP(block * L), scratch(6 * (Kn + 2) + 8);
    MlpGrads<T> g(L, Kn, H);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t o = bh * L * D;
      for (int64_t b = 0; b < nb; ++b)
        backward_block<T>(f, sw, bh % H, block, D, T(scale), Q + o, K + o, V + o, O + o, dO + o, LS + bh * L, dQ + o,
                          dK + o, dV + o, b * block, P.data(), dP.data(), g, scratch.data());
    }
    std::lock_guard<std::mutex> hold(lock);
    auto add = [](std::vector<T>& to, const std::vector<T>& from) {
      for (size_t x = 0; x < to.size(); ++x) to[x] += from[x];
    };
    add(total.du, g.du), add(total.dw, g.dw), add(total.dw1, g.dw1), add(total.db1, g.db1), add(total.dw2, g.dw2),
        add(total.db2, g.db2);
  });
  auto tensor = [&](const std::vector<T>& x, at::IntArrayRef shape) {
    Tensor t = at::empty(shape, q.options());
    std::copy(x.begin(), x.end(), t.mutable_data_ptr<T>());
    return t;
  };
  return {dq, dk, dv, tensor(total.du, {L}).flip(0), tensor(total.dw, {L}), tensor(total.dw1, {Kn}),
          tensor(total.db1, {Kn}), tensor(total.dw2, {H, Kn}), tensor(total.db2, {H})};
}

std::tuple<Tensor, Tensor> mlp_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& u,
                                       const Tensor& w, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                       const Tensor& b2, double scale, int64_t block) {
  check_inputs(q, k, v, u, w, w1, b1, w2, b2, block);
  if (q.scalar_type() == at::kDouble) return forward_impl<double>(q, k, v, u, w, w1, b1, w2, b2, scale, block);
  return forward_impl<float>(q, k, v, u, w, w1, b1, w2, b2, scale, block);
}

std::vector<Tensor> mlp_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse, const Tensor& u, const Tensor& w,
                                 const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2, double scale,
                                 int64_t block) {
  check_inputs(q, k, v, u, w, w1, b1, w2, b2, block);
  TORCH_CHECK(dout.is_contiguous() && out.is_contiguous() && lse.is_contiguous() && dout.sizes() == q.sizes() &&
                  out.sizes() == q.sizes() && dout.scalar_type() == q.scalar_type() &&
                  lse.scalar_type() == q.scalar_type(),
              "mlp attention backward: dout and out must be q's shape and dtype, contiguous");
  if (q.scalar_type() == at::kDouble)
    return backward_impl<double>(dout, q, k, v, out, lse, u, w, w1, b1, w2, b2, scale, block);
  return backward_impl<float>(dout, q, k, v, out, lse, u, w, w1, b1, w2, b2, scale, block);
}

std::tuple<Tensor, Tensor> mlp_forward_meta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& u,
                                            const Tensor& w, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                            const Tensor& b2, double scale, int64_t block) {
  return {at::empty_like(q), at::empty({q.size(0), q.size(1), q.size(2)}, q.options())};
}

std::vector<Tensor> mlp_backward_meta(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& out, const Tensor& lse, const Tensor& u, const Tensor& w,
                                      const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                                      double scale, int64_t block) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v), at::empty_like(u), at::empty_like(w),
          at::empty_like(w1), at::empty_like(b1), at::empty_like(w2), at::empty_like(b2)};
}

}  // namespace

TORCH_LIBRARY(pedsl_mlp, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, Tensor u, Tensor w, Tensor w1, Tensor b1, Tensor w2, Tensor b2, "
        "float scale, int block) -> (Tensor, Tensor)");
  m.def("backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor u, Tensor w, Tensor w1, "
        "Tensor b1, Tensor w2, Tensor b2, float scale, int block) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(pedsl_mlp, CPU, m) {
  m.impl("forward", &mlp_forward);
  m.impl("backward", &mlp_backward);
}

TORCH_LIBRARY_IMPL(pedsl_mlp, Meta, m) {
  m.impl("forward", &mlp_forward_meta);
  m.impl("backward", &mlp_backward_meta);
}
