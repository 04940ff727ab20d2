#include "train/consensus.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "datasets/json_checks.hpp"
#include "train/object_mentions.hpp"
#include "train/ptb_tokenizer.hpp"

namespace sat {

std::string memory_caption(const std::string& raw) {
  return ptb_tokenize_joined(raw);
}

namespace {

// The length of the well-formed UTF-8 sequence at p (its lead byte at least 0x80; Unicode's table 3-7: no overlong
// forms, no surrogates, nothing beyond U+10FFFF), or 0.
int utf8_sequence(const char* p, const char* end) {
  const auto b = [&](int i) { return (unsigned)(unsigned char)p[i]; };
  const unsigned lead = b(0);
  int n;
  unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF)
    n = 2;
  else if (lead == 0xE0)
    n = 3, lo = 0xA0;
  else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF)
    n = 3;
  else if (lead == 0xED)
    n = 3, hi = 0x9F;
  else if (lead == 0xF0)
    n = 4, lo = 0x90;
  else if (lead >= 0xF1 && lead <= 0xF3)
    n = 4;
  else if (lead == 0xF4)
    n = 4, hi = 0x8F;
  else
    return 0;
  if (end - p < n || b(1) < lo || b(1) > hi) return 0;
  for (int i = 2; i < n; ++i)
    if (b(i) < 0x80 || b(i) > 0xBF) return 0;
  return n;
}

// The fast path: false when the text is not in dump()'s compact form (the caller then parses it fully).
bool parse_caption_lists_compact(const std::string& text, std::vector<std::vector<std::string>>& out) {
  const char* p = text.data();
  const char* const end = p + text.size();
  auto string_at = [&](std::string& s) {  // p at the opening quote; leaves p after the closing one
    ++p;
    while (true) {
      const char* run = p;
      while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) {
        if ((unsigned char)*p < 0x80) {
          ++p;
          continue;
        }
        const int n = utf8_sequence(p, end);  // the JSON parser refuses ill-formed UTF-8: so do we
        if (n == 0) return false;
        p += n;
      }
      s.append(run, p);
      if (p >= end || (unsigned char)*p < 0x20) return false;
      if (*p == '"') return ++p, true;
      if (++p >= end) return false;  // a backslash
      const char e = *p++;
      switch (e) {
        case '"':
          s += '"';
          break;
        case '\\':
          s += '\\';
          break;
        case '/':
          s += '/';
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'n':
          s += '\n';
          break;
        case 'r':
          s += '\r';
          break;
        case 't':
          s += '\t';
          break;
        case 'u': {
          if (end - p < 4) return false;
          int32_t cp = json_hex4(p);
          p += 4;
          if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return false;
            const int32_t low = json_hex4(p + 2);
            if (low < 0xDC00 || low > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            p += 6;
          }
          append_utf8(s, (uint32_t)cp);
          break;
        }
        default:
          return false;
      }
    }
  };
  if (p >= end || *p++ != '[') return false;
  if (p < end && *p == ']') return ++p, p == end;
  while (true) {
    if (p >= end || *p++ != '[') return false;
    std::vector<std::string>& list = out.emplace_back();
    if (p < end && *p == ']') {
      ++p;
    } else {
      while (true) {
        if (p >= end || *p != '"') return false;
        if (!string_at(list.emplace_back())) return false;
        if (p >= end) return false;
        if (*p == ',') {
          ++p;
          continue;
        }
        if (*p++ != ']') return false;
        break;
      }
    }
    if (p >= end) return false;
    if (*p == ',') {
      ++p;
      continue;
    }
    if (*p++ != ']') return false;
    return p == end;
  }
}

}  // namespace

std::vector<std::vector<std::string>> parse_caption_lists(const std::string& json_text) {
  std::vector<std::vector<std::string>> out;
  if (parse_caption_lists_compact(json_text, out)) return out;
  // Not dump()'s compact form (or not valid JSON at all): the full parser reads it or says what is wrong.
  return nlohmann::json::parse(json_text).get<std::vector<std::vector<std::string>>>();
}

Mat CaptionMemory::key_vectors(const Mat& F, int N) const {
  Mat out = pooled_grid_vectors(F, N, pooling);
  if (object_channels < 0 || object_channels > out.cols())
    throw Error("caption memory: " + std::to_string(object_channels) + " object channels in a grid of " +
                std::to_string(out.cols()));
  if (object_weight != 1.f) out.rightCols(object_channels) *= object_weight;
  return projected() ? projected_keys(std::move(out)) : out;
}

Mat CaptionMemory::projected_keys(Mat pooled) const {
  if (!projected()) return pooled;
  if (pooled.cols() != projection.map.rows())
    throw Error("caption memory: a key of " + std::to_string(pooled.cols()) + " values for a projection from " +
                std::to_string(projection.map.rows()));
  for (int64_t i = 0; i < pooled.rows(); ++i) {
    const float norm = pooled.row(i).norm();
    if (norm > 0) pooled.row(i) /= norm;  // as the memory's own keys were, before it learned the projection
  }
  pooled.rowwise() -= projection.center;
  return pooled * projection.map;
}

void CaptionMemory::check_grid(int D, const std::string& source) const {
  if (projected()) {
    if (projection.map.rows() != D || projection.center.size() != D)
      fail(source, "caption memory's key projection is from " + std::to_string(projection.map.rows()) +
                       " values (its centre " + std::to_string(projection.center.size()) + "), the model's grid has " +
                       std::to_string(D));
    if (keys.cols() != projection.map.cols())
      fail(source, "caption memory vectors have " + std::to_string(keys.cols()) + " values, its key projection " +
                       std::to_string(projection.map.cols()));
  } else if (keys.cols() != D) {
    fail(source, "caption memory vectors have " + std::to_string(keys.cols()) + " values, the model's grid has " +
                     std::to_string(D));
  }
  if (object_channels < 0 || object_channels > D)
    fail(source, "caption memory keys weight " + std::to_string(object_channels) + " object channels of a grid of " +
                     std::to_string(D));
}

void CaptionMemory::prepare(int D, const std::string& source) {
  if (keys.rows() == 0) fail(source, "caption memory holds no photos");
  check_grid(D, source);
  if (projected()) {
    if (!projection.map.allFinite() || !projection.center.allFinite())
      fail(source, "caption memory's key projection holds a value that is not a finite number");
    if (const std::string problem = word_side_problem(projection); !problem.empty())
      fail(source, "caption memory's key projection: " + problem);
  }
  if (!(object_weight >= 0 && object_weight <= kMaxKeyObjectWeight))
    fail(source, "caption memory's object weight must be in [0, " + std::to_string((int)kMaxKeyObjectWeight) +
                     "], got " + std::to_string(object_weight));
  if ((int64_t)captions.size() != keys.rows())
    fail(source, "caption memory has " + std::to_string(keys.rows()) + " photos but " +
                     std::to_string(captions.size()) + " caption lists");
  for (size_t i = 0; i < captions.size(); ++i) {
    if (captions[i].empty()) fail(source, "caption memory photo " + std::to_string(i) + " has no captions");
    const double norm = keys.row((int64_t)i).norm();
    if (!(std::abs(norm - 1.0) < 1e-2))  // float16 storage rounds a unit vector to within ~1e-3
      fail(source,
           "caption memory vector " + std::to_string(i) + " is not of unit length (" + std::to_string(norm) + ")");
    for (auto& c : captions[i])
      if (c.find_first_not_of(' ') == std::string::npos)  // no word: split_words would give none
        fail(source, "caption memory photo " + std::to_string(i) + " has an empty caption");
  }
  source_ = source;
  // The thread reads its own copy of the captions: the memory may be copied or moved while it runs.
  cider_ = std::async(std::launch::async, [captions = captions]() -> std::shared_ptr<const CiderDScorer> {
             return std::make_shared<const CiderDScorer>(CiderDScorer::SpaceJoined{captions}, 6.0,
                                                         CiderDScorer::ReferenceVectors::on_demand);
           }).share();
}

const CiderDScorer& CaptionMemory::scorer() const {
  if (!cider_.valid()) throw Error("caption memory used before prepare()");
  try {
    return *cider_.get();
  } catch (const Error& e) {
    fail(source_, std::string("caption memory: ") + e.what());
  }
}

void CaptionMemory::ready() const {
  scorer();
}

std::vector<int> CaptionMemory::nearest(const float* key, int k) const {
  const int64_t D = keys.cols();
  Eigen::Map<const Eigen::VectorXf> q(key, D);
  Eigen::VectorXf cosine = keys * q;  // the query's length does not change the order
  std::vector<int> order(cosine.size());
  std::iota(order.begin(), order.end(), 0);
  k = std::max(0, std::min(k, (int)order.size()));
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    if (cosine[a] != cosine[b]) return cosine[a] > cosine[b];
    return a < b;
  });
  order.resize(k);
  return order;
}

double CaptionMemory::agreement(const Tokens& words, const std::vector<int>& photos) const {
  return agreements({words}, photos)[0];
}

std::vector<double> CaptionMemory::agreements(const std::vector<Tokens>& words, const std::vector<int>& photos) const {
  return scorer().scores(words, photos);
}

std::vector<double> CaptionMemory::agreements(const std::vector<Tokens>& words, const std::vector<int>& photos,
                                              const std::vector<int>& leave_out) const {
  return scorer().scores(words, photos, leave_out);
}

std::vector<Tokens> CaptionMemory::caption_words(int photo) const {
  if (photo < 0 || photo >= (int)captions.size()) throw Error("caption memory: no photo " + std::to_string(photo));
  std::vector<Tokens> out;
  for (auto& c : captions[photo]) out.push_back(split_words(c));
  return out;
}

std::vector<double> CaptionMemory::object_shares(const std::vector<int>& photos) const {
  std::vector<double> shares(object_groups().size(), 0.0);
  int captions_seen = 0;
  for (int p : photos)
    for (const Tokens& words : caption_words(p)) {
      const std::vector<bool> named = objects_named(words);
      for (size_t g = 0; g < named.size(); ++g) shares[g] += named[g];
      ++captions_seen;
    }
  if (captions_seen > 0)
    for (double& s : shares) s /= captions_seen;
  return shares;
}

Mat mean_grid_vectors(const Mat& F, int N) {
  return pooled_grid_vectors(F, N, KeyPooling::mean);
}

Mat pooled_grid_vectors(const Mat& F, int N, KeyPooling pooling) {
  if (N <= 0 || F.rows() % N != 0) throw Error("pooled_grid_vectors: the grid rows do not split into the images");
  const int64_t L = F.rows() / N;
  Mat out(N, F.cols());
  for (int i = 0; i < N; ++i) {
    const auto grid = F.middleRows(i * L, L);
    switch (pooling) {
      case KeyPooling::mean:
        out.row(i) = grid.colwise().mean();
        break;
      case KeyPooling::max:
        out.row(i) = grid.colwise().maxCoeff();
        break;
      case KeyPooling::gem:
        out.row(i) = grid.cwiseMax(0.0f).array().cube().matrix().colwise().mean().array().pow(1.0f / 3.0f).matrix();
        break;
    }
  }
  return out;
}

const char* key_pooling_name(KeyPooling pooling) {
  switch (pooling) {
    case KeyPooling::max:
      return "max";
    case KeyPooling::gem:
      return "gem";
    default:
      return "mean";
  }
}

KeyPooling parse_key_pooling(const std::string& name) {
  if (name == "mean") return KeyPooling::mean;
  if (name == "max") return KeyPooling::max;
  if (name == "gem") return KeyPooling::gem;
  throw Error("key pooling must be mean, max or gem, got '" + name + "'");
}

int choose_by_consensus(const std::vector<Hypothesis>& candidates, const std::vector<Tokens>& words,
                        const CaptionMemory& memory, const float* key, const ConsensusSettings& settings,
                        std::vector<double>* agreements) {
  if (candidates.empty()) throw Error("consensus: no candidate captions");
  if (words.size() != candidates.size()) throw Error("consensus: one word list per candidate expected");
  if (agreements) agreements->assign(candidates.size(), 0.0);
  if (settings.weight == 0 || (candidates.size() == 1 && !agreements)) return 0;
  const std::vector<int> photos = memory.nearest(key, settings.neighbours);
  const std::vector<double> agree = memory.agreements(words, photos);
  if (agreements) *agreements = agree;
  std::vector<double> scores;
  for (auto& h : candidates) scores.push_back(h.score);
  return best_total(consensus_totals(scores, agree, settings.weight));
}

std::vector<double> consensus_totals(const std::vector<double>& scores, const std::vector<double>& agreements,
                                     double weight) {
  if (scores.size() != agreements.size()) throw Error("consensus: one agreement per candidate expected");
  std::vector<double> totals(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) totals[i] = scores[i] + weight * agreements[i];
  return totals;
}

int best_total(const std::vector<double>& totals) {
  if (totals.empty()) throw Error("consensus: no candidate captions");
  return (int)(std::max_element(totals.begin(), totals.end()) - totals.begin());  // the first of equals
}

}  // namespace sat
