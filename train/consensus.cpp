#include "train/consensus.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "train/ptb_tokenizer.hpp"

namespace sat {

namespace {
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
}  // namespace

std::string memory_caption(const std::string& raw) { return ptb_tokenize_joined(raw); }

void CaptionMemory::prepare(int D, const std::string& source) {
  if (keys.rows() == 0) fail(source, "caption memory holds no photos");
  if (keys.cols() != D)
    fail(source, "caption memory vectors have " + std::to_string(keys.cols()) + " values, the model's grid has " +
                     std::to_string(D));
  if ((int64_t)captions.size() != keys.rows())
    fail(source, "caption memory has " + std::to_string(keys.rows()) + " photos but " +
                     std::to_string(captions.size()) + " caption lists");
  for (size_t i = 0; i < captions.size(); ++i) {
    if (captions[i].empty()) fail(source, "caption memory photo " + std::to_string(i) + " has no captions");
    const double norm = keys.row((int64_t)i).norm();
    if (!(std::abs(norm - 1.0) < 1e-2))  // float16 storage rounds a unit vector to within ~1e-3
      fail(source, "caption memory vector " + std::to_string(i) + " is not of unit length (" + std::to_string(norm) + ")");
    for (auto& c : captions[i])
      if (c.find_first_not_of(' ') == std::string::npos)  // no word: split_words would give none
        fail(source, "caption memory photo " + std::to_string(i) + " has an empty caption");
  }
  source_ = source;
  // The thread reads its own copy of the captions: the memory may be copied or moved while it runs.
  cider_ = std::async(std::launch::async, [captions = captions]() -> std::shared_ptr<const CiderDScorer> {
             std::vector<std::vector<Tokens>> refs(captions.size());
             for (size_t i = 0; i < captions.size(); ++i)
               for (auto& c : captions[i]) refs[i].push_back(split_words(c));
             return std::make_shared<const CiderDScorer>(refs, 6.0, CiderDScorer::ReferenceVectors::on_demand);
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

void CaptionMemory::ready() const { scorer(); }

std::vector<int> CaptionMemory::nearest(const float* mean_vector, int k) const {
  const int64_t D = keys.cols();
  Eigen::Map<const Eigen::VectorXf> q(mean_vector, D);
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

Mat mean_grid_vectors(const Mat& F, int N) { return pooled_grid_vectors(F, N, KeyPooling::mean); }

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
    case KeyPooling::max: return "max";
    case KeyPooling::gem: return "gem";
    default: return "mean";
  }
}

KeyPooling parse_key_pooling(const std::string& name) {
  if (name == "mean") return KeyPooling::mean;
  if (name == "max") return KeyPooling::max;
  if (name == "gem") return KeyPooling::gem;
  throw Error("key pooling must be mean, max or gem, got '" + name + "'");
}

int choose_by_consensus(const std::vector<Hypothesis>& candidates, const std::vector<Tokens>& words,
                        const CaptionMemory& memory, const float* mean_vector, const ConsensusSettings& settings,
                        std::vector<double>* agreements) {
  if (candidates.empty()) throw Error("consensus: no candidate captions");
  if (words.size() != candidates.size()) throw Error("consensus: one word list per candidate expected");
  if (agreements) agreements->assign(candidates.size(), 0.0);
  if (settings.weight == 0 || (candidates.size() == 1 && !agreements)) return 0;
  const std::vector<int> photos = memory.nearest(mean_vector, settings.neighbours);
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
