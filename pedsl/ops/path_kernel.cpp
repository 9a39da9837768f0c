// PaTH attention's blockwise scan and UT inverse on the CPU (pedsl/ops/path_scan.py and path_blocks.py call them
// through pedsl/ops/path_kernel.py; PathTorchRows in path_blocks.py has the same steps in torch):
//
//   scan_forward / scan_backward   the loops of path_scan's _PathScan over the pairs of blocks (the diagonal block,
//                                  the earlier blocks of a superblock, the earlier superblocks), one head per task
//   unit_lower_inverse(T)          (I + strictLower(T))^-1 per matrix by forward substitution (C^3 / 6
//                                  multiply-adds against LAPACK's triangular solve of C^3 / 2 with the identity)
//
// Base 2 throughout, as the scan (its scores are scaled by log2 e). Float32 or float64. float32's 2^x is exact
// range reduction (x - round(x) is exact) and a degree-7 polynomial (truncation below 1e-8 relative), the same
// lanes and order in either target_clones clone; float64 uses std::exp2.
#include "cpu_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using at::Tensor;
using namespace pedsl_kernels;

// 2^x of 8 floats: n = round(x) (x clamped to [-127, 127]: 2^-127 and below give 0, as flushed denormals),
// r = x - n exactly, 2^r by its Taylor polynomial of degree 7 on |r| <= 1/2, times 2^n by its exponent bits.
PEDSL_INLINE vf8 exp2_8(vf8 x) {
  const vf8 lo = splat8(-127.0f), hi = splat8(127.0f), magic = splat8(12582912.0f);  // 1.5 * 2^23
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const vf8 t = x + magic;  // t's low bits hold n = round(x)
  const vf8 n = t - magic;
  const vf8 r = x - n;
  const vf8 scale = (vf8)(((vi8)t - 0x4B400000 + 127) << 23);
  vf8 p = splat8(1.525273380405984e-05f);
  p = p * r + splat8(1.5403530393381606e-04f);
  p = p * r + splat8(1.3333558146428443e-03f);
  p = p * r + splat8(9.618129107628477e-03f);
  p = p * r + splat8(5.550410866482158e-02f);
  p = p * r + splat8(2.402265069591007e-01f);
  p = p * r + splat8(6.931471805599453e-01f);
  return (p * r + splat8(1.0f)) * scale;
}

// x[j] = 2^(x[j] - shift) over [0, n); returns their sum (lanes summed in a fixed order).
PEDSL_ROW_LOOP float exp2_sum(float* x, int64_t n, float shift) {
  const vf8 s = splat8(shift);
  vf8 a = splat8(0.0f), b = a;
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
    const vf8 e0 = exp2_8(load8(x + j) - s), e1 = exp2_8(load8(x + j + 8) - s);
    store8(x + j, e0);
    store8(x + j + 8, e1);
    a += e0;
    b += e1;
  }
  if (j < n) {  // the tail through a padded copy: the same lanes, the same arithmetic
    float tail[LANES];
    std::fill(tail, tail + LANES, -std::numeric_limits<float>::infinity());
    std::copy(x + j, x + n, tail);
    const vf8 e0 = exp2_8(load8(tail) - s), e1 = exp2_8(load8(tail + 8) - s);  // -inf - s gives 0
    store8(tail, e0);
    store8(tail + 8, e1);
    std::copy(tail, tail + (n - j), x + j);
    a += e0;
    b += e1;
  }
  return lanes_sum(a, b);
}
inline double exp2_sum(double* x, int64_t n, double shift) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp2(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

// x[j] *= c over [0, n).
PEDSL_ROW_LOOP void scale_row(float* x, float c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] *= c;
}
inline void scale_row(double* x, double c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] *= c;
}

// Row r of X (C x C, rows above r done): X[r, :] = e_r - sum_{j<r} t_j X[j, :], zero right of the diagonal.
PEDSL_ROW_LOOP void substitute_row(float* X, const float* t, int64_t r, int64_t C) {
  float* xr = X + r * C;
  std::fill(xr, xr + C, 0.0f);
  xr[r] = 1.0f;
  for (int64_t j = 0; j < r; ++j) {
    const float c = t[j];
    const float* xj = X + j * C;
    for (int64_t i = 0; i <= j; ++i) xr[i] -= c * xj[i];
  }
}
inline void substitute_row(double* X, const double* t, int64_t r, int64_t C) {
  double* xr = X + r * C;
  std::fill(xr, xr + C, 0.0);
  xr[r] = 1.0;
  for (int64_t j = 0; j < r; ++j) {
    const double c = t[j];
    const double* xj = X + j * C;
    for (int64_t i = 0; i <= j; ++i) xr[i] -= c * xj[i];
  }
}

void check(bool ok, const char* what) { TORCH_CHECK(ok, "PaTH kernel: ", what); }

template <typename T>
Tensor inverse_impl(const Tensor& t) {
  const int64_t C = t.size(-1), M = t.numel() / (C * C);
  Tensor x = at::empty_like(t);
  const T* TT = t.const_data_ptr<T>();
  T* X = x.mutable_data_ptr<T>();
  at::parallel_for(0, M, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r = 0; r < C; ++r) substitute_row(X + b * C * C, TT + b * C * C + r * C, r, C);
  });
  return x;
}

Tensor unit_lower_inverse(const Tensor& t) {
  check(t.dim() >= 2 && t.size(-1) == t.size(-2) && t.is_contiguous() &&
            (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble),
        "unit_lower_inverse: t (..., C, C) contiguous, float32 or float64");
  if (t.numel() == 0) return at::empty_like(t);
  if (t.scalar_type() == at::kDouble) return inverse_impl<double>(t);
  return inverse_impl<float>(t);
}


// ----------------------------------------------------------------------------------------- the scan, per head
// The loops of pedsl/ops/path_scan.py's _PathScan (its docstring has the algorithm) with one head per task:
// every product is a (C x D) x (D x m) GEMM of one head, so a pair's operands and scores stay in cache from
// the product through the row loop to the next product. Block-major tensors (N, Z, rows, cols): block j of
// head z starts at (j Z + z) rows cols. The caller makes the diagonal blocks, the superblocks' keys and
// products, and everything after the loops.
template <typename T>
struct Blocks {
  T* p = nullptr;
  int64_t Z = 0, size = 0;
  Blocks() = default;
  explicit Blocks(const Tensor& t) {
    if (t.numel() == 0) return;
    p = const_cast<T*>(t.const_data_ptr<T>());
    Z = t.size(1);
    size = t.numel() / (t.size(0) * t.size(1));
  }
  T* at(int64_t j, int64_t z) const { return p + (j * Z + z) * size; }
};

// The forget gate's G_i - G_j of a (Cq x Ck) block of scores: local sums (N, Z, rows) in the scores' dtype and
// float64 block offsets (N, Z); s = (s + (glq_r + off)) - glk_c, off = gbq - gbk rounded once, as _add_bias.
template <typename T>
struct GateBias {
  Blocks<T> gl;
  const double* gb = nullptr;
  explicit GateBias(const Tensor& l, const Tensor& b) : gl(l) {
    if (b.numel()) gb = b.const_data_ptr<double>();
  }
  bool on() const { return gb != nullptr; }
  double offset(int64_t j, int64_t z) const { return gb[j * gl.Z + z]; }
};

template <typename T>
void add_gate(T* s, int64_t Cq, int64_t Ck, const GateBias<T>& q, int64_t n, const GateBias<T>& k, int64_t j,
              int64_t z) {
  const T off = T(q.offset(n, z) - k.offset(j, z));
  const T *gq = q.gl.at(n, z), *gk = k.gl.at(j, z);
  for (int64_t r = 0; r < Cq; ++r) {
    const T rt = gq[r] + off;
    T* row = s + r * Ck;
    for (int64_t c = 0; c < Ck; ++c) row[c] = (row[c] + rt) - gk[c];
  }
}

template <typename T>
void online_block(T* s, int64_t C, int64_t w, T* mx, T* ln, T* a, int64_t D) {
  for (int64_t r = 0; r < C; ++r) {
    T* row = s + r * w;
    const T mn = std::max(mx[r], row_max(row, w));
    const T alpha = std::exp2(mx[r] - mn);
    const T sum = exp2_sum(row, w, mn);
    ln[r] = ln[r] * alpha + sum;
    mx[r] = mn;
    scale_row(a + r * D, alpha, D);
  }
}

// t: Qt, KtT, V, P, KsT, VS, PS, m, l, acc, gl, gb, glS, gbS, Sd (empty where absent); m, l, acc written: the
// diagonal block's exact softmax state, then every earlier block's.
template <typename T>
void scan_forward_impl(const std::vector<Tensor>& t, int64_t k) {
  const Tensor& Qt = t[0];
  const int64_t N = Qt.size(0), Z = Qt.size(1), C = Qt.size(2), D = Qt.size(3), S = k * C;
  const Blocks<T> Q(t[0]), KT(t[1]), V(t[2]), P(t[3]), KsT(t[4]), VS(t[5]), PS(t[6]), m(t[7]), l(t[8]), acc(t[9]);
  const GateBias<T> g(t[10], t[11]), gS(t[12], t[13]);
  const Blocks<T> Sd(t[14]);
  at::parallel_for(0, Z, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> Rb(2 * C * D), sc(C * std::max(C, S));
    T* s = sc.data();
    for (int64_t z = begin; z < end; ++z)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t Mn = n / k;
        const T* R = Q.at(n, z);
        int u = 0;
        T *mx = m.at(n, z), *ln = l.at(n, z), *a = acc.at(n, z);
        std::copy(Sd.at(n, z), Sd.at(n, z) + C * C, s);  // the diagonal block, masked above the diagonal
        for (int64_t r = 0; r < C; ++r) {
          mx[r] = row_max(s + r * C, C);
          ln[r] = exp2_sum(s + r * C, C, mx[r]);
        }
        gemm<T>(false, false, C, D, C, T(1), s, C, V.at(n, z), D, T(0), a, D);
        for (int64_t j = n - 1; j >= Mn * k; --j) {  // earlier blocks of its own superblock
          gemm<T>(false, false, C, C, D, T(1), R, D, KT.at(j, z), C, T(0), s, C);
          if (g.on()) add_gate(s, C, C, g, n, g, j, z);
          online_block(s, C, C, mx, ln, a, D);
          gemm<T>(false, false, C, D, C, T(1), s, C, V.at(j, z), D, T(1), a, D);
          if (j > 0) {
            T* out = Rb.data() + u * C * D;
            gemm<T>(false, false, C, D, D, T(1), R, D, P.at(j, z), D, T(0), out, D);
            R = out, u = 1 - u;
          }
        }
        for (int64_t M = Mn - 1; M >= 0; --M) {  // earlier superblocks
          gemm<T>(false, false, C, S, D, T(1), R, D, KsT.at(M, z), S, T(0), s, S);
          if (g.on()) add_gate(s, C, S, g, n, gS, M, z);
          online_block(s, C, S, mx, ln, a, D);
          gemm<T>(false, false, C, D, S, T(1), s, S, VS.at(M, z), D, T(1), a, D);
          if (M > 0) {
            T* out = Rb.data() + u * C * D;
            gemm<T>(false, false, C, D, D, T(1), R, D, PS.at(M, z), D, T(0), out, D);
            R = out, u = 1 - u;
          }
        }
      }
  });
}

void check_scan(const std::vector<Tensor>& t, size_t count) {
  check(t.size() == count, "scan: wrong number of tensors");
  const auto dt = t[0].scalar_type();
  check(dt == at::kFloat || dt == at::kDouble, "scan: float32 or float64");
  for (const Tensor& x : t)
    check(x.numel() == 0 || (x.is_contiguous() && (x.scalar_type() == dt || x.scalar_type() == at::kDouble)),
          "scan: contiguous tensors of the scores' dtype (float64 block offsets)");
}

void scan_forward(std::vector<Tensor> t, int64_t k) {
  check_scan(t, 15);
  if (t[0].scalar_type() == at::kDouble) return scan_forward_impl<double>(t, k);
  scan_forward_impl<float>(t, k);
}

// Sums of a (C x w) block's rows and columns into the gate's gradients: dgl_q += rows, dgl_k -= columns, and
// their total (in T, then float64) into the block offsets' gradients.
template <typename T>
void gate_grads(const T* ds, int64_t C, int64_t w, const GateBias<T>& dq, int64_t n, const GateBias<T>& dk, int64_t j,
                int64_t z) {
  T *gq = dq.gl.at(n, z), *gk = dk.gl.at(j, z), tot = 0;
  for (int64_t r = 0; r < C; ++r) {
    T rs = 0;
    const T* row = ds + r * w;
    for (int64_t c = 0; c < w; ++c) rs += row[c], gk[c] -= row[c];
    gq[r] += rs;
    tot += rs;
  }
  const_cast<double*>(dq.gb)[n * dq.gl.Z + z] += double(tot);
  const_cast<double*>(dk.gb)[j * dk.gl.Z + z] -= double(tot);
}

// t: Qt, Kt, KtT, V, P, Ks, KsT, VS, PS, dO, Dl, lse, gl, gb, glS, gbS (inputs, the gate's scaled by log2 e),
// then dQt, dK, dV, dP, dKs, dVS, dPS, dgl, dgb, dglS, dgbS (zeros, accumulated in place; dV is started by the
// diagonal block), then Sd and dSd (written); empty where absent.
template <typename T>
void scan_backward_impl(const std::vector<Tensor>& t, int64_t k) {
  const int64_t N = t[0].size(0), Z = t[0].size(1), C = t[0].size(2), D = t[0].size(3), S = k * C;
  const int64_t NK = t[5].numel() ? t[5].size(0) : 0;
  const Blocks<T> Q(t[0]), K(t[1]), KT(t[2]), V(t[3]), P(t[4]), Ks(t[5]), KsT(t[6]), VS(t[7]), PS(t[8]), dO(t[9]),
      Dl(t[10]), lse(t[11]);
  const GateBias<T> g(t[12], t[13]), gS(t[14], t[15]);
  const Blocks<T> dQ(t[16]), dK(t[17]), dV(t[18]), dP(t[19]), dKs(t[20]), dVS(t[21]), dPS(t[22]);
  const GateBias<T> dg(t[23], t[24]), dgS(t[25], t[26]);
  const Blocks<T> Sd(t[27]), dSd(t[28]);
  at::parallel_for(0, Z, 1, [&](int64_t begin, int64_t end) {
    const int64_t W = std::max(C, S);
    std::vector<T> chain((k + NK + 1) * C * D), gbuf(2 * C * D), sp(C * W), sd(C * W);
    for (int64_t z = begin; z < end; ++z)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t Mn = n / k, f = Mn * k;
        const T *dOn = dO.at(n, z), *Dn = Dl.at(n, z), *Ln = lse.at(n, z);
        {  // the diagonal block: dV starts here (no later block adds to dV_n before), dSd
          T *p = sp.data(), *ds = dSd.at(n, z);
          std::copy(Sd.at(n, z), Sd.at(n, z) + C * C, p);
          for (int64_t r = 0; r < C; ++r) exp2_sum(p + r * C, C, Ln[r]);  // 2^-inf = 0 above the diagonal
          gemm<T>(true, false, C, D, C, T(1), p, C, dOn, D, T(0), dV.at(n, z), D);
          gemm<T>(false, true, C, C, D, T(1), dOn, D, V.at(n, z), D, T(0), ds, C);
          for (int64_t r = 0; r < C; ++r) ds_row(p + r * C, ds + r * C, Dn[r], C);
        }
        if (n == 0) continue;
        // one pair: probabilities again, dV, dK and the gate's gradients accumulated; dR into out
        auto pair = [&](const T* R, int64_t w, const Blocks<T>& KTk, const Blocks<T>& Kk, const Blocks<T>& Vk,
                        const GateBias<T>& gk, const Blocks<T>& dKk, const Blocks<T>& dVk, const GateBias<T>& dgk,
                        int64_t j, T* out) {
          T *p = sp.data(), *ds = sd.data();
          gemm<T>(false, false, C, w, D, T(1), R, D, KTk.at(j, z), w, T(0), p, w);
          if (g.on()) add_gate(p, C, w, g, n, gk, j, z);
          for (int64_t r = 0; r < C; ++r) exp2_sum(p + r * w, w, Ln[r]);
          gemm<T>(true, false, w, D, C, T(1), p, w, dOn, D, T(1), dVk.at(j, z), D);
          gemm<T>(false, true, C, w, D, T(1), dOn, D, Vk.at(j, z), D, T(0), ds, w);
          for (int64_t r = 0; r < C; ++r) ds_row(p + r * w, ds + r * w, Dn[r], w);
          if (g.on()) gate_grads(ds, C, w, dg, n, dgk, j, z);
          gemm<T>(true, false, w, D, C, T(1), ds, w, R, D, T(1), dKk.at(j, z), D);
          gemm<T>(false, false, C, D, w, T(1), ds, w, Kk.at(j, z), D, T(0), out, D);
        };
        // the query block moved to each key block of its superblock, then to each earlier superblock's end
        std::vector<const T*> Rs{Q.at(n, z)}, Rx;
        T* next = chain.data();
        auto move = [&](const T* R, const T* Pm) {
          gemm<T>(false, false, C, D, D, T(1), R, D, Pm, D, T(0), next, D);
          const T* out = next;
          next += C * D;
          return out;
        };
        for (int64_t j = n - 1; j > f; --j) Rs.push_back(move(Rs.back(), P.at(j, z)));
        if (Mn) {
          Rx.push_back(n > f ? move(Rs.back(), P.at(f, z)) : Q.at(n, z));
          for (int64_t M = Mn - 1; M > 0; --M) Rx.push_back(move(Rx.back(), PS.at(M, z)));
        }
        const T* carry = nullptr;
        int u = 0;
        for (int64_t M = 0; M < Mn; ++M) {
          const T* R = Rx[Mn - 1 - M];
          T* gr = gbuf.data() + u * C * D;
          pair(R, S, KsT, Ks, VS, gS, dKs, dVS, dgS, M, gr);
          if (carry) {  // R at superblock M - 1 = R PS_M
            gemm<T>(false, true, C, D, D, T(1), carry, D, PS.at(M, z), D, T(1), gr, D);
            gemm<T>(true, false, D, D, C, T(1), R, D, carry, D, T(1), dPS.at(M, z), D);
          }
          carry = gr, u = 1 - u;
        }
        for (int64_t j = f; j < n; ++j) {
          const T* R = Rs[n - 1 - j];
          T* gr = gbuf.data() + u * C * D;
          pair(R, C, KT, K, V, g, dK, dV, dg, j, gr);
          if (carry) {  // R at key block j - 1 = R P_j
            gemm<T>(false, true, C, D, D, T(1), carry, D, P.at(j, z), D, T(1), gr, D);
            gemm<T>(true, false, D, D, C, T(1), R, D, carry, D, T(1), dP.at(j, z), D);
          }
          carry = gr, u = 1 - u;
        }
        if (carry) std::copy(carry, carry + C * D, dQ.at(n, z));
      }
  });
}

void scan_backward(std::vector<Tensor> t, int64_t k) {
  check_scan(t, 29);
  if (t[0].scalar_type() == at::kDouble) return scan_backward_impl<double>(t, k);
  scan_backward_impl<float>(t, k);
}

// Shapes only, for torch.compile's tracing (fake tensors run the Meta kernels).
Tensor unit_lower_inverse_meta(const Tensor& t) { return at::empty_like(t); }
void scan_meta(std::vector<Tensor>, int64_t) {}

}  // namespace

TORCH_LIBRARY(pedsl_path, m) {
  m.def("unit_lower_inverse(Tensor t) -> Tensor");
  m.def("scan_forward(Tensor(a!)[] t, int k) -> ()");
  m.def("scan_backward(Tensor(a!)[] t, int k) -> ()");
}

TORCH_LIBRARY_IMPL(pedsl_path, CPU, m) {
  m.impl("unit_lower_inverse", &unit_lower_inverse);
  m.impl("scan_forward", &scan_forward);
  m.impl("scan_backward", &scan_backward);
}

TORCH_LIBRARY_IMPL(pedsl_path, Meta, m) {
  m.impl("unit_lower_inverse", &unit_lower_inverse_meta);
  m.impl("scan_forward", &scan_meta);
  m.impl("scan_backward", &scan_meta);
}
