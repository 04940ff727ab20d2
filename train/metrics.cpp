#include "train/metrics.hpp"

#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "datasets/io.hpp"

namespace sat {

namespace {
using NgramCounts = std::unordered_map<std::string, int>;

NgramCounts count_ngrams(const Tokens& words, int n) {
  NgramCounts c;
  for (int k = 1; k <= n; ++k)
    for (int i = 0; i + k <= (int)words.size(); ++i) {
      std::string key = words[i];
      for (int j = 1; j < k; ++j) key += ' ' + words[i + j];
      c[key]++;
    }
  return c;
}
int ngram_order(const std::string& key) {
  int n = 1;
  for (char ch : key) n += ch == ' ';
  return n;
}
}  // namespace

BleuResult corpus_bleu(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs) {
  if (hyps.size() != refs.size()) throw Error("bleu: hypotheses and reference sets differ in number");
  BleuResult r;
  for (size_t i = 0; i < hyps.size(); ++i) {
    if (refs[i].empty()) throw Error("bleu: an image has no references");
    NgramCounts maxcounts;
    for (auto& ref : refs[i])
      for (auto& [g, c] : count_ngrams(ref, 4)) {
        int& m = maxcounts[g];
        if (c > m) m = c;
      }
    const int testlen = (int)hyps[i].size();
    int best_len = -1, best_diff = 0;
    for (auto& ref : refs[i]) {  // closest reference length, ties to the shorter
      int l = (int)ref.size(), d = std::abs(l - testlen);
      if (best_len < 0 || d < best_diff || (d == best_diff && l < best_len)) best_len = l, best_diff = d;
    }
    r.testlen += testlen;
    r.reflen += best_len;
    for (int k = 0; k < 4; ++k) r.guess[k] += std::max(0, testlen - k);
    for (auto& [g, c] : count_ngrams(hyps[i], 4)) {
      auto it = maxcounts.find(g);
      if (it != maxcounts.end()) r.correct[ngram_order(g) - 1] += std::min(c, it->second);
    }
  }
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

}  // namespace sat
