// Base layer: errors, files written atomically, parameters, the run's random generator.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "datasets/sat/error.hpp"

namespace sat {

// Every library error is one line (sat::Error, datasets/sat/error.hpp: part of the public API, installed as
// <sat/error.hpp>); the CLI prints "sat: <message>" and exits non-zero.
[[noreturn]] void fail(const std::string& file, const std::string& problem);

std::string read_file(const std::string& path);
// A whole file mapped read-only (large weight files: no copy, pages mapped in one call). Errors name the file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};
// Writes to "<path>.tmp.<pid>", fsyncs, then renames over path: a reader never sees half a file.
void write_file_atomic(const std::string& path, const std::string& bytes);
bool file_exists(const std::string& path);  // a file or a folder
bool is_directory(const std::string& path);
void make_dirs(const std::string& path);
std::string join_path(const std::string& dir, const std::string& name);

// 64-byte aligned memory; blocks of 1 MB or more are mapped in by one madvise call instead of a page fault per
// 4 KB page (on virtual machines a fault costs microseconds: loading a model touches hundreds of MB).
void* allocate_aligned(size_t bytes);

// 64-byte aligned floats left unwritten (allocate_aligned: mapped in, no zeros written): for a buffer written in full
// before anything reads it, such as a reorder's destination (a FloatBuffer writes zeros first).
class UnwrittenFloats {
 public:
  explicit UnwrittenFloats(size_t n) : data_(static_cast<float*>(allocate_aligned(n * sizeof(float))), &std::free) {}
  float* data() const { return data_.get(); }

 private:
  std::unique_ptr<float, void (*)(void*)> data_;
};

// 64-byte aligned storage for tensors: SIMD code (Eigen, oneDNN) then takes the same path in every process,
// so results are bit-identical from run to run (a resumed run continues exactly as the uninterrupted one).
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(allocate_aligned(n * sizeof(T))); }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const {
    return false;
  }
};
using FloatBuffer = std::vector<float, AlignedAllocator<float>>;

// A named float32 tensor with its gradient. Row-major; shape in the usual (out, in, ...) order.
// A trainable tensor's gradient is allocated (zeros) when first needed: by zero_grad(), ensure_grad() or grad_of(),
// so a model loaded only to caption never holds (or first-touches) a gradient as large as its weights. Code that
// adds into `grad` calls one of them first.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  FloatBuffer value;
  FloatBuffer grad;       // empty until needed (see above); then value.size() floats
  bool trainable = true;  // false for buffers such as batch-norm running statistics

  Param() = default;
  Param(std::string n, std::vector<int64_t> s, bool train = true);
  int64_t size() const { return (int64_t)value.size(); }
  void zero_grad();    // a trainable tensor's gradient: allocated if it was not, set to zero
  void ensure_grad();  // a trainable tensor's gradient: allocated (zeros) if it was not, else left as it is
};
int64_t shape_size(const std::vector<int64_t>& shape);
std::string shape_str(const std::vector<int64_t>& shape);

// One seeded generator per run; its state goes into checkpoints so --resume continues identically.
// Distributions are written here (not std::) so the same seed gives the same numbers on every platform.
struct Rng {
  std::mt19937_64 engine;
  explicit Rng(uint64_t seed = 1) : engine(seed) {}
  double uniform();                         // [0, 1)
  double uniform(double lo, double hi);     // [lo, hi)
  int64_t integer(int64_t lo, int64_t hi);  // inclusive
  double normal();
  std::string state() const;
  void set_state(const std::string& s);
};

// A small random stream of its own (splitmix64) for one row of a training batch, seeded from the step and the row's
// place in the global batch: a caption's dropout masks and glimpses are then the same whichever process or batch
// share holds it (data-parallel training gives the model a single process would).
struct RowRng {
  uint64_t state;
  explicit RowRng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
};
// The seed of row `index` of a step whose seed is step_seed (well mixed: neighbouring rows get unrelated streams).
inline uint64_t row_seed(uint64_t step_seed, uint64_t index) {
  RowRng mix(step_seed ^ (index * 0xd1b54a32d192ed03ull));
  mix.next();
  return mix.next();
}

// Deterministic shuffle with our own generator.
template <typename T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (int64_t i = (int64_t)v.size() - 1; i > 0; --i) std::swap(v[i], v[rng.integer(0, i)]);
}

}  // namespace sat
