#include "seq/grid_bf16.hpp"

#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "seq/matmul.hpp"

namespace sat {

void round_rows_bf16(const Mat& m, Bf16Rows& out) {
  out.rows = m.rows(), out.cols = m.cols();
  out.values.resize((size_t)(out.rows * out.cols));
  if (out.rows && out.cols) to_bf16(operand(m), out.values.data());
}

#if defined(__AVX512F__)
// 16 bf16 values widened to float32 (a bf16 is the top half of a float32)
static inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static inline __m512 load16_masked(const uint16_t* p, __mmask16 k) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
#endif

void weighted_sum_of_rows_bf16(const float* w, const uint16_t* block, int L, int D, float* out) {
  int d = 0;
#if defined(__AVX512F__)
  // 64 columns at a time, their sums in four registers, down all L rows
  for (; d + 64 <= D; d += 64) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int l = 0; l < L; ++l) {
      const __m512 a = _mm512_set1_ps(w[l]);
      const uint16_t* r = block + (int64_t)l * D + d;
      s0 = _mm512_fmadd_ps(a, load16(r), s0);
      s1 = _mm512_fmadd_ps(a, load16(r + 16), s1);
      s2 = _mm512_fmadd_ps(a, load16(r + 32), s2);
      s3 = _mm512_fmadd_ps(a, load16(r + 48), s3);
    }
    _mm512_storeu_ps(out + d, s0), _mm512_storeu_ps(out + d + 16, s1);
    _mm512_storeu_ps(out + d + 32, s2), _mm512_storeu_ps(out + d + 48, s3);
  }
  for (; d < D; d += 16) {
    const __mmask16 k = D - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (D - d)) - 1);
    __m512 s = _mm512_setzero_ps();
    for (int l = 0; l < L; ++l) s = _mm512_fmadd_ps(_mm512_set1_ps(w[l]), load16_masked(block + (int64_t)l * D + d, k), s);
    _mm512_mask_storeu_ps(out + d, k, s);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (; d + 32 <= D; d += 32) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int l = 0; l < L; ++l) {
      const __m256 a = _mm256_set1_ps(w[l]);
      const uint16_t* r = block + (int64_t)l * D + d;
      s0 = _mm256_fmadd_ps(a, load8(r), s0);
      s1 = _mm256_fmadd_ps(a, load8(r + 8), s1);
      s2 = _mm256_fmadd_ps(a, load8(r + 16), s2);
      s3 = _mm256_fmadd_ps(a, load8(r + 24), s3);
    }
    _mm256_storeu_ps(out + d, s0), _mm256_storeu_ps(out + d + 8, s1);
    _mm256_storeu_ps(out + d + 16, s2), _mm256_storeu_ps(out + d + 24, s3);
  }
#endif
  for (; d < D; ++d) {
    float s = 0;
    for (int l = 0; l < L; ++l) s += w[l] * bf16_to_float(block[(int64_t)l * D + d]);
    out[d] = s;
  }
}

void rows_dot_bf16(const uint16_t* block, int L, int D, const float* x, float* out) {
  for (int l = 0; l < L; ++l) {
    const uint16_t* r = block + (int64_t)l * D;
    int d = 0;
    float s = 0;
#if defined(__AVX512F__)
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (; d + 32 <= D; d += 32) {
      s0 = _mm512_fmadd_ps(load16(r + d), _mm512_loadu_ps(x + d), s0);
      s1 = _mm512_fmadd_ps(load16(r + d + 16), _mm512_loadu_ps(x + d + 16), s1);
    }
    if (d + 16 <= D) s0 = _mm512_fmadd_ps(load16(r + d), _mm512_loadu_ps(x + d), s0), d += 16;
    if (d < D) {
      const __mmask16 k = (__mmask16)((1u << (D - d)) - 1);
      s1 = _mm512_fmadd_ps(load16_masked(r + d, k), _mm512_maskz_loadu_ps(k, x + d), s1);
      d = D;
    }
    s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (; d + 16 <= D; d += 16) {
      s0 = _mm256_fmadd_ps(load8(r + d), _mm256_loadu_ps(x + d), s0);
      s1 = _mm256_fmadd_ps(load8(r + d + 8), _mm256_loadu_ps(x + d + 8), s1);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_add_ps(s0, s1));
    for (float v : lanes) s += v;
#endif
    for (; d < D; ++d) s += bf16_to_float(r[d]) * x[d];
    out[l] = s;
  }
}

void bf16_to_floats(const uint16_t* in, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, load16(in + i));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load8(in + i));
#endif
  for (; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

}  // namespace sat
