#include "seq/matmul.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include <oneapi/dnnl/dnnl.hpp>

#include "datasets/cpu.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace sat {

using dnnl::memory;
using dt = memory::data_type;

bool cpu_computes_bf16() {
  return dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
}
bool cpu_prefers_bf16_products() {
  static const bool faster = bf16_beats_f32(dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_amx,
                                            cpu_computes_bf16(), cpu_vendor());
  return faster;
}

const char* product_precision_name(ProductPrecision p) {
  return p == ProductPrecision::bf16 ? "bf16" : "f32";
}

ProductPrecision parse_product_precision(const std::string& s, const std::string& what) {
  if (s == "f32") return ProductPrecision::f32;
  if (s == "auto") return cpu_prefers_bf16_products() ? ProductPrecision::bf16 : ProductPrecision::f32;
  if (s == "bf16") {
    if (!cpu_computes_bf16())
      throw Error(what + ": this CPU has no native bfloat16 arithmetic (AVX512-BF16 or AMX); use f32 or auto");
    return ProductPrecision::bf16;
  }
  throw Error(what + ": unknown precision '" + s + "' (f32, bf16 or auto)");
}

static inline uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // NaN stays NaN (quiet); everything else rounds to nearest, ties to even
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)rounded;
}

float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__AVX512F__)
// 16 floats rounded to bf16 as round_bf16 does (to nearest, ties to even; NaN stays a quiet NaN), stored at out.
static inline void store_bf16x16(__m512 v, uint16_t* out) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
}

// out[r0 + k][c0 + i] = in[(c0 + i) * ld + r0 + k] for k, i < 16, rounded to bf16: the 16 rows loaded, transposed in
// registers (pairs of rows interleaved, then groups of four, then the 128-bit lanes), each result row stored.
static inline void transposed_tile_bf16(const float* in, int64_t ld, uint16_t* out, int64_t ldo) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ld);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4g + j], lane k: rows 4g..4g+3 of column 4k + j
  for (int g = 0; g < 4; ++g) {
    r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {  // column 4k + j: lane g of r[4g + j], k-th lane of each
    const __m512 ab_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44), ab_hi = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE),
                 cd_lo = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44),
                 cd_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
    store_bf16x16(_mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88), out + (0 + j) * ldo);
    store_bf16x16(_mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD), out + (4 + j) * ldo);
    store_bf16x16(_mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88), out + (8 + j) * ldo);
    store_bf16x16(_mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD), out + (12 + j) * ldo);
  }
}
#endif

void to_bf16(const Operand& X, uint16_t* out) {
  const int64_t R = X.op_rows(), C = X.op_cols();
  if (!X.trans) {
#pragma omp parallel for schedule(static) if (R * C >= 65536)
    for (int64_t r = 0; r < R; ++r) {
      const float* x = X.data + r * X.ld;
      uint16_t* o = out + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = round_bf16(x[c]);
    }
    return;
  }
  // out[r][c] = X[c][r], in 32 x 32 tiles so both sides stay in the cache; with AVX-512, the tiles' whole 16 x 16
  // blocks transposed in registers (7.9 GB/s read one element at a time, 2548 x 512 on a Zen 4)
  constexpr int64_t kTile = 32;
#pragma omp parallel for schedule(static) if (R * C >= 65536)
  for (int64_t r0 = 0; r0 < R; r0 += kTile)
    for (int64_t c0 = 0; c0 < C; c0 += kTile) {
      const int64_t r1 = std::min(R, r0 + kTile), c1 = std::min(C, c0 + kTile);
      int64_t rv = r0, cv = c0;  // the corner the blocks end at (no blocks: r0, c0)
#if defined(__AVX512F__)
      rv = r0 + (r1 - r0) / 16 * 16, cv = c0 + (c1 - c0) / 16 * 16;
      for (int64_t r = r0; r < rv; r += 16)
        for (int64_t c = c0; c < cv; c += 16) transposed_tile_bf16(X.data + c * X.ld + r, X.ld, out + r * C + c, C);
#endif
      for (int64_t r = r0; r < r1; ++r) {  // what the blocks left: the columns past cv, and the rows past rv
        uint16_t* o = out + r * C;
        for (int64_t c = r < rv ? cv : c0; c < c1; ++c) o[c] = round_bf16(X.data[c * X.ld + r]);
      }
    }
}

namespace {
// M, K, N, X's strides, W's strides, ldo, bf16, accumulate
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;
struct WeightKey {
  const float* data;
  int64_t rows, cols, ld;
  bool trans;
  bool operator<(const WeightKey& o) const {
    return std::tie(data, rows, cols, ld, trans) < std::tie(o.data, o.rows, o.cols, o.ld, o.trans);
  }
};
// A weight's bf16 copy in the layout one kind of primitive reads it in.
struct WeightCopy {
  uint64_t generation = 0;
  memory::desc desc;
  std::vector<uint8_t> bytes;
};
struct Primitive {
  dnnl::matmul matmul;
  memory::desc weights;  // the weights' layout it reads
};
}  // namespace

// One engine for every decoder (and so one stream per thread serves them all).
static dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

struct Products::Impl {
  std::mutex mutex;  // the caches below; a searched model may be shared by threads (the server)
  std::map<Key, Primitive> primitives;
  std::map<WeightKey, std::vector<WeightCopy>> weights;

  // ws0 == 0: a bf16 weight in the layout the primitive chooses (its copy is made in it, once per step), so the
  // kernel does not repack it on every call.
  Primitive& primitive(const Key& k) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = primitives.find(k);
    if (it != primitives.end()) return it->second;
    const auto [M, K, N, xs0, xs1, ws0, ws1, ldo, bf16, accumulate] = k;
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const memory::desc x({M, K}, in, memory::dims{xs0, xs1}),
        w = ws0 == 0 ? memory::desc({K, N}, in, memory::format_tag::any)
                     : memory::desc({K, N}, in, memory::dims{ws0, ws1}),
        o({M, N}, dt::f32, memory::dims{ldo, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x, w, o), attr, engine());
    return primitives.emplace(k, Primitive{dnnl::matmul(pd), pd.weights_desc()}).first->second;
  }
  // W's bf16 copy in `layout`, made again when older than `generation`.
  const void* weight_copy(const Operand& W, const memory::desc& layout, uint64_t generation);
};

Products::Products(ProductPrecision p) : precision_(p), impl_(std::make_unique<Impl>()) {}
Products::~Products() = default;

void Products::set_precision(ProductPrecision p) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  precision_ = p;
  impl_->weights.clear();
}

static dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(engine());
  return stream;
}

// Scratch for the activations' bf16 copies, per thread (searches may run in several threads).
static std::vector<uint16_t>& scratch(int which) {
  thread_local std::vector<uint16_t> buffers[3];
  return buffers[which];
}

static const uint16_t* converted(const Operand& X, int which) {
  auto& buf = scratch(which);
  if ((int64_t)buf.size() < X.rows * X.cols) buf.resize((size_t)(X.rows * X.cols));
  to_bf16(X, buf.data());
  return buf.data();
}

const void* Products::Impl::weight_copy(const Operand& W, const memory::desc& layout, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<WeightCopy>& copies = weights[{W.data, W.rows, W.cols, W.ld, W.trans}];
  auto it = std::find_if(copies.begin(), copies.end(), [&](const WeightCopy& c) { return c.desc == layout; });
  if (it == copies.end()) it = copies.insert(copies.end(), WeightCopy{0, layout, {}});
  WeightCopy& c = *it;
  if (c.generation != generation) {
    const int64_t K = W.op_rows(), N = W.op_cols();
    const memory::desc plain({K, N}, dt::bf16, memory::dims{N, 1});
    c.bytes.resize(layout.get_size());
    if (layout == plain) {
      to_bf16(W, reinterpret_cast<uint16_t*>(c.bytes.data()));
    } else {  // rounded to bf16 row-major, then reordered into the primitive's layout
      memory from(plain, engine(), const_cast<uint16_t*>(converted(W, 2))), to(layout, engine(), c.bytes.data());
      dnnl::reorder(from, to).execute(thread_stream(), from, to);
      thread_stream().wait();
    }
    c.generation = generation;
  }
  return c.bytes.data();
}

void Products::weight(const Operand& X, const Operand& W, float* out, int64_t ldo, bool accumulate) {
  const bool bf16 = precision_ == ProductPrecision::bf16;
  const bool empty = X.op_rows() == 0 || W.op_cols() == 0 || X.op_cols() == 0;
  run(X, bf16 && !empty ? converted(X, 0) : nullptr, W, nullptr, out, ldo, accumulate);
}

void Products::activations(const Operand& X, const Operand& Y, float* out, int64_t ldo, bool accumulate) {
  const bool bf16 = precision_ == ProductPrecision::bf16;
  const bool empty = X.op_rows() == 0 || Y.op_cols() == 0 || X.op_cols() == 0;
  if (!bf16 || empty) return run(X, nullptr, Y, nullptr, out, ldo, accumulate);
  run(X, converted(X, 0), Y, converted(Y, 1), out, ldo, accumulate);
}

// xh: X as bf16 (null: float32 products). In bf16, wh: W converted (plain row-major), or null when W is a weight,
// read from its copy in the layout the primitive chooses.
void Products::run(const Operand& X, const uint16_t* xh, const Operand& W, const uint16_t* wh, float* out, int64_t ldo,
                   bool accumulate) {
  const int64_t M = X.op_rows(), K = X.op_cols(), N = W.op_cols();
  if (W.op_rows() != K)
    throw Error("products: inner sizes differ (" + std::to_string(K) + " and " + std::to_string(W.op_rows()) + ")");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // a zero-width input (no context without attention): the product is zero
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m) std::fill(out + m * ldo, out + m * ldo + N, 0.f);
    return;
  }
  const bool bf16 = xh != nullptr, packed = bf16 && !wh;
  // bf16 operands are converted copies; float32 ones are read in place, transposed by strides
  const int64_t xs0 = bf16 ? K : X.trans ? 1 : X.ld, xs1 = bf16 ? 1 : X.trans ? X.ld : 1;
  const int64_t ws0 = packed ? 0 : bf16 ? N : W.trans ? 1 : W.ld, ws1 = packed ? 0 : bf16 ? 1 : W.trans ? W.ld : 1;
  Primitive& p = impl_->primitive({M, K, N, xs0, xs1, ws0, ws1, ldo, bf16, accumulate});
  const dt in = bf16 ? dt::bf16 : dt::f32;
  // memory objects over the caller's buffers: cheap to make, so made per call
  const dnnl::engine& eng = engine();
  memory xm(memory::desc({M, K}, in, memory::dims{xs0, xs1}), eng,
            bf16 ? (void*)xh : (void*)const_cast<float*>(X.data));
  void* w = packed ? const_cast<void*>(impl_->weight_copy(W, p.weights, generation_))
            : bf16 ? (void*)wh
                   : (void*)const_cast<float*>(W.data);
  memory wm(p.weights, eng, w);
  memory om(memory::desc({M, N}, dt::f32, memory::dims{ldo, 1}), eng, out);
  p.matmul.execute(thread_stream(), {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, om}});
  thread_stream().wait();
}

}  // namespace sat
