#include "datasets/sha256.hpp"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define SAT_SHA_X86 1
#endif

namespace sat {

static const uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

static void blocks_portable(uint32_t* st, const uint8_t* p, size_t count) {
  for (; count > 0; --count, p += 64) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[t] + w[t];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    st[0] += a, st[1] += b, st[2] += c, st[3] += d, st[4] += e, st[5] += f, st[6] += g, st[7] += h;
  }
}

#ifdef SAT_SHA_X86
// The SHA-NI instructions keep the eight state words as two vectors, (a, b, e, f) and (c, d, g, h), and do two
// rounds per sha256rnds2; sha256msg1/msg2 extend the message schedule four words at a time.
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t* st, const uint8_t* p, size_t count) {
  const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i dcba = _mm_loadu_si128((const __m128i*)&st[0]);
  __m128i hgfe = _mm_loadu_si128((const __m128i*)&st[4]);
  __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
  __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
  for (; count > 0; --count, p += 64) {
    const __m128i abef_start = abef, cdgh_start = cdgh;
    __m128i m[4];
    for (int g = 0; g < 16; ++g) {  // 16 groups of 4 rounds
      __m128i& cur = m[g % 4];
      if (g < 4) {
        cur = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(p + 16 * g)), byteswap);
      } else {  // w[t..t+3] from w[t-16..t-1]
        const __m128i w16 = m[g % 4], w12 = m[(g + 1) % 4], w8 = m[(g + 2) % 4], w4 = m[(g + 3) % 4];
        __m128i x = _mm_add_epi32(_mm_sha256msg1_epu32(w16, w12), _mm_alignr_epi8(w4, w8, 4));
        cur = _mm_sha256msg2_epu32(x, w4);
      }
      __m128i k = _mm_add_epi32(cur, _mm_loadu_si128((const __m128i*)&kRound[4 * g]));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, k);
      k = _mm_shuffle_epi32(k, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, k);
    }
    abef = _mm_add_epi32(abef, abef_start);
    cdgh = _mm_add_epi32(cdgh, cdgh_start);
  }
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  dcba = _mm_blend_epi16(feba, dchg, 0xF0);
  hgfe = _mm_alignr_epi8(dchg, feba, 8);
  _mm_storeu_si128((__m128i*)&st[0], dcba);
  _mm_storeu_si128((__m128i*)&st[4], hgfe);
}

static bool cpu_has_sha() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9))) return false;  // SSE4.1, SSSE3
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b >> 29) & 1;
}
#endif

bool sha256_accelerated() {
#ifdef SAT_SHA_X86
  static const bool has = cpu_has_sha();
  return has;
#else
  return false;
#endif
}

Sha256::Sha256() {
  static const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(state_, init, sizeof state_);
}

void Sha256::blocks(const uint8_t* data, size_t count) {
#ifdef SAT_SHA_X86
  if (sha256_accelerated()) return blocks_shani(state_, data, count);
#endif
  blocks_portable(state_, data, count);
}

void Sha256::update(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += bytes;
  if (buffered_ > 0) {
    const size_t take = std::min(bytes, 64 - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take, p += take, bytes -= take;
    if (buffered_ < 64) return;
    blocks(buffer_, 1);
    buffered_ = 0;
  }
  if (bytes >= 64) blocks(p, bytes / 64);
  p += bytes / 64 * 64;
  bytes %= 64;
  std::memcpy(buffer_, p, bytes);
  buffered_ = bytes;
}

std::string Sha256::hex_digest() {
  const uint64_t bits = total_ * 8;
  uint8_t pad[72] = {0x80};
  const size_t pad_len = (buffered_ < 56 ? 56 : 120) - buffered_;
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = (uint8_t)(bits >> (56 - 8 * i));
  update(pad, pad_len + 8);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t w : state_)
    for (int s = 28; s >= 0; s -= 4) out += hex[(w >> s) & 15];
  return out;
}

std::string sha256_hex(const void* data, size_t bytes) {
  Sha256 h;
  h.update(data, bytes);
  return h.hex_digest();
}

std::string sha256_hex(const std::string& bytes) {
  return sha256_hex(bytes.data(), bytes.size());
}

std::string sha256_hex_portable(const void* data, size_t bytes) {
  // the same padding as Sha256, over the portable block function
  uint32_t st[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const uint8_t* p = static_cast<const uint8_t*>(data);
  blocks_portable(st, p, bytes / 64);
  uint8_t tail[128] = {0};
  const size_t rest = bytes % 64;
  std::memcpy(tail, p + bytes / 64 * 64, rest);
  tail[rest] = 0x80;
  const size_t tail_blocks = rest < 56 ? 1 : 2;
  const uint64_t bits = (uint64_t)bytes * 8;
  for (int i = 0; i < 8; ++i) tail[tail_blocks * 64 - 1 - i] = (uint8_t)(bits >> (8 * i));
  blocks_portable(st, tail, tail_blocks);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t w : st)
    for (int s = 28; s >= 0; s -= 4) out += hex[(w >> s) & 15];
  return out;
}

}  // namespace sat
