// Shared by the C++ CPU attention kernels (band_kernel.cpp, mlp_kernel.cpp): BLAS GEMM through the sgemm_/dgemm_
// that libtorch_cpu exports, and at::vec's row max, exp-sum and softmax of a row.
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

// x[j] = exp(x[j] - shift) over [0, n); returns their sum.
inline float exp_sum(float* x, int64_t n, float shift) {
  using V = at::vec::Vectorized<float>;
  const V s(shift);
  V acc(0.f);
  int64_t j = 0;
  for (; j + V::size() <= n; j += V::size()) {
    const V e = (V::loadu(x + j) - s).exp_u20();
    e.store(x + j);
    acc = acc + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](V& a, V& b) { return a + b; }, acc);
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}
inline double exp_sum(double* x, int64_t n, double shift) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

template <typename T>
inline T row_max(const T* x, int64_t n) {
  using V = at::vec::Vectorized<T>;
  T mx = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  if (n >= V::size()) {
    V acc = V::loadu(x);
    for (j = V::size(); j + V::size() <= n; j += V::size()) acc = at::vec::maximum(acc, V::loadu(x + j));
    mx = at::vec::vec_reduce_all<T>([](V& a, V& b) { return at::vec::maximum(a, b); }, acc);
  }
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

// A row of w scores whose keys lo .. hi - 1 count -> its softmax weights, unnormalised, zero outside lo .. hi;
// returns (max, sum).
template <typename T>
inline std::pair<T, T> softmax_row(T* row, int64_t lo, int64_t hi, int64_t w) {
  const T mx = row_max(row + lo, hi - lo);
  const T sum = exp_sum(row + lo, hi - lo, mx);
  std::fill(row, row + lo, T(0));
  std::fill(row + hi, row + w, T(0));
  return {mx, sum};
}

}  // namespace pedsl_kernels
