#include "datasets/features.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "datasets/io.hpp"
#include "datasets/json_checks.hpp"

namespace sat {

using nlohmann::json;

static const char kMagic[8] = {'S', 'A', 'T', 'F', 'E', 'A', 'T', '1'};
static const size_t kAlign = 4096;

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Round to nearest even, as the F16C instruction does, so both paths give the same bytes.
static uint16_t float_to_half_scalar(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xFF, man = x & 0x7FFFFF;
  if (exp == 0xFF) return (uint16_t)(sign | 0x7C00 | (man ? 0x200 : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7C00);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000;
    int shift = 14 - e;
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return (uint16_t)half;
}

static float half_to_float_scalar(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      int e = -1;
      do ++e, man <<= 1;
      while (!(man & 0x400));
      bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void floats_to_half(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) out[i] = float_to_half_scalar(in[i]);
}

void half_to_floats(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(in + i))));
#endif
  for (; i < n; ++i) out[i] = half_to_float_scalar(in[i]);
}

json FeatureHeader::to_json() const {
  json j = {{"encoder", encoder},   {"encoder_id", encoder_id}, {"grid_h", grid_h}, {"grid_w", grid_w},
            {"channels", channels}, {"dtype", dtype},           {"images", images}};
  if (!skipped.empty()) {  // absent otherwise: caches without skipped photos keep their header
    json list = json::array();
    for (auto& [name, why] : skipped) list.push_back({{"image", name}, {"error", why}});
    j["skipped"] = list;
  }
  if (mirrored) j["mirrored"] = true;  // absent otherwise, like "skipped"
  return j;
}

static std::string header_block(const FeatureHeader& h) {
  std::string text = h.to_json().dump();
  std::string out(kMagic, 8);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out += (char)((n >> (8 * i)) & 0xFF);
  out += text;
  out.resize((out.size() + kAlign - 1) / kAlign * kAlign, '\0');
  return out;
}

// Parses the header from the first bytes of a file; returns the payload offset.
static size_t parse_header(const unsigned char* p, size_t size, const std::string& path, FeatureHeader& h) {
  if (size < 16 || std::memcmp(p, kMagic, 8) != 0)
    fail(path, "not a sat feature cache (bad magic; make one with sat extract)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= (uint64_t)p[8 + i] << (8 * i);
  if (n > size - 16) fail(path, "feature cache header runs past the end of the file (truncated?)");
  try {
    json j = json::parse(p + 16, p + 16 + n);
    try {
      require_json_numbers_in_range(j, "");
    } catch (const Error& e) {
      throw std::runtime_error(std::string(e.what()).substr(2));  // ": number out of range ..." without the empty path
    }
    h.encoder = j.at("encoder");
    h.encoder_id = j.at("encoder_id").get<std::string>();
    h.grid_h = j.at("grid_h").get<int>();
    h.grid_w = j.at("grid_w").get<int>();
    h.channels = j.at("channels").get<int>();
    h.dtype = j.at("dtype").get<std::string>();
    h.images = j.at("images").get<std::vector<std::string>>();
    if (j.contains("skipped"))
      for (auto& e : j.at("skipped"))
        h.skipped.emplace_back(e.at("image").get<std::string>(), e.at("error").get<std::string>());
    h.mirrored = j.value("mirrored", false);
  } catch (const std::exception& e) {
    fail(path, std::string("feature cache header is malformed (") + e.what() + ")");
  }
  if (h.grid_h < 1 || h.grid_w < 1 || h.channels < 1 || (h.dtype != "f16" && h.dtype != "f32"))
    fail(path, "feature cache header has bad shapes or dtype");
  return (16 + n + kAlign - 1) / kAlign * kAlign;
}

FeatureCache::FeatureCache(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(path, std::string("cannot open feature cache (") + std::strerror(errno) + ")");
  struct stat st;
  fstat(fd, &st);
  map_size_ = (size_t)st.st_size;
  if (map_size_ == 0) {
    ::close(fd);
    fail(path, "empty file, not a feature cache");
  }
  void* m = mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail(path, std::string("cannot map feature cache (") + std::strerror(errno) + ")");
  map_ = (const unsigned char*)m;
  try {
    payload_ = parse_header(map_, map_size_, path, header_);
    size_t need = payload_ + header_.record_bytes() * header_.images.size();
    if (map_size_ != need)
      fail(path, "feature cache is " + std::to_string(map_size_) + " bytes, its header describes " +
                     std::to_string(need) + " (truncated or still being written?)");
    for (size_t i = 0; i < header_.images.size(); ++i)
      if (!index_.emplace(header_.images[i], (int)i).second)
        fail(path, "image '" + header_.images[i] + "' appears twice");
  } catch (...) {
    munmap((void*)map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

FeatureCache::~FeatureCache() {
  if (map_) munmap((void*)map_, map_size_);
}

int FeatureCache::index_of(const std::string& image) const {
  auto it = index_.find(image);
  return it == index_.end() ? -1 : it->second;
}

void FeatureCache::read(int i, float* out) const {
  const size_t rb = header_.record_bytes(), count = (size_t)header_.locations() * header_.channels;
  const unsigned char* rec = record_at(i);
  if (header_.dtype == "f16")
    half_to_floats((const uint16_t*)rec, out, count);
  else
    std::memcpy(out, rec, rb);
  // Streaming: the record's pages go back to the page cache's care, so resident memory stays bounded.
  uintptr_t page = 4096, begin = ((uintptr_t)rec + page - 1) / page * page, end = ((uintptr_t)rec + rb) / page * page;
  if (end > begin) madvise((void*)begin, end - begin, MADV_DONTNEED);
}

const unsigned char* FeatureCache::record_at(int i) const {
  return map_ + payload_ + (size_t)i * header_.record_bytes();
}

void FeatureCache::prefetch(int i) const {
  if (i < 0 || i >= size()) return;
  const size_t rb = header_.record_bytes();
  const unsigned char* rec = record_at(i);
  const uintptr_t page = 4096, begin = (uintptr_t)rec / page * page,
                  end = ((uintptr_t)rec + rb + page - 1) / page * page;
  madvise((void*)begin, end - begin, MADV_WILLNEED);
}

bool FeatureCache::was_skipped(const std::string& image) const {
  for (auto& [name, why] : header_.skipped)
    if (name == image) return true;
  return false;
}

void FeatureCache::require(const std::string& encoder_id, const std::vector<std::string>& names, bool mirrored) const {
  if (header_.encoder_id != encoder_id)
    fail(path_, "feature cache was made by a different encoder (id " + header_.encoder_id + ", this model's is " +
                    encoder_id + "); extract it again with this encoder");
  if (header_.mirrored && !mirrored)
    fail(path_,
         "feature cache holds the photos mirrored (sat extract --mirror): it is for sat train --mirror-features, "
         "not the photos' own features");
  if (!header_.mirrored && mirrored)
    fail(path_, "feature cache holds the photos as they are, not mirrored: make one with sat extract --mirror");
  for (auto& n : names)
    if (!index_.count(n)) fail(path_, "feature cache has no features for image '" + n + "'");
}

FeatureWriter::FeatureWriter(const std::string& path, const FeatureHeader& header)
    : path_(path), partial_(path + ".partial"), header_(header) {
  const std::string block = header_block(header_);
  const size_t rb = header_.record_bytes();
  if (file_exists(partial_)) {
    fd_ = ::open(partial_.c_str(), O_RDWR);
    struct stat st;
    if (fd_ < 0 || fstat(fd_, &st) != 0) fail(partial_, std::string("cannot resume (") + std::strerror(errno) + ")");
    const size_t size = (size_t)st.st_size;
    std::string head(std::min(size, block.size() + kAlign), '\0');  // enough for a header like ours
    if (pread(fd_, head.data(), head.size(), 0) != (ssize_t)head.size()) fail(partial_, "cannot read its header");
    FeatureHeader old;
    size_t payload = parse_header((const unsigned char*)head.data(), head.size(), partial_, old);
    if (old.to_json() != header_.to_json())
      fail(partial_,
           "an unfinished cache for a different encoder or image list is in the way (remove it to start over)");
    done_ = (int)std::min<size_t>((size - std::min(size, payload)) / rb, header_.images.size());
    const off_t keep = (off_t)(payload + (size_t)done_ * rb);
    if (ftruncate(fd_, keep) != 0 || lseek(fd_, keep, SEEK_SET) < 0)
      fail(partial_, std::string("cannot resume (") + std::strerror(errno) + ")");
    return;
  }
  make_dirs(path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/')));
  fd_ = ::open(partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) fail(partial_, std::string("cannot create (") + std::strerror(errno) + ")");
  if (::write(fd_, block.data(), block.size()) != (ssize_t)block.size()) fail(partial_, "write failed (disk full?)");
}

FeatureWriter::~FeatureWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FeatureWriter::append(const float* grid, int count) {
  const size_t per = (size_t)header_.locations() * header_.channels;
  std::vector<uint16_t> half;
  for (int k = 0; k < count; ++k) {
    if (done_ >= (int)header_.images.size()) throw Error(partial_ + ": more records than images");
    const void* src = grid + (size_t)k * per;
    size_t bytes = per * 4;
    if (header_.dtype == "f16") {
      half.resize(per);
      floats_to_half(grid + (size_t)k * per, half.data(), per);
      src = half.data(), bytes = per * 2;
    }
    if (::write(fd_, src, bytes) != (ssize_t)bytes) fail(partial_, "write failed (disk full?)");
    ++done_;
  }
}

void FeatureWriter::finish() {
  if (done_ != (int)header_.images.size()) throw Error(partial_ + ": finished with records missing");
  if (fsync(fd_) != 0) fail(partial_, "fsync failed");
  ::close(fd_);
  fd_ = -1;
  if (std::rename(partial_.c_str(), path_.c_str()) != 0)
    fail(path_, std::string("cannot rename into place (") + std::strerror(errno) + ")");
}

}  // namespace sat
