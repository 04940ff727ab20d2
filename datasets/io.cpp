#include "datasets/io.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sat {

void fail(const std::string& file, const std::string& problem) {
  throw Error(file + ": " + problem);
}

namespace {

std::string not_regular(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory, expected a file";
  if (S_ISFIFO(mode)) return "is a named pipe, not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device, not a regular file";
  return "is not a regular file";
}

// A regular file opened for reading, and its size. A named pipe would block the open (or the read) until something
// writes to it, forever; a device may do anything when opened. stat refuses them before the open; the open does not
// block (O_NONBLOCK) and fstat checks what was opened, in case the path was replaced in between.
int open_regular(const std::string& path, struct stat& st) {
  if (stat(path.c_str(), &st) != 0) fail(path, "cannot open (" + std::string(std::strerror(errno)) + ")");
  if (!S_ISREG(st.st_mode)) fail(path, not_regular(st.st_mode));
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open for reading (" + std::string(std::strerror(errno)) + ")");
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISREG(st.st_mode) ? std::strerror(errno) : not_regular(st.st_mode);
    ::close(fd);
    fail(path, why);
  }
  return fd;
}

}  // namespace

std::string read_file(const std::string& path) {
  struct stat st {};
  // One allocation of the file's size and read() straight into it: a stream would grow and copy its buffer, and
  // every page first touched costs a fault (on this VM several microseconds each: model files are tens of MB).
  const int fd = open_regular(path, st);
  std::string out;
  out.resize((size_t)st.st_size);
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::read(fd, &out[got], out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      fail(path, r == 0 ? "changed size while being read" : "read error (" + std::string(std::strerror(errno)) + ")");
    }
    got += (size_t)r;
  }
  ::close(fd);
  return out;
}

void* allocate_aligned(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (!p) throw std::bad_alloc();
  if (bytes >= (1u << 20)) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it and the pages fault in as usual
#endif
    const uintptr_t page = 4096, begin = ((uintptr_t)p + page - 1) / page * page,
                    end = ((uintptr_t)p + bytes) / page * page;
    if (end > begin) ::madvise((void*)begin, end - begin, MADV_POPULATE_WRITE);
  }
  return p;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  struct stat st {};
  const int fd = open_regular(path, st);
  size_ = (size_t)st.st_size;
  if (size_ > 0) {
    // MAP_POPULATE maps every page in one call instead of one fault per page
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail(path, "cannot map (" + std::string(std::strerror(errno)) + ")");
    data_ = static_cast<const char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(path, "cannot write (" + std::string(std::strerror(errno)) + ")");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(path, "write failed (" + why + ")");
    }
    done += (size_t)n;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(path, "write failed (" + std::string(std::strerror(errno)) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    fail(path, "cannot replace file (" + why + ")");
  }
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && !file_exists(cur) && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        fail(cur, "cannot create directory (" + std::string(std::strerror(errno)) + ")");
    }
    if (i < path.size()) cur += path[i];
  }
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty() || (!name.empty() && name[0] == '/')) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

Param::Param(std::string n, std::vector<int64_t> s, bool train)
    : name(std::move(n)), shape(std::move(s)), trainable(train) {
  value.assign(shape_size(shape), 0.f);
}

void Param::zero_grad() {
  if (!trainable) return;
  if (grad.size() != value.size())
    grad.assign(value.size(), 0.f);
  else
    std::fill(grad.begin(), grad.end(), 0.f);
}

void Param::ensure_grad() {
  if (trainable && grad.size() != value.size()) grad.assign(value.size(), 0.f);
}

int64_t shape_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

double Rng::uniform() {
  return (double)(engine() >> 11) * (1.0 / 9007199254740992.0);
}
double Rng::uniform(double lo, double hi) {
  return lo + (hi - lo) * uniform();
}
int64_t Rng::integer(int64_t lo, int64_t hi) {
  uint64_t range = (uint64_t)(hi - lo) + 1;
  if (range == 0) return (int64_t)engine();
  uint64_t limit = UINT64_MAX - UINT64_MAX % range;  // rejection keeps it unbiased
  uint64_t x;
  do x = engine();
  while (x >= limit);
  return lo + (int64_t)(x % range);
}
double Rng::normal() {
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
std::string Rng::state() const {
  std::ostringstream ss;
  ss << engine;
  return ss.str();
}
void Rng::set_state(const std::string& s) {
  std::istringstream ss(s);
  ss >> engine;
  if (ss.fail()) throw Error("random generator state: cannot parse");
}

}  // namespace sat
