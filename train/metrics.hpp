// Caption metrics, defined as the coco-caption toolkit computes them.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sat {

using Tokens = std::vector<std::string>;

// The words of a caption kept as words joined by spaces (a caption memory's, a PTB-tokenized text): the runs between
// spaces.
Tokens split_words(const std::string& text);

// BLEU-1..4 as coco-caption's BleuScorer (option "closest"): clipped n-gram counts summed over the corpus,
// one brevity penalty at corpus level from each image's closest reference length (ties to the shorter).
struct BleuResult {
  int64_t testlen = 0, reflen = 0;
  std::array<int64_t, 4> guess{}, correct{};
  std::array<double, 4> bleu{};
};
BleuResult corpus_bleu(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs);
// The same counts one image at a time (bleu left 0): summed (add_bleu_counts) over any multiset of images they give
// that multiset's corpus BLEU (bleu_from_counts), as a paired bootstrap resamples them.
std::vector<BleuResult> image_bleu_stats(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs);
void add_bleu_counts(BleuResult& total, const BleuResult& image);
BleuResult bleu_from_counts(BleuResult counts);  // counts summed; bleu[] filled in

// ROUGE-L as coco-caption's Rouge: per image, LCS against each reference, the best precision and the best
// recall combined with beta = 1.2; the mean over images.
double rouge_l(const Tokens& hyp, const std::vector<Tokens>& refs, double beta = 1.2);
double corpus_rouge_l(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs);

// CIDEr-D as coco-caption's CiderScorer: tf-idf n-gram vectors (n = 1..4) with document frequencies over the
// references of the set being scored, clipped hypothesis weights, a Gaussian length penalty (sigma = 6) on the
// bigram-count difference, averaged over references and n, times 10; the mean over images.
struct CiderResult {
  double score = 0;
  std::vector<double> per_image;
};
CiderResult corpus_cider_d(const std::vector<Tokens>& hyps, const std::vector<std::vector<Tokens>>& refs,
                           double sigma = 6.0);

// CIDEr-D of single captions against a fixed corpus: document frequencies come from the references of every image
// in `refs` (e.g. a whole training split), so a caption's score does not depend on what else is scored with it.
// The reward of self-critical training. Otherwise the same definition as corpus_cider_d (sigma, clipping, x10).
class CiderDScorer {
 public:
  // precomputed: every reference's tf-idf vector is built once (fast repeated scoring against few images, as in
  // self-critical training); on_demand: only the document frequencies (fast to build for a large corpus scored
  // against a few of its images at a time, as consensus reranking's caption memory is).
  enum class ReferenceVectors { precomputed, on_demand };
  explicit CiderDScorer(const std::vector<std::vector<Tokens>>& refs, double sigma = 6.0,
                        ReferenceVectors vectors = ReferenceVectors::precomputed);
  // The same from references given as words joined by single spaces (the caption memory's form): each word is
  // looked up as it is read, with no Tokens built (Flickr8k's 30 000 captions: half the time).
  struct SpaceJoined {
    const std::vector<std::vector<std::string>>& refs;
  };
  CiderDScorer(SpaceJoined refs, double sigma, ReferenceVectors vectors);
  ~CiderDScorer();
  CiderDScorer(const CiderDScorer&) = delete;
  CiderDScorer& operator=(const CiderDScorer&) = delete;
  int images() const;
  double score(const Tokens& hyp, int image) const;  // thread-safe
  // Against the references of several images pooled (the mean over all of them: consensus reranking's agreement
  // of a caption with its photo's neighbours' captions); thread-safe.
  double score(const Tokens& hyp, const std::vector<int>& images) const;
  // Several captions against the same pooled references (their vectors built once); thread-safe.
  std::vector<double> scores(const std::vector<Tokens>& hyps, const std::vector<int>& images) const;
  // The same, caption k left uncompared with the references of image leave_out[k] (-1: none; consensus reranking's
  // captions taken from a memory photo are not compared with that photo's own captions). 0 when nothing is left.
  std::vector<double> scores(const std::vector<Tokens>& hyps, const std::vector<int>& images,
                             const std::vector<int>& leave_out) const;

 private:
  struct Data;
  std::unique_ptr<Data> d_;
  template <typename Refs, typename InternOne>
  static void build(Data& data, const Refs& refs, InternOne intern_one, double sigma, ReferenceVectors vectors);
};

}  // namespace sat
