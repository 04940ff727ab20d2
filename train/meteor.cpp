#include "train/meteor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <libstemmer.h>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "datasets/io.hpp"

namespace sat {

namespace {

// Common English function words (articles, pronouns, prepositions, conjunctions, auxiliaries, quantifiers).
// Meteor ships its own list; this one is written here, so the content/function split is approximate.
const char* kFunctionWords[] = {
    "a",         "an",       "the",      "this",     "that",       "these",      "those",    "some",    "any",
    "each",      "every",    "either",   "neither",  "no",         "all",        "both",     "few",     "many",
    "much",      "more",     "most",     "other",    "another",    "such",       "what",     "which",   "whose",
    "who",       "whom",     "i",        "me",       "my",         "mine",       "myself",   "you",     "your",
    "yours",     "yourself", "he",       "him",      "his",        "himself",    "she",      "her",     "hers",
    "herself",   "it",       "its",      "itself",   "we",         "us",         "our",      "ours",    "ourselves",
    "they",      "them",     "their",    "theirs",   "themselves", "one",        "ones",     "there",   "here",
    "where",     "when",     "why",      "how",      "about",      "above",      "across",   "after",   "against",
    "along",     "among",    "around",   "as",       "at",         "before",     "behind",   "below",   "beneath",
    "beside",    "besides",  "between",  "beyond",   "by",         "down",       "during",   "except",  "for",
    "from",      "in",       "inside",   "into",     "like",       "near",       "of",       "off",     "on",
    "onto",      "out",      "outside",  "over",     "past",       "per",        "since",    "through", "throughout",
    "till",      "to",       "toward",   "towards",  "under",      "underneath", "until",    "up",      "upon",
    "via",       "with",     "within",   "without",  "and",        "but",        "or",       "nor",     "so",
    "yet",       "if",       "then",     "than",     "because",    "while",      "although", "though",  "whether",
    "unless",    "once",     "be",       "am",       "is",         "are",        "was",      "were",    "been",
    "being",     "have",     "has",      "had",      "having",     "do",         "does",     "did",     "doing",
    "will",      "would",    "shall",    "should",   "can",        "could",      "may",      "might",   "must",
    "ought",     "'s",       "'re",      "'m",       "'ve",        "'ll",        "'d",       "n't",     "not",
    "very",      "too",      "also",     "just",     "only",       "even",       "still",    "again",   "ever",
    "never",     "now",      "just",     "quite",    "rather",     "almost",     "own",      "same",    "whatever",
    "whichever", "whoever",  "whenever", "wherever", "however"};

enum Pos { kNoun, kVerb, kAdj, kAdv };
const char* kPosName[] = {"noun", "verb", "adj", "adv"};

struct WordNet {
  std::unordered_map<std::string, std::vector<uint32_t>> synsets[4];  // lemma -> synset ids
  std::unordered_map<std::string, std::vector<std::string>> exceptions[4];
  bool loaded = false;
  std::string error;

  void load(const std::string& dir) {
    for (int p = 0; p < 4; ++p) {
      std::string path = join_path(dir, std::string("index.") + kPosName[p]);
      std::ifstream in(path);
      if (!in) {
        error = path + ": cannot open (install wordnet-base, or set SAT_WORDNET_DIR)";
        return;
      }
      std::string line;
      while (std::getline(in, line)) {
        if (line.empty() || line[0] == ' ') continue;  // licence header
        std::istringstream ss(line);
        std::string lemma, pos;
        int synset_cnt = 0, p_cnt = 0;
        ss >> lemma >> pos >> synset_cnt >> p_cnt;
        std::string skip;
        for (int k = 0; k < p_cnt; ++k) ss >> skip;
        int sense_cnt, tagsense_cnt;
        ss >> sense_cnt >> tagsense_cnt;
        auto& ids = synsets[p][lemma];
        for (int k = 0; k < synset_cnt; ++k) {
          uint32_t off = 0;
          if (ss >> off) ids.push_back((uint32_t)p << 28 | off);
        }
      }
      std::ifstream exc(join_path(dir, std::string(kPosName[p]) + ".exc"));
      while (std::getline(exc, line)) {
        std::istringstream ss(line);
        std::string inflected, base;
        ss >> inflected;
        while (ss >> base) exceptions[p][inflected].push_back(base);
      }
    }
    loaded = true;
  }

  // WordNet's morphy: exception lists, then suffix detachment, keeping forms the index knows.
  void base_forms(const std::string& w, int p, std::vector<std::string>& out) const {
    static const std::vector<std::pair<std::string, std::string>> rules[4] = {
        {{"s", ""},
         {"ses", "s"},
         {"xes", "x"},
         {"zes", "z"},
         {"ches", "ch"},
         {"shes", "sh"},
         {"men", "man"},
         {"ies", "y"}},
        {{"s", ""}, {"ies", "y"}, {"es", "e"}, {"es", ""}, {"ed", "e"}, {"ed", ""}, {"ing", "e"}, {"ing", ""}},
        {{"er", ""}, {"est", ""}, {"er", "e"}, {"est", "e"}},
        {}};
    if (synsets[p].count(w)) out.push_back(w);
    auto ex = exceptions[p].find(w);
    if (ex != exceptions[p].end())
      for (auto& b : ex->second) out.push_back(b);
    for (auto& [suffix, repl] : rules[p]) {
      if (w.size() > suffix.size() && w.compare(w.size() - suffix.size(), suffix.size(), suffix) == 0) {
        std::string b = w.substr(0, w.size() - suffix.size()) + repl;
        if (synsets[p].count(b)) out.push_back(b);
      }
    }
  }

  std::vector<uint32_t> synsets_of(const std::string& w) const {
    std::vector<uint32_t> ids;
    std::vector<std::string> forms;
    for (int p = 0; p < 4; ++p) {
      forms.clear();
      base_forms(w, p, forms);
      for (auto& f : forms) {
        auto it = synsets[p].find(f);
        if (it != synsets[p].end()) ids.insert(ids.end(), it->second.begin(), it->second.end());
      }
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  }
};

const WordNet& wordnet() {
  static WordNet wn;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("SAT_WORDNET_DIR");
    wn.load(env ? env : "/usr/share/wordnet");
  });
  return wn;
}

const std::unordered_set<std::string>& function_words() {
  static const std::unordered_set<std::string> words(std::begin(kFunctionWords), std::end(kFunctionWords));
  return words;
}

std::string stem(const std::string& w) {
  // One stemmer per thread: libstemmer instances are not thread-safe.
  thread_local struct Holder {
    sb_stemmer* s = sb_stemmer_new("english", nullptr);
    ~Holder() {
      if (s) sb_stemmer_delete(s);
    }
  } holder;
  if (!holder.s) throw Error("METEOR: the Snowball English stemmer is not available");
  const sb_symbol* out = sb_stemmer_stem(holder.s, (const sb_symbol*)w.data(), (int)w.size());
  return std::string((const char*)out, sb_stemmer_length(holder.s));
}

// Stems and synsets per distinct word, cached per thread: a corpus repeats its words many times.
struct WordInfo {
  std::string stem;
  std::vector<uint32_t> synsets;
};
const WordInfo& word_info(const std::string& w) {
  thread_local std::unordered_map<std::string, WordInfo> cache;
  auto it = cache.find(w);
  if (it != cache.end()) return it->second;
  if (cache.size() > 200000) cache.clear();  // bounded memory on huge corpora
  return cache.emplace(w, WordInfo{stem(w), wordnet().synsets_of(w)}).first->second;
}

bool share_synset(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) return true;
    if (a[i] < b[j])
      ++i;
    else
      ++j;
  }
  return false;
}

}  // namespace

bool meteor_available(std::string* why) {
  const WordNet& wn = wordnet();
  if (!wn.loaded && why) *why = wn.error;
  return wn.loaded;
}

double MeteorStats::score(const MeteorParams& p) const {
  double tw = 0, rw = 0;
  for (int s = 0; s < 3; ++s) {
    tw += p.weights[s] * (p.delta * test_content[s] + (1 - p.delta) * test_function[s]);
    rw += p.weights[s] * (p.delta * ref_content[s] + (1 - p.delta) * ref_function[s]);
  }
  double tlen = p.delta * (test_len - test_func) + (1 - p.delta) * test_func;
  double rlen = p.delta * (ref_len - ref_func) + (1 - p.delta) * ref_func;
  double precision = tw / tlen, recall = rw / rlen;
  double fmean = 1.0 / ((1 - p.alpha) / precision + p.alpha / recall);
  double test_total = 0, ref_total = 0;
  for (int s = 0; s < 3; ++s)
    test_total += test_content[s] + test_function[s], ref_total += ref_content[s] + ref_function[s];
  double frag = (test_total == test_len && ref_total == ref_len && chunks == 1)
                    ? 0.0
                    : chunks / ((test_word_matches + ref_word_matches) / 2);
  double score = fmean * (1 - p.gamma * std::pow(frag, p.beta));
  return std::isnan(score) ? 0.0 : std::max(score, 0.0);
}

void MeteorStats::add(const MeteorStats& o) {
  test_len += o.test_len, ref_len += o.ref_len, test_func += o.test_func, ref_func += o.ref_func;
  for (int s = 0; s < 3; ++s) {
    test_content[s] += o.test_content[s], ref_content[s] += o.ref_content[s];
    test_function[s] += o.test_function[s], ref_function[s] += o.ref_function[s];
  }
  test_word_matches += o.test_word_matches, ref_word_matches += o.ref_word_matches, chunks += o.chunks;
}

MeteorStats meteor_stats(const Tokens& hyp, const Tokens& ref) {
  const int n = (int)hyp.size(), m = (int)ref.size();
  std::vector<int> match_h(n, -1), match_r(m, -1), stage_h(n, -1);
  // Stage by stage (exact, stem, synonym), over the words still unmatched: first the longest order-preserving
  // set of pairs (so matches form few chunks), then any remaining pairs.
  std::vector<const WordInfo*> hi(n), ri(m);
  for (int i = 0; i < n; ++i) hi[i] = &word_info(hyp[i]);
  for (int j = 0; j < m; ++j) ri[j] = &word_info(ref[j]);
  for (int stage = 0; stage < 3; ++stage) {
    auto same = [&](int i, int j) {
      if (match_h[i] >= 0 || match_r[j] >= 0) return false;
      if (stage == 0) return hyp[i] == ref[j];
      if (stage == 1) return hi[i]->stem == ri[j]->stem;
      return hyp[i] != ref[j] && share_synset(hi[i]->synsets, ri[j]->synsets);
    };
    std::vector<std::vector<int>> L(n + 1, std::vector<int>(m + 1, 0));
    for (int i = n - 1; i >= 0; --i)
      for (int j = m - 1; j >= 0; --j) L[i][j] = same(i, j) ? L[i + 1][j + 1] + 1 : std::max(L[i + 1][j], L[i][j + 1]);
    std::vector<std::pair<int, int>> picked;
    for (int i = 0, j = 0; i < n && j < m;) {
      if (same(i, j) && L[i][j] == L[i + 1][j + 1] + 1)
        picked.push_back({i, j}), ++i, ++j;
      else if (L[i + 1][j] >= L[i][j + 1])
        ++i;
      else
        ++j;
    }
    for (auto [i, j] : picked) match_h[i] = j, match_r[j] = i, stage_h[i] = stage;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < m && match_h[i] < 0; ++j)
        if (same(i, j)) match_h[i] = j, match_r[j] = i, stage_h[i] = stage;
  }
  const auto& fw = function_words();
  MeteorStats s;
  s.test_len = n, s.ref_len = m;
  for (auto& w : hyp) s.test_func += fw.count(w);
  for (auto& w : ref) s.ref_func += fw.count(w);
  for (int i = 0; i < n; ++i) {
    if (match_h[i] < 0) continue;
    int j = match_h[i], st = stage_h[i];
    (fw.count(hyp[i]) ? s.test_function : s.test_content)[st] += 1;
    (fw.count(ref[j]) ? s.ref_function : s.ref_content)[st] += 1;
    s.test_word_matches += 1, s.ref_word_matches += 1;
    // a chunk starts unless the previous hypothesis word is matched to the previous reference word
    if (!(i > 0 && match_h[i - 1] >= 0 && match_h[i - 1] == j - 1)) s.chunks += 1;
  }
  return s;
}

std::vector<MeteorStats> image_meteor_stats(const std::vector<Tokens>& hyps,
                                            const std::vector<std::vector<Tokens>>& refs, const MeteorParams& p) {
  std::string why;
  if (!meteor_available(&why)) throw Error("METEOR: " + why);
  if (hyps.size() != refs.size()) throw Error("METEOR: hypotheses and reference sets differ in number");
  std::vector<MeteorStats> best(hyps.size());
#pragma omp parallel for schedule(dynamic, 32)
  for (size_t i = 0; i < hyps.size(); ++i) {
    double best_score = -1;
    for (auto& r : refs[i]) {
      MeteorStats s = meteor_stats(hyps[i], r);
      double sc = s.score(p);
      if (sc > best_score) best_score = sc, best[i] = s;
    }
  }
  return best;
}

double corpus_meteor(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs,
                     const MeteorParams& p) {
  MeteorStats total;
  for (auto& s : image_meteor_stats(hyps, refs, p)) total.add(s);
  return total.score(p);
}

}  // namespace sat
