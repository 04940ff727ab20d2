#include "train/metrics.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <unordered_map>
#include <utility>

#include "datasets/io.hpp"

namespace sat {

Tokens split_words(const std::string& text) {
  Tokens out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ' ') ++j;
    if (j > i) out.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

namespace {

// Words are interned once; an n-gram key packs its order and up to four 15-bit word ids into 64 bits, so
// orders occupy disjoint ranges and keys are exact (caption vocabularies stay far below 32767 words).
struct NgramIndex {
  std::unordered_map<std::string, uint32_t> words;
  uint32_t id(const std::string& w) {
    auto it = words.find(w);  // emplace would build (and free) a node for every word already seen
    return it != words.end() ? it->second : words.emplace(w, (uint32_t)words.size() + 1).first->second;
  }
};
using Ngram = uint64_t;
struct NgramHash {
  size_t operator()(Ngram g) const { return (size_t)(g * 0x9E3779B97F4A7C15ull >> 7); }
};

Ngram pack(const uint32_t* w, int n) {
  Ngram g = (Ngram)n;
  for (int k = 0; k < n; ++k) g = (g << 15) | (w[k] & 0x7fff);
  return g;
}

std::vector<uint32_t> intern(NgramIndex& index, const Tokens& t) {
  std::vector<uint32_t> ids;
  ids.reserve(t.size());
  for (auto& w : t) ids.push_back(index.id(w));
  return ids;
}

// Counts of every n-gram (n = 1..4) in one map; the order is recoverable from the key.
std::unordered_map<Ngram, int, NgramHash> all_ngrams(const std::vector<uint32_t>& ids) {
  std::unordered_map<Ngram, int, NgramHash> c;
  for (int n = 1; n <= 4; ++n)
    for (int i = 0; i + n <= (int)ids.size(); ++i) c[pack(ids.data() + i, n)]++;
  return c;
}
int order_of(Ngram g) {
  int n = 0;
  while (g >= 0x8000) g >>= 15, ++n;  // strip word ids until only the order is left
  return (int)g;
}

}  // namespace

std::vector<BleuResult> image_bleu_stats(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs) {
  if (hyps.size() != refs.size()) throw Error("bleu: hypotheses and reference sets differ in number");
  std::vector<BleuResult> out(hyps.size());
  NgramIndex index;
  for (size_t i = 0; i < hyps.size(); ++i) {
    if (refs[i].empty()) throw Error("bleu: an image has no references");
    std::unordered_map<Ngram, int, NgramHash> maxcounts;
    for (auto& ref : refs[i])
      for (auto& [g, c] : all_ngrams(intern(index, ref))) {
        int& m = maxcounts[g];
        if (c > m) m = c;
      }
    const int testlen = (int)hyps[i].size();
    int best_len = -1, best_diff = 0;
    for (auto& ref : refs[i]) {  // closest reference length, ties to the shorter
      int l = (int)ref.size(), d = std::abs(l - testlen);
      if (best_len < 0 || d < best_diff || (d == best_diff && l < best_len)) best_len = l, best_diff = d;
    }
    BleuResult& r = out[i];
    r.testlen = testlen;
    r.reflen = best_len;
    for (int k = 0; k < 4; ++k) r.guess[k] = std::max(0, testlen - k);
    for (auto& [g, c] : all_ngrams(intern(index, hyps[i]))) {
      auto it = maxcounts.find(g);
      if (it != maxcounts.end()) r.correct[order_of(g) - 1] += std::min(c, it->second);
    }
  }
  if (index.words.size() >= 0x7fff) throw Error("bleu: more than 32766 distinct words");
  return out;
}

void add_bleu_counts(BleuResult& total, const BleuResult& image) {
  total.testlen += image.testlen;
  total.reflen += image.reflen;
  for (int k = 0; k < 4; ++k) total.guess[k] += image.guess[k], total.correct[k] += image.correct[k];
}

BleuResult bleu_from_counts(BleuResult r) {
  const double tiny = 1e-15, small = 1e-9;
  double bleu = 1;
  double ratio = (r.testlen + tiny) / (r.reflen + small);
  for (int k = 0; k < 4; ++k) {
    bleu *= (r.correct[k] + tiny) / (r.guess[k] + small);
    r.bleu[k] = std::pow(bleu, 1.0 / (k + 1));
    if (ratio < 1) r.bleu[k] *= std::exp(1 - 1 / ratio);
  }
  return r;
}

BleuResult corpus_bleu(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs) {
  BleuResult total;
  for (const BleuResult& image : image_bleu_stats(hyps, refs)) add_bleu_counts(total, image);
  return bleu_from_counts(total);
}

double rouge_l(const Tokens& hyp, const std::vector<Tokens>& refs, double beta) {
  if (refs.empty()) throw Error("rouge: an image has no references");
  double best_p = 0, best_r = 0;
  std::vector<int> prev, cur;
  for (auto& ref : refs) {
    // LCS length by dynamic programming over two rows.
    prev.assign(hyp.size() + 1, 0);
    cur.assign(hyp.size() + 1, 0);
    for (size_t i = 1; i <= ref.size(); ++i) {
      for (size_t j = 1; j <= hyp.size(); ++j)
        cur[j] = ref[i - 1] == hyp[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
      std::swap(prev, cur);
    }
    double lcs = prev[hyp.size()];
    if (!hyp.empty()) best_p = std::max(best_p, lcs / hyp.size());
    if (!ref.empty()) best_r = std::max(best_r, lcs / ref.size());
  }
  if (best_p == 0 || best_r == 0) return 0;
  return (1 + beta * beta) * best_p * best_r / (best_r + beta * beta * best_p);
}

double corpus_rouge_l(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs) {
  if (hyps.size() != refs.size()) throw Error("rouge: hypotheses and reference sets differ in number");
  if (hyps.empty()) return 0;
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(dynamic, 64)
  for (size_t i = 0; i < hyps.size(); ++i) sum += rouge_l(hyps[i], refs[i]);
  return sum / hyps.size();
}

namespace {

// A sentence's n-grams of one order as (key, value) sorted by key: similarities are merges, not lookups.
using SparseVec = std::vector<std::pair<Ngram, double>>;

std::array<SparseVec, 4> ngram_counts(const std::vector<uint32_t>& ids) {
  std::array<SparseVec, 4> out;
  std::vector<Ngram> keys;
  for (int n = 1; n <= 4; ++n) {
    keys.clear();
    for (int i = 0; i + n <= (int)ids.size(); ++i) keys.push_back(pack(ids.data() + i, n));
    std::sort(keys.begin(), keys.end());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (out[n - 1].empty() || out[n - 1].back().first != keys[i]) out[n - 1].push_back({keys[i], 0.0});
      out[n - 1].back().second += 1;
    }
  }
  return out;
}

struct TfIdf {
  std::array<SparseVec, 4> vec;
  std::array<double, 4> norm{};
  double length = 0;  // the toolkit's "length": the number of bigrams (its n == 1 branch)
};

// `df(g)`: in how many images' references n-gram g occurs.
template <class DocumentFrequency>
TfIdf to_vec(const std::array<SparseVec, 4>& counts, const DocumentFrequency& df, double log_ref_len) {
  TfIdf v;
  for (int n = 0; n < 4; ++n) {
    v.vec[n].reserve(counts[n].size());
    for (auto& [g, tf] : counts[n]) {
      double d = std::log(std::max(1.0, (double)df(g)));
      double w = tf * (log_ref_len - d);
      v.vec[n].push_back({g, w});
      v.norm[n] += w * w;
      if (n == 1) v.length += tf;
    }
    v.norm[n] = std::sqrt(v.norm[n]);
  }
  return v;
}

double cider_sim(const TfIdf& h, const TfIdf& r, double sigma) {
  double delta = h.length - r.length, total = 0;
  for (int n = 0; n < 4; ++n) {
    double val = 0;
    auto a = h.vec[n].begin(), b = r.vec[n].begin();
    while (a != h.vec[n].end() && b != r.vec[n].end()) {
      if (a->first < b->first)
        ++a;
      else if (b->first < a->first)
        ++b;
      else
        val += std::min(a->second, b->second) * b->second, ++a, ++b;
    }
    if (h.norm[n] != 0 && r.norm[n] != 0) val /= h.norm[n] * r.norm[n];
    total += val * std::exp(-(delta * delta) / (2 * sigma * sigma));
  }
  return total;
}

}  // namespace

CiderResult corpus_cider_d(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs,
                           double sigma) {
  if (hyps.size() != refs.size()) throw Error("cider: hypotheses and reference sets differ in number");
  CiderResult res;
  if (hyps.empty()) return res;
  NgramIndex index;
  std::vector<std::array<SparseVec, 4>> hyp_counts;
  std::vector<std::vector<std::array<SparseVec, 4>>> ref_counts(refs.size());
  std::unordered_map<Ngram, int, NgramHash> df;
  std::vector<Ngram> present;
  for (size_t i = 0; i < hyps.size(); ++i) {
    if (refs[i].empty()) throw Error("cider: an image has no references");
    hyp_counts.push_back(ngram_counts(intern(index, hyps[i])));
    present.clear();
    for (auto& r : refs[i]) {  // document frequency: in how many images' references an n-gram occurs
      ref_counts[i].push_back(ngram_counts(intern(index, r)));
      for (auto& c : ref_counts[i].back())
        for (auto& [g, n] : c) present.push_back(g);
    }
    std::sort(present.begin(), present.end());
    present.erase(std::unique(present.begin(), present.end()), present.end());
    for (Ngram g : present) df[g]++;
  }
  if (index.words.size() >= 0x7fff) throw Error("cider: more than 32766 distinct words");
  const double log_ref_len = std::log((double)refs.size());
  double sum = 0;
  res.per_image.resize(hyps.size());
  auto df_of = [&df](Ngram g) {
    auto it = df.find(g);
    return it == df.end() ? 0 : it->second;
  };
#pragma omp parallel for reduction(+ : sum) schedule(dynamic, 64)
  for (size_t i = 0; i < hyps.size(); ++i) {
    TfIdf h = to_vec(hyp_counts[i], df_of, log_ref_len);
    double s = 0;
    for (auto& rc : ref_counts[i]) s += cider_sim(h, to_vec(rc, df_of, log_ref_len), sigma);
    s = s / 4.0 / ref_counts[i].size() * 10.0;
    res.per_image[i] = s;
    sum += s;
  }
  res.score = sum / hyps.size();
  return res;
}

namespace {

// Sorts 64-bit keys by 11-bit digits (few enough buckets for the scatter to stay in cache), least significant
// first, skipping digits all keys share: the document frequencies of a large corpus (a million n-gram keys) are
// counted in a few linear passes.
void radix_sort(std::vector<Ngram>& keys) {
  constexpr int kBits = 11;
  constexpr Ngram kMask = (1u << kBits) - 1;
  std::vector<Ngram> buffer(keys.size());
  std::vector<size_t> start(size_t(1) << kBits);
  for (int shift = 0; shift < 64; shift += kBits) {
    std::fill(start.begin(), start.end(), 0);
    for (Ngram k : keys) ++start[(k >> shift) & kMask];
    if (std::find(start.begin(), start.end(), keys.size()) != start.end()) continue;  // one bucket: in order already
    size_t sum = 0;
    for (auto& c : start) sum += std::exchange(c, sum);
    for (Ngram k : keys) buffer[start[(k >> shift) & kMask]++] = k;
    keys.swap(buffer);
  }
}

// One image's distinct n-grams: an open-addressing set emptied by a new stamp for each image (sorting each image's
// couple of hundred n-grams to drop repeats took a quarter of a 30 000-caption memory's table).
class DistinctNgrams {
 public:
  // Empties the set, with room for `count` n-grams at most half full.
  void reset(size_t count) {
    size_t slots = 64;
    while (slots < 2 * count) slots *= 2;
    if (slots > keys_.size() || ++now_ == 0) {
      keys_.assign(std::max(slots, keys_.size()), 0);
      stamp_.assign(keys_.size(), 0);
      now_ = 1;
    }
    shift_ = 64;
    for (size_t s = keys_.size(); s > 1; s /= 2) --shift_;
  }
  bool insert(Ngram g) {  // true when g was not in the set
    const size_t mask = keys_.size() - 1;
    for (size_t h = (size_t)((g * 0x9E3779B97F4A7C15ull) >> shift_);; h = (h + 1) & mask) {
      if (stamp_[h] != now_) {
        stamp_[h] = now_, keys_[h] = g;
        return true;
      }
      if (keys_[h] == g) return false;
    }
  }

 private:
  std::vector<Ngram> keys_;
  std::vector<uint32_t> stamp_;
  uint32_t now_ = 0;
  int shift_ = 64;
};

}  // namespace

struct CiderDScorer::Data {
  NgramIndex index;
  // Document frequencies: every n-gram some reference has, sorted, and in how many images' references it occurs.
  std::vector<Ngram> df_keys;
  std::vector<uint32_t> df_counts;
  std::vector<std::vector<TfIdf>> refs;  // per image, per reference (precomputed)
  // On demand: every reference's word ids end to end; reference r is ids[ref_end[r-1], ref_end[r]), image i's
  // references are [image_end[i-1], image_end[i]).
  std::vector<uint32_t> ids, ref_end, image_end;
  double log_ref_len = 0, sigma = 6.0;

  uint32_t df(Ngram g) const {
    auto it = std::lower_bound(df_keys.begin(), df_keys.end(), g);
    return it != df_keys.end() && *it == g ? df_counts[it - df_keys.begin()] : 0;
  }
  TfIdf vector_of(const std::array<SparseVec, 4>& counts) const {
    return to_vec(
        counts, [this](Ngram g) { return df(g); }, log_ref_len);
  }

  // The pooled references' tf-idf vectors, in order.
  std::vector<const TfIdf*> pooled(const std::vector<int>& images, std::vector<TfIdf>& built) const {
    std::vector<const TfIdf*> out;
    if (image_end.empty()) {
      for (int image : images)
        for (auto& r : refs[image]) out.push_back(&r);
      return out;
    }
    built.clear();
    std::vector<uint32_t> one;
    for (int image : images)
      for (uint32_t r = image ? image_end[image - 1] : 0; r < image_end[image]; ++r) {
        one.assign(ids.begin() + (r ? ref_end[r - 1] : 0), ids.begin() + ref_end[r]);
        built.push_back(vector_of(ngram_counts(one)));
      }
    for (auto& v : built) out.push_back(&v);
    return out;
  }

  TfIdf hypothesis(const Tokens& hyp) const {
    // Words no reference uses get ids of their own above the corpus's (n-grams with them match nothing).
    std::vector<uint32_t> word_ids;
    std::unordered_map<std::string, uint32_t> unseen;
    for (auto& w : hyp) {
      auto it = index.words.find(w);
      if (it != index.words.end())
        word_ids.push_back(it->second);
      else
        word_ids.push_back(unseen.emplace(w, 0x7000u + (uint32_t)unseen.size()).first->second & 0x7fff);
    }
    return vector_of(ngram_counts(word_ids));
  }
};

CiderDScorer::CiderDScorer(const std::vector<std::vector<Tokens>>& refs, double sigma, ReferenceVectors vectors)
    : d_(std::make_unique<Data>()) {
  build(
      *d_, refs, [](NgramIndex& index, const Tokens& r) { return intern(index, r); }, sigma, vectors);
}

CiderDScorer::CiderDScorer(SpaceJoined refs, double sigma, ReferenceVectors vectors) : d_(std::make_unique<Data>()) {
  std::string word;  // reused: no allocation per word
  auto intern_joined = [&word](NgramIndex& index, const std::string& text) {
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < text.size();) {  // split_words' rule: words are the runs between spaces
      while (i < text.size() && text[i] == ' ') ++i;
      size_t j = i;
      while (j < text.size() && text[j] != ' ') ++j;
      if (j > i) word.assign(text, i, j - i), ids.push_back(index.id(word));
      i = j;
    }
    return ids;
  };
  build(*d_, refs.refs, intern_joined, sigma, vectors);
}

// refs[i]: image i's references, each turned into word ids by intern_one(index, reference).
template <typename Refs, typename InternOne>
void CiderDScorer::build(Data& data, const Refs& refs, InternOne intern_one, double sigma, ReferenceVectors vectors) {
  if (refs.empty()) throw Error("cider: no reference images");
  data.sigma = sigma;
  const bool keep = vectors == ReferenceVectors::precomputed;
  std::vector<std::vector<std::array<SparseVec, 4>>> counts(keep ? refs.size() : 0);
  std::vector<Ngram> present, all;  // one image's n-grams; every image's distinct ones, end to end
  DistinctNgrams distinct;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].empty()) throw Error("cider: an image has no references");
    present.clear();
    for (auto& r : refs[i]) {
      std::vector<uint32_t> ids = intern_one(data.index, r);
      for (int n = 1; n <= 4; ++n)
        for (int k = 0; k + n <= (int)ids.size(); ++k) present.push_back(pack(ids.data() + k, n));
      if (keep) {
        counts[i].push_back(ngram_counts(ids));
      } else {
        data.ids.insert(data.ids.end(), ids.begin(), ids.end());
        data.ref_end.push_back((uint32_t)data.ids.size());
      }
    }
    if (!keep) data.image_end.push_back((uint32_t)data.ref_end.size());
    distinct.reset(present.size());
    for (Ngram g : present)
      if (distinct.insert(g)) all.push_back(g);
  }
  if (data.index.words.size() >= 0x7000) throw Error("cider: more than 28671 distinct reference words");
  radix_sort(all);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i == 0 || all[i] != all[i - 1]) data.df_keys.push_back(all[i]), data.df_counts.push_back(0);
    ++data.df_counts.back();
  }
  data.log_ref_len = std::log((double)refs.size());
  if (!keep) return;
  data.refs.resize(refs.size());
  for (size_t i = 0; i < refs.size(); ++i)
    for (auto& c : counts[i]) data.refs[i].push_back(data.vector_of(c));
}

CiderDScorer::~CiderDScorer() = default;

int CiderDScorer::images() const {
  return (int)(d_->image_end.empty() ? d_->refs.size() : d_->image_end.size());
}

double CiderDScorer::score(const Tokens& hyp, int image) const {
  return score(hyp, std::vector<int>{image});
}

double CiderDScorer::score(const Tokens& hyp, const std::vector<int>& images_pooled) const {
  return scores({hyp}, images_pooled)[0];
}

std::vector<double> CiderDScorer::scores(const std::vector<Tokens>& hyps, const std::vector<int>& images_pooled) const {
  return scores(hyps, images_pooled, std::vector<int>(hyps.size(), -1));
}

std::vector<double> CiderDScorer::scores(const std::vector<Tokens>& hyps, const std::vector<int>& images_pooled,
                                         const std::vector<int>& leave_out) const {
  if (images_pooled.empty()) throw Error("cider: no reference images to score against");
  if (leave_out.size() != hyps.size()) throw Error("cider: one leave-out image per caption expected");
  for (int image : images_pooled)
    if (image < 0 || image >= images()) throw Error("cider: image index out of range");
  std::vector<TfIdf> built;
  const std::vector<const TfIdf*> refs = d_->pooled(images_pooled, built);
  // Which pooled image each reference came from (in pooled()'s order).
  std::vector<int> owner;
  owner.reserve(refs.size());
  for (int image : images_pooled) {
    const size_t n =
        d_->image_end.empty() ? d_->refs[image].size() : d_->image_end[image] - (image ? d_->image_end[image - 1] : 0);
    owner.insert(owner.end(), n, image);
  }
  std::vector<double> out;
  out.reserve(hyps.size());
  for (size_t k = 0; k < hyps.size(); ++k) {
    TfIdf h = d_->hypothesis(hyps[k]);
    double s = 0;
    size_t used = 0;
    for (size_t r = 0; r < refs.size(); ++r) {
      if (owner[r] == leave_out[k]) continue;
      s += cider_sim(h, *refs[r], d_->sigma);
      ++used;
    }
    out.push_back(used ? s / 4.0 / used * 10.0 : 0.0);
  }
  return out;
}

}  // namespace sat
