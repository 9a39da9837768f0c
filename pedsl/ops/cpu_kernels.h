// Shared by the C++ CPU attention kernels (band_kernel.cpp, mlp_kernel.cpp): BLAS GEMM through the sgemm_/dgemm_
// that libtorch_cpu exports, and the loops over a row of scores (max, exp-sum, softmax, the biases, dS).
#pragma once
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*);
}

namespace pedsl_kernels {

inline void blas(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                 float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
inline void blas(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
                 int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

// Row-major C (M x N, ldc) = alpha op(A) op(B) + beta C, as BLAS's column-major C^T = op(B)^T op(A)^T.
template <typename T>
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
                 int64_t ldb, T beta, T* C, int64_t ldc) {
  blas(tb ? 'T' : 'N', ta ? 'T' : 'N', int(N), int(M), int(K), alpha, B, int(ldb), A, int(lda), beta, C, int(ldc));
}

// The float rows' loops (exp, max, the biases) are compiled twice, for AVX2 and for the baseline, picked
// when the library loads (target_clones): the flags stay portable, and both clones compute the same
// correctly rounded operations in the same order (16 lanes, fixed reduction order, no contraction), so a
// result does not depend on which one ran.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PEDSL_ROW_LOOP __attribute__((target_clones("avx2", "default"))) static
#else
#define PEDSL_ROW_LOOP static
#endif
#define PEDSL_INLINE inline __attribute__((always_inline))  // into either clone, compiled for its target
constexpr int LANES = 16;
// 8 floats as GCC's generic vectors: an AVX2 register in the avx2 clone, two SSE ones in the default clone
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));

PEDSL_INLINE vf8 load8(const float* p) {
  vf8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
PEDSL_INLINE void store8(float* p, vf8 v) { std::memcpy(p, &v, sizeof v); }
PEDSL_INLINE vf8 splat8(float x) { return vf8{x, x, x, x, x, x, x, x}; }
PEDSL_INLINE float lanes_sum(vf8 a, vf8 b) {
  float acc[LANES];
  store8(acc, a);
  store8(acc + 8, b);
  for (int half = LANES / 2; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) acc[l] += acc[l + half];
  return acc[0];
}

// exp(x) of 8 floats, Cephes' expf (about 1 ulp): x clamped to [-87, 88], 2^n by its exponent bits,
// r = x - n ln2 in two parts, a degree-5 polynomial; only +, *, comparisons and bit moves.
PEDSL_INLINE vf8 exp8(vf8 x) {
  const vf8 lo = splat8(-87.0f), hi = splat8(88.0f), magic = splat8(12582912.0f);  // 1.5 * 2^23
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const vf8 t = x * splat8(1.44269504088896341f) + magic;  // t's low bits hold n = round(x log2 e)
  const vf8 n = t - magic;
  const vf8 scale = (vf8)(((vi8)t - 0x4B400000 + 127) << 23);
  const vf8 r = (x - n * splat8(0.693359375f)) - n * splat8(-2.12194440e-4f);
  vf8 p = splat8(1.9875691500e-4f);
  p = p * r + splat8(1.3981999507e-3f);
  p = p * r + splat8(8.3334519073e-3f);
  p = p * r + splat8(4.1665795894e-2f);
  p = p * r + splat8(1.6666665459e-1f);
  p = p * r + splat8(5.0000001201e-1f);
  return ((p * (r * r) + r) + splat8(1.0f)) * scale;
}

// tanh(x) of 8 floats, Cephes' tanhf (about 2 ulp): an odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1)
// (no cancellation there: the quotient stays below 0.45) with the sign of x above; exp8 clamps, so tanh(+-inf) = +-1.
PEDSL_INLINE vf8 tanh8(vf8 x) {
  const vf8 zero = splat8(0.0f), one = splat8(1.0f);
  const vf8 ax = x < zero ? -x : x;
  const vf8 big = one - splat8(2.0f) / (exp8(ax + ax) + one);
  const vf8 z = x * x;
  vf8 p = splat8(-5.70498872745e-3f);
  p = p * z + splat8(2.06390887954e-2f);
  p = p * z + splat8(-5.37397155531e-2f);
  p = p * z + splat8(1.33314422036e-1f);
  p = p * z + splat8(-3.33332819422e-1f);
  const vf8 small = (p * z) * x + x;
  return ax < splat8(0.625f) ? small : (x < zero ? -big : big);
}

// x[j] = exp(x[j] - shift) over [0, n); returns their sum.
PEDSL_ROW_LOOP float exp_sum(float* x, int64_t n, float shift) {
  const vf8 s = splat8(shift);
  vf8 a = splat8(0.0f), b = a;
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
    const vf8 e0 = exp8(load8(x + j) - s), e1 = exp8(load8(x + j + 8) - s);
    store8(x + j, e0);
    store8(x + j + 8, e1);
    a += e0;
    b += e1;
  }
  if (j < n) {  // the tail through a padded copy: the same lanes, the same arithmetic
    float tail[LANES];
    std::fill(tail, tail + LANES, -std::numeric_limits<float>::infinity());
    std::copy(x + j, x + n, tail);
    vf8 e0 = exp8(load8(tail) - s), e1 = exp8(load8(tail + 8) - s);
    const vi8 idx = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t m = int32_t(n - j);
    e0 = idx < m ? e0 : splat8(0.0f);
    e1 = idx + 8 < m ? e1 : splat8(0.0f);
    store8(tail, e0);
    store8(tail + 8, e1);
    std::copy(tail, tail + (n - j), x + j);
    a += e0;
    b += e1;
  }
  return lanes_sum(a, b);
}
inline double exp_sum(double* x, int64_t n, double shift) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

PEDSL_ROW_LOOP float row_max(const float* x, int64_t n) {
  vf8 a = splat8(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const vf8 v = load8(x + j);
    a = v > a ? v : a;
  }
  float acc[8];
  store8(acc, a);
  float mx = acc[0];
  for (int l = 1; l < 8; ++l) mx = std::max(mx, acc[l]);
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}
inline double row_max(const double* x, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

// row[j] += (g[j] - gi) over [0, n): a bias g_j - g_i of float64 coordinates, their difference rounded once.
PEDSL_ROW_LOOP void add_key_term(float* row, const double* g, double gi, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] += float(g[j] - gi);
}
inline void add_key_term(double* row, const double* g, double gi, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] += g[j] - gi;
}

// row[j] += t[j] over [0, n).
PEDSL_ROW_LOOP void add_row(float* row, const float* t, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] += t[j];
}
inline void add_row(double* row, const double* t, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] += t[j];
}

// x[j] = c tanh(x[j] / c) over [0, n) (Gemma 2's soft cap); slope[j] = 1 - tanh^2, its derivative, unless null.
PEDSL_ROW_LOOP void soft_cap(float* x, int64_t n, float c, float* slope) {
  const vf8 cv = splat8(c);
  float buf[8];
  for (int64_t j = 0; j < n; j += 8) {  // the tail through a padded copy: the same lanes, the same arithmetic
    const int64_t m = std::min<int64_t>(8, n - j);
    std::fill(buf, buf + 8, 0.0f);
    std::copy(x + j, x + j + m, buf);
    const vf8 t = tanh8(load8(buf) / cv);
    store8(buf, t * cv);
    std::copy(buf, buf + m, x + j);
    if (slope) {
      store8(buf, splat8(1.0f) - t * t);
      std::copy(buf, buf + m, slope + j);
    }
  }
}
inline void soft_cap(double* x, int64_t n, double c, double* slope) {
  for (int64_t j = 0; j < n; ++j) {
    const double t = std::tanh(x[j] / c);
    x[j] = c * t;
    if (slope) slope[j] = 1 - t * t;
  }
}

// x[j] *= y[j] over [0, n).
PEDSL_ROW_LOOP void mul_row(float* x, const float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] *= y[j];
}
inline void mul_row(double* x, const double* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] *= y[j];
}

// the sum of x[j] over [0, n), in float64.
PEDSL_ROW_LOOP double row_sum(const float* x, int64_t n) {
  double acc = 0;
  for (int64_t j = 0; j < n; ++j) acc += double(x[j]);
  return acc;
}
inline double row_sum(const double* x, int64_t n) {
  double acc = 0;
  for (int64_t j = 0; j < n; ++j) acc += x[j];
  return acc;
}

// dp[j] = p[j] (dp[j] - delta) over [0, n): dS of the flash identity.
PEDSL_ROW_LOOP void ds_row(const float* p, float* dp, float delta, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}
inline void ds_row(const double* p, double* dp, double delta, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

// acc[j] += x[j] over [0, n), in float64.
PEDSL_ROW_LOOP void add_into(double* acc, const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += double(x[j]);
}
inline void add_into(double* acc, const double* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += x[j];
}

// A row of w scores whose keys lo .. hi - 1 count -> its softmax weights, unnormalised, zero outside lo .. hi;
// returns (max, sum). ``sink``: one more logit in the denominator (a key of value zero), unless null.
template <typename T>
inline std::pair<T, T> softmax_row(T* row, int64_t lo, int64_t hi, int64_t w, const T* sink = nullptr) {
  const T mx = sink ? std::max(row_max(row + lo, hi - lo), *sink) : row_max(row + lo, hi - lo);
  const T sum = exp_sum(row + lo, hi - lo, mx) + (sink ? std::exp(*sink - mx) : T(0));
  std::fill(row, row + lo, T(0));
  std::fill(row + hi, row + w, T(0));
  return {mx, sum};
}

}  // namespace pedsl_kernels
