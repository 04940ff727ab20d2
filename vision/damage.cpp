#include "vision/damage.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "vision/image.hpp"

namespace sat {

namespace {

// Thrown inside the walk and caught by jpeg_damage: the first problem found ends it.
struct Damage {
  std::string what;
};
[[noreturn]] void damaged(std::string what) {
  throw Damage{std::move(what)};
}

uint32_t be16(const uint8_t* p) {
  return (uint32_t)p[0] << 8 | p[1];
}

std::string hex(uint8_t marker) {
  const char* digits = "0123456789ABCDEF";
  return std::string("FF") + digits[marker >> 4] + digits[marker & 15];
}

// A Huffman table (JPEG's canonical codes): codes up to 9 bits through one lookup, longer ones by the largest code
// of each length (the standard's DECODE procedure, F.2.2.3).
struct Huffman {
  bool defined = false;
  std::array<uint16_t, 512> fast{};  // top 9 bits -> length << 8 | symbol; 0: a longer code, or none
  std::array<int32_t, 17> maxcode{};
  std::array<int32_t, 17> offset{};  // symbol of code c of length l: symbols[offset[l] + c]
  std::array<uint8_t, 256> symbols{};
};

void build(Huffman& h, const uint8_t* counts, const uint8_t* symbols) {
  h = Huffman{};
  h.defined = true;
  int32_t code = 0, k = 0;
  for (int len = 1; len <= 16; ++len) {
    h.offset[len] = k - code;
    for (int i = 0; i < counts[len - 1]; ++i, ++code, ++k) {
      if (code >= (1 << len)) damaged("a Huffman table with more codes than its code lengths allow");
      h.symbols[k] = symbols[k];
      if (len <= 9)
        for (int j = 0; j < 1 << (9 - len); ++j) h.fast[(code << (9 - len)) | j] = (uint16_t)(len << 8 | symbols[k]);
    }
    h.maxcode[len] = counts[len - 1] ? code - 1 : -1;
    code <<= 1;
  }
}

// The bits of one restart interval's entropy-coded data: stuffed FF 00 read as FF, stopping at the first other
// marker (or the file's end). Past it, zero bits, as decoders supply them; `used` beyond `loaded` means the blocks
// needed more data than the interval holds.
struct Bits {
  const uint8_t* p;
  const uint8_t* end;
  uint64_t buf = 0, loaded = 0, used = 0;
  int n = 0;
  bool at_marker = false;

  Bits(const uint8_t* from, const uint8_t* to) : p(from), end(to) {}
  void fill() {
    while (n <= 56) {
      uint8_t byte = 0;
      if (!at_marker) {
        if (p < end && *p != 0xFF)
          byte = *p++, loaded += 8;
        else if (p + 1 < end && p[1] == 0x00)
          byte = 0xFF, p += 2, loaded += 8;
        else
          at_marker = true;
      }
      buf |= (uint64_t)byte << (56 - n);
      n += 8;
    }
  }
  uint32_t peek16() {
    if (n < 16) fill();
    return (uint32_t)(buf >> 48);
  }
  void skip(int k) {
    buf <<= k;
    n -= k;
    used += (uint64_t)k;
  }
  uint32_t get(int k) {
    if (k == 0) return 0;
    if (n < k) fill();
    const uint32_t v = (uint32_t)(buf >> (64 - k));
    skip(k);
    return v;
  }
  bool ran_out() const { return at_marker && used > loaded; }
  // Whole bytes after the interval's last bit, up to its marker (an encoder pads with fewer than 8 one-bits).
  uint64_t bytes_left() {
    while (!at_marker) {
      buf = 0, n = 0;
      fill();
    }
    return used > loaded ? 0 : (loaded - used) / 8;
  }
};

int decode(Bits& b, const Huffman& h) {
  const uint32_t top = b.peek16();
  if (const uint16_t f = h.fast[top >> 7]) {
    b.skip(f >> 8);
    return f & 0xFF;
  }
  for (int len = 10; len <= 16; ++len) {
    const int32_t code = (int32_t)(top >> (16 - len));
    if (code <= h.maxcode[len]) {
      b.skip(len);
      return h.symbols[(size_t)(h.offset[len] + code)];
    }
  }
  damaged("a Huffman code that its table does not hold (corrupt data)");
}

struct Component {
  int id = 0, h = 1, v = 1, tq = 0;
  int32_t dc = 0;                        // the DC predictor while a scan is decoded (quantized units)
  uint64_t bw = 0, bh = 0;               // its blocks across and down, in a scan of it alone
  std::array<int, 64> precision_left{};  // per coefficient: -1 before its first scan, then that scan's Al
  std::vector<uint64_t> nonzero;         // per block: which coefficients a progressive scan made nonzero
};

struct Frame {
  bool seen = false, checked = false, progressive = false;
  uint64_t width = 0, height = 0, mcux = 0, mcuy = 0;
  std::vector<Component> comps;
};

struct Scan {
  std::vector<int> comps;  // into Frame::comps
  std::vector<int> dc, ac;
  int ss = 0, se = 63, ah = 0, al = 0;
};

void parse_frame(Frame& f, uint8_t marker, const uint8_t* s, size_t n) {
  if (f.seen) damaged("a second frame header (" + hex(marker) + ")");
  if (n < 6 || n < 6 + 3 * (size_t)s[5]) damaged("a frame header shorter than its components");
  f.seen = true;
  f.progressive = marker == 0xC2;
  f.height = be16(s + 1), f.width = be16(s + 3);
  const int count = s[5];
  int hmax = 1, vmax = 1;
  for (int i = 0; i < count; ++i) {
    Component c;
    c.id = s[6 + 3 * i], c.h = s[7 + 3 * i] >> 4, c.v = s[7 + 3 * i] & 15, c.tq = s[8 + 3 * i] & 3;
    if (c.h < 1 || c.h > 4 || c.v < 1 || c.v > 4) damaged("a frame component with sampling factors out of 1..4");
    for (const Component& o : f.comps)
      if (o.id == c.id) damaged("a frame header naming component " + std::to_string(c.id) + " twice");
    c.precision_left.fill(-1);
    hmax = std::max(hmax, c.h), vmax = std::max(vmax, c.v);
    f.comps.push_back(std::move(c));
  }
  // Only what stb decodes (8-bit Huffman, sequential or progressive) is decoded here; the decoder refuses the
  // declared sizes this would not bound.
  f.checked = (marker == 0xC0 || marker == 0xC1 || marker == 0xC2) && s[0] == 8 && count >= 1 && count <= 4 &&
              f.width > 0 && f.height > 0 && f.width * f.height <= kMaxImagePixels;
  f.mcux = (f.width + 8 * hmax - 1) / (8 * hmax), f.mcuy = (f.height + 8 * vmax - 1) / (8 * vmax);
  for (Component& c : f.comps) {
    c.bw = ((f.width * c.h + hmax - 1) / hmax + 7) / 8;
    c.bh = ((f.height * c.v + vmax - 1) / vmax + 7) / 8;
  }
}

void parse_huffman(const uint8_t* s, size_t n, Huffman dc[4], Huffman ac[4]) {
  while (n > 0) {
    if (n < 17) damaged("a Huffman table segment shorter than its code counts");
    const int cls = s[0] >> 4, id = s[0] & 15;
    if (cls > 1 || id > 3) damaged("a Huffman table of class " + std::to_string(cls) + ", id " + std::to_string(id));
    size_t total = 0;
    for (int i = 1; i <= 16; ++i) total += s[i];
    if (total > 256 || 17 + total > n) damaged("a Huffman table with more codes than its segment holds");
    build(cls == 0 ? dc[id] : ac[id], s + 1, s + 17);
    s += 17 + total, n -= 17 + total;
  }
}

Scan parse_scan(Frame& f, const uint8_t* s, size_t n) {
  if (!f.seen) damaged("scan data before any frame header");
  if (n < 1 || n < 4 + 2 * (size_t)s[0]) damaged("a scan header shorter than its components");
  const int count = s[0];
  if (count < 1 || count > 4) damaged("a scan of " + std::to_string(count) + " components");
  Scan scan;
  for (int i = 0; i < count; ++i) {
    const int id = s[1 + 2 * i];
    int at = -1;
    for (size_t c = 0; c < f.comps.size(); ++c)
      if (f.comps[c].id == id) at = (int)c;
    if (at < 0) damaged("a scan of component " + std::to_string(id) + ", which the frame lacks");
    for (int c : scan.comps)
      if (c == at) damaged("a scan naming component " + std::to_string(id) + " twice");
    scan.comps.push_back(at);
    scan.dc.push_back(s[2 + 2 * i] >> 4), scan.ac.push_back(s[2 + 2 * i] & 15);
  }
  const uint8_t* t = s + 1 + 2 * count;
  scan.ss = t[0], scan.se = t[1], scan.ah = t[2] >> 4, scan.al = t[2] & 15;
  return scan;
}

// The rules a scan's spectral band and successive approximation follow (G.1.1.1), and each coefficient's precision
// so far: a progressive JPEG cut short and given an end-of-image marker lacks its last scans.
void check_progression(Frame& f, const Scan& s) {
  if (!f.progressive) {
    if (s.ss != 0 || s.se != 63 || s.ah != 0 || s.al != 0) damaged("a sequential scan with progressive parameters");
    for (int c : s.comps) f.comps[(size_t)c].precision_left[0] = 0;
    return;
  }
  if (s.ss > s.se || s.se > 63 || (s.ss == 0 && s.se != 0) || (s.ss > 0 && s.comps.size() != 1) || s.al > 13 ||
      (s.ah != 0 && s.ah != s.al + 1))
    damaged("a progressive scan with invalid parameters");
  for (int c : s.comps) {
    std::array<int, 64>& left = f.comps[(size_t)c].precision_left;
    if (s.ss > 0 && left[0] < 0) damaged("an AC scan before the DC scan of its component");
    for (int k = s.ss; k <= s.se; ++k) {
      if (left[k] != (s.ah == 0 ? -1 : s.ah)) damaged("a progressive scan out of sequence");
      left[k] = s.al;
    }
  }
}

void need(const Huffman& h, const char* what) {
  if (!h.defined) damaged(std::string("a scan using an undefined ") + what + " Huffman table");
}

// A block's DC difference, added to its component's predictor. The DC coefficient of 8-bit samples is 8 times their
// mean less 128, within [-1024, 1016]: a desynchronised bit stream walks the predictor out of it (al: a progressive
// scan's point transform, whose dropped low bits are at most 2^al - 1; q: the quantizer, 0 when unknown).
void dc_difference(Bits& b, const Huffman& table, Component& c, int al, uint32_t q) {
  const int size = decode(b, table);
  if (size > 11) damaged("a DC difference of magnitude category " + std::to_string(size) + " (corrupt data)");
  const int32_t bits = (int32_t)b.get(size);
  c.dc += size == 0 ? 0 : bits < (1 << (size - 1)) ? bits - (1 << size) + 1 : bits;
  const int64_t low = (int64_t)c.dc * (1 << al), high = low + (1 << al) - 1;
  if (q != 0 && (low * q > 1024 + (int64_t)q || high * q < -1024 - (int64_t)q))
    damaged("a DC value no 8-bit block has (corrupt data)");
}

void sequential_block(Bits& b, const Huffman& dc, const Huffman& ac, Component& c, uint32_t q) {
  dc_difference(b, dc, c, 0, q);
  for (int k = 1; k < 64;) {
    const int rs = decode(b, ac), r = rs >> 4, size = rs & 15;
    if (size == 0) {
      if (r != 15) break;
      k += 16;
      if (k > 64) damaged("a run of zeros past the 64th coefficient (corrupt data)");
      continue;
    }
    k += r;
    if (k > 63) damaged("a coefficient past the 64th (corrupt data)");
    if (size > 10) damaged("an AC coefficient of magnitude category " + std::to_string(size) + " (corrupt data)");
    b.get(size);
    ++k;
  }
}

void ac_first_block(Bits& b, const Huffman& ac, const Scan& s, uint64_t& nonzero, uint32_t& eobrun) {
  if (eobrun > 0) {
    --eobrun;
    return;
  }
  for (int k = s.ss; k <= s.se;) {
    const int rs = decode(b, ac), r = rs >> 4, size = rs & 15;
    if (size == 0) {
      if (r < 15) {
        eobrun = (1u << r) - 1 + b.get(r);
        return;
      }
      k += 16;
      if (k > s.se + 1) damaged("a run of zeros past the scan's band (corrupt data)");
      continue;
    }
    k += r;
    if (k > s.se) damaged("a coefficient past the scan's band (corrupt data)");
    if (size > 10) damaged("an AC coefficient of magnitude category " + std::to_string(size) + " (corrupt data)");
    b.get(size);
    nonzero |= 1ull << k;
    ++k;
  }
}

// libjpeg's decode_mcu_AC_refine without the coefficients: a correction bit for every coefficient already nonzero
// that a run passes, so which ones are nonzero is kept per block.
void ac_refine_block(Bits& b, const Huffman& ac, const Scan& s, uint64_t& nonzero, uint32_t& eobrun) {
  int k = s.ss;
  if (eobrun == 0) {
    for (; k <= s.se; ++k) {
      const int rs = decode(b, ac), size = rs & 15;
      int r = rs >> 4;
      if (size != 0) {
        if (size != 1) damaged("a refinement coefficient of magnitude category " + std::to_string(size));
        b.get(1);
      } else if (r != 15) {
        eobrun = (1u << r) + b.get(r);
        break;
      }
      for (; k <= s.se; ++k) {
        if (nonzero >> k & 1)
          b.get(1);
        else if (r-- == 0)
          break;
      }
      if (size != 0) {
        if (k > s.se) damaged("a refinement coefficient past the scan's band (corrupt data)");
        nonzero |= 1ull << k;
      }
    }
  }
  if (eobrun > 0) {
    for (; k <= s.se; ++k)
      if (nonzero >> k & 1) b.get(1);
    --eobrun;
  }
}

const uint8_t* skip_fill(const uint8_t* p, const uint8_t* end) {
  while (p + 1 < end && p[1] == 0xFF) ++p;
  return p;
}

// Decodes a scan's every block (for stb's codings) or steps over its data (the others), checking its restart
// markers; returns where the marker after it starts.
const uint8_t* walk_scan(Frame& f, const Scan& s, const Huffman dc[4], const Huffman ac[4],
                         const std::array<uint32_t, 4>& dc_quant, uint32_t restart, int number, const uint8_t* p,
                         const uint8_t* end) {
  const std::string which = "scan " + std::to_string(number);
  uint64_t mcus = 0;
  if (f.checked) {
    const bool dc_scan = s.ss == 0, refine = s.ah != 0;
    for (size_t i = 0; i < s.comps.size(); ++i) {
      if (dc_scan && !(f.progressive && refine)) need(dc[s.dc[i]], "DC");
      if (!f.progressive || !dc_scan) need(ac[s.ac[i]], "AC");
    }
    const Component& one = f.comps[(size_t)s.comps[0]];
    mcus = s.comps.size() == 1 ? one.bw * one.bh : f.mcux * f.mcuy;
    if (f.progressive && !dc_scan) {
      Component& c = f.comps[(size_t)s.comps[0]];
      if (c.nonzero.empty()) c.nonzero.assign(c.bw * c.bh, 0);
    }
  }
  Bits b(p, end);
  uint32_t eobrun = 0;
  int next_rst = 0;
  for (int c : s.comps) f.comps[(size_t)c].dc = 0;
  auto finish_interval = [&](uint64_t mcu) {
    if (const uint64_t left = b.bytes_left())
      damaged(which + " has " + std::to_string(left) + " bytes of data left after MCU " + std::to_string(mcu) +
              " (corrupt data)");
  };
  for (uint64_t m = 0; f.checked && m < mcus; ++m) {
    if (restart > 0 && m > 0 && m % restart == 0) {
      finish_interval(m);
      const uint8_t* at = skip_fill(b.p, end);
      if (at + 1 >= end || at[1] != 0xD0 + next_rst)
        damaged(which + ": restart marker " + hex((uint8_t)(0xD0 + next_rst)) + " missing before MCU " +
                std::to_string(m) + " of " + std::to_string(mcus) + " (cut short or corrupt)");
      next_rst = (next_rst + 1) & 7;
      b = Bits(at + 2, end);
      eobrun = 0;
      for (int c : s.comps) f.comps[(size_t)c].dc = 0;
    }
    for (size_t i = 0; i < s.comps.size(); ++i) {
      Component& c = f.comps[(size_t)s.comps[i]];
      const Huffman &d = dc[s.dc[i]], &a = ac[s.ac[i]];
      const uint32_t q = dc_quant[(size_t)c.tq];
      const int blocks = s.comps.size() == 1 ? 1 : c.h * c.v;
      for (int k = 0; k < blocks; ++k) {
        if (!f.progressive) {
          sequential_block(b, d, a, c, q);
        } else if (s.ss == 0) {
          if (s.ah != 0) {
            b.get(1);
          } else {
            dc_difference(b, d, c, s.al, q);
          }
        } else if (s.ah == 0) {
          ac_first_block(b, a, s, c.nonzero[m], eobrun);
        } else {
          ac_refine_block(b, a, s, c.nonzero[m], eobrun);
        }
      }
    }
    if (b.ran_out())
      damaged(which + "'s data ends at MCU " + std::to_string(m + 1) + " of " + std::to_string(mcus) +
              " (cut short or corrupt)");
  }
  if (f.checked) finish_interval(mcus);
  // the data of a scan not decoded here: up to the first marker that is not a restart, those in order
  while (true) {
    b.bytes_left();
    const uint8_t* at = skip_fill(b.p, end);
    if (at + 1 >= end) damaged("no end-of-image marker (cut short?)");
    const uint8_t m = at[1];
    if (m < 0xD0 || m > 0xD7) return at;
    if (f.checked) damaged(which + " has more restart intervals than its " + std::to_string(mcus) + " MCUs");
    if (m != 0xD0 + next_rst) damaged(which + ": restart marker " + hex(m) + " out of order");
    next_rst = (next_rst + 1) & 7;
    b = Bits(at + 2, end);
  }
}

void walk(std::string_view bytes) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data()) + 2;
  const uint8_t* const begin = p - 2;
  const uint8_t* const end = begin + bytes.size();
  Frame f;
  Huffman dc[4], ac[4];
  std::array<uint32_t, 4> dc_quant{};  // each quantization table's DC step (0: not defined)
  uint32_t restart = 0;
  int scans = 0;
  while (true) {
    if (p >= end) damaged("no end-of-image marker (cut short?)");
    if (*p != 0xFF) damaged("data where a marker belongs, at byte " + std::to_string(p - begin));
    while (p < end && *p == 0xFF) ++p;
    if (p >= end) damaged("no end-of-image marker (cut short?)");
    const uint8_t marker = *p++;
    if (marker == 0xD9) break;
    if (marker == 0x01) continue;
    if (marker == 0x00 || marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7))
      damaged("marker " + hex(marker) + " out of place, at byte " + std::to_string(p - 2 - begin));
    if (end - p < 2) damaged("no end-of-image marker (cut short?)");
    const size_t length = be16(p);
    if (length < 2 || length > (size_t)(end - p))
      damaged("segment " + hex(marker) + " runs past the end of the file (cut short?)");
    const uint8_t* s = p + 2;
    const size_t n = length - 2;
    p += length;
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      parse_frame(f, marker, s, n);
    } else if (marker == 0xC4) {
      parse_huffman(s, n, dc, ac);
    } else if (marker == 0xDB) {
      for (size_t at = 0; at < n;) {
        const bool wide = s[at] >> 4;
        if (at + 1 + (wide ? 128 : 64) > n) damaged("a quantization table segment shorter than its tables");
        dc_quant[s[at] & 3] = wide ? be16(s + at + 1) : s[at + 1];
        at += 1 + (wide ? 128 : 64);
      }
    } else if (marker == 0xDD) {
      if (n < 2) damaged("a restart interval segment without its interval");
      restart = be16(s);
    } else if (marker == 0xDA) {
      const Scan scan = parse_scan(f, s, n);
      if (f.checked) {
        for (size_t i = 0; i < scan.comps.size(); ++i)
          if (scan.dc[i] > 3 || scan.ac[i] > 3) damaged("a scan naming a Huffman table beyond the four");
        check_progression(f, scan);
      }
      p = walk_scan(f, scan, dc, ac, dc_quant, restart, ++scans, p, end);
    }
  }
  if (!f.seen) damaged("no frame header");
  if (scans == 0) damaged("no scan data");
  if (!f.checked) return;
  for (const Component& c : f.comps)
    for (int k = 0; k < (f.progressive ? 64 : 1); ++k)
      if (c.precision_left[k] != 0)
        damaged("its scans end before component " + std::to_string(c.id) + " is complete (cut short?)");
}

}  // namespace

std::string jpeg_damage(std::string_view bytes) {
  if (bytes.size() < 4 || (uint8_t)bytes[0] != 0xFF || (uint8_t)bytes[1] != 0xD8) return "no start-of-image marker";
  try {
    walk(bytes);
  } catch (const Damage& d) {
    return d.what;
  }
  return "";
}

// PNG chunks each end with a CRC-32 of their type and data, which stb does not check ("no CRC checking"): a flipped
// byte in compressed pixel data can still inflate, into wrong pixels.
std::string png_damage(std::string_view bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const uint8_t* const begin = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();
  if (size < 8 || bytes.substr(0, 8) != std::string_view("\x89PNG\r\n\x1A\n", 8)) return "no PNG signature";
  for (size_t at = 8;;) {
    if (size - at < 12) return "no IEND chunk (cut short?)";
    const uint64_t length = (uint64_t)be16(begin + at) << 16 | be16(begin + at + 2);
    const std::string type(bytes.substr(at + 4, 4));
    if (length > size - at - 12)
      return "chunk " + type + " at byte " + std::to_string(at) + " runs past the end of the file (cut short?)";
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = at + 4; i < at + 8 + length; ++i) crc = table[(crc ^ begin[i]) & 0xFF] ^ (crc >> 8);
    const uint8_t* stored = begin + at + 8 + length;
    if ((crc ^ 0xFFFFFFFFu) != ((uint32_t)be16(stored) << 16 | be16(stored + 2)))
      return "chunk " + type + " at byte " + std::to_string(at) + " fails its checksum (corrupt data)";
    if (type == "IEND") return "";
    at += 12 + length;
  }
}

}  // namespace sat
