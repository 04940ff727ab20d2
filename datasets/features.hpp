// The feature cache: encoder grids for a list of images in one memory-mapped file, so training and evaluation
// read features instead of running the CNN, with bounded memory however large the dataset.
//
// Layout: "SATFEAT1", uint64 header length, JSON header {encoder, encoder_id, grid_h, grid_w, channels, dtype,
// images}, zero padding to a 4096-byte boundary, then one record per image in header order: L x D values
// (row-major, L = grid_h * grid_w in raster order), float16 or float32.
// Writing goes to "<path>.partial" (records appended in order; an interrupted run resumes from the last whole
// record) and the finished file is renamed into place.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sat {

struct FeatureHeader {
  nlohmann::json encoder;  // the encoder config that produced the grids
  std::string encoder_id;  // hash of that config and the encoder weights
  int grid_h = 0, grid_w = 0, channels = 0;
  std::string dtype = "f16";  // "f16" or "f32"
  std::vector<std::string> images;
  // Photos `sat extract --skip-bad` could not read, with the reason: the cache has no record for them.
  std::vector<std::pair<std::string, std::string>> skipped;
  // Every photo was mirrored left to right before encoding (sat extract --mirror): the grids a training run reads
  // for augmentation (sat train --mirror-features), never in place of a photo's own.
  bool mirrored = false;

  int locations() const { return grid_h * grid_w; }
  size_t record_bytes() const { return (size_t)locations() * channels * (dtype == "f16" ? 2 : 4); }
  nlohmann::json to_json() const;
};

class FeatureCache {
 public:
  // Maps the file read-only; validates magic, header and size. Errors name the file.
  explicit FeatureCache(const std::string& path);
  ~FeatureCache();
  FeatureCache(const FeatureCache&) = delete;
  FeatureCache& operator=(const FeatureCache&) = delete;

  const FeatureHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  int size() const { return (int)header_.images.size(); }
  int index_of(const std::string& image) const;  // -1 when absent
  // Record i as float32 (L x D). Pages of the record are released from memory afterwards (streaming).
  void read(int i, float* out) const;
  // Asks the kernel to start reading record i from disk now (madvise WILLNEED: one large asynchronous read), so that
  // a later read(i) finds it in memory. A cache larger than the page cache is otherwise read by page faults of
  // 128 KB each, one after another: 30 MB/s on the disk here, where 4 MB requests reach 160 MB/s.
  void prefetch(int i) const;
  // Throws Error unless the cache was made by this encoder (id), holds every image in `names` and is mirrored or not
  // as `mirrored` asks.
  void require(const std::string& encoder_id, const std::vector<std::string>& names, bool mirrored = false) const;
  bool was_skipped(const std::string& image) const;  // listed as unreadable when the cache was extracted

 private:
  std::string path_;
  FeatureHeader header_;
  std::map<std::string, int> index_;
  const unsigned char* record_at(int i) const;  // where record i starts in the mapping
  const unsigned char* map_ = nullptr;
  size_t map_size_ = 0, payload_ = 0;
};

// Appends records to "<path>.partial"; resumes one that has the same header (a different one is an error
// naming both). finish() renames it to path.
class FeatureWriter {
 public:
  FeatureWriter(const std::string& path, const FeatureHeader& header);
  ~FeatureWriter();
  int done() const { return done_; }          // records already present (resumed) or written
  void append(const float* grid, int count);  // count records of L x D floats
  void finish();

 private:
  std::string path_, partial_;
  FeatureHeader header_;
  int fd_ = -1, done_ = 0;
};

void floats_to_half(const float* in, uint16_t* out, size_t n);
void half_to_floats(const uint16_t* in, float* out, size_t n);
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

}  // namespace sat
