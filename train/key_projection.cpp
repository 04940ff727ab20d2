#include "train/key_projection.hpp"

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "sat/error.hpp"
#include "train/metrics.hpp"

namespace sat {

namespace {

using MatD = Eigen::MatrixXd;

// The bag of words of each photo's captions: Y(i, w) = how many of photo i's captions hold word w, times the word's
// inverse document frequency over the photos (log N / photos holding it). Words in fewer than min_photos photos are
// left out.
struct CaptionBags {
  MatD Y;                          // photos x words
  std::vector<std::string> words;  // the columns' words, sorted
  Eigen::VectorXd idf;             // each column's inverse document frequency
  double captions_per_photo = 0;   // the photos' mean number of captions
};

CaptionBags caption_bags(const std::vector<std::vector<std::string>>& captions, int min_photos) {
  const int n = (int)captions.size();
  std::vector<std::vector<std::string>> photo_words(n);
  std::unordered_map<std::string, int> photos_holding;
  size_t caption_count = 0;
  for (int i = 0; i < n; ++i) {
    std::unordered_set<std::string> seen;
    caption_count += captions[i].size();
    for (const std::string& caption : captions[i]) {
      const Tokens words = split_words(caption);
      for (auto& w : std::unordered_set<std::string>(words.begin(), words.end())) {
        photo_words[i].push_back(w);  // once per caption holding it
        if (seen.insert(w).second) ++photos_holding[w];
      }
    }
  }
  CaptionBags out;
  for (auto& [w, count] : photos_holding)
    if (count >= min_photos) out.words.push_back(w);
  std::sort(out.words.begin(), out.words.end());  // a column order that does not depend on the hash map
  std::unordered_map<std::string, int> column;
  for (size_t k = 0; k < out.words.size(); ++k) column[out.words[k]] = (int)k;
  out.Y = MatD::Zero(n, (int)out.words.size());
  for (int i = 0; i < n; ++i)
    for (auto& w : photo_words[i])
      if (auto c = column.find(w); c != column.end()) out.Y(i, c->second) += 1;
  out.idf.resize((int)out.words.size());
  for (size_t k = 0; k < out.words.size(); ++k) {
    out.idf((int)k) = std::log((double)n / photos_holding[out.words[k]]);
    out.Y.col((int)k) *= out.idf((int)k);
  }
  out.captions_per_photo = n > 0 ? (double)caption_count / n : 0;
  return out;
}

// Centred covariance of the columns, plus the ridge `regularization` x their mean variance on the diagonal.
MatD ridge_covariance(const MatD& centred, double regularization) {
  MatD C = centred.transpose() * centred / (double)centred.rows();
  C.diagonal().array() += regularization * C.trace() / (double)C.rows();
  return C;
}

}  // namespace

KeyProjection learn_key_projection(const Mat& keys, const std::vector<std::vector<std::string>>& captions,
                                   const KeyProjectionOptions& options) {
  const int n = (int)keys.rows(), D = (int)keys.cols();
  if ((int)captions.size() != n)
    throw Error("key projection: " + std::to_string(n) + " keys but " + std::to_string(captions.size()) +
                " caption lists");
  if (options.dims < 1 || options.dims > kMaxKeyProjectionDims)
    throw Error("key projection: the dimension must be in [1, " + std::to_string(kMaxKeyProjectionDims) + "], got " +
                std::to_string(options.dims));
  if (!(options.regularization > 0 && options.regularization <= 100))
    throw Error("key projection: the regularization must be in (0, 100]");
  if (!(options.power >= 0 && options.power <= 16)) throw Error("key projection: the power must be in [0, 16]");
  if (options.min_photos < 1) throw Error("key projection: a word must be in at least 1 photo's captions");
  if (options.dims > D)
    throw Error("key projection: " + std::to_string(options.dims) + " directions asked of keys of dimension " +
                std::to_string(D));
  if (n < 2 * options.dims)
    throw Error("key projection: " + std::to_string(n) + " memory photos are too few for " +
                std::to_string(options.dims) + " directions (at least twice as many)");
  CaptionBags bags = caption_bags(captions, options.min_photos);
  MatD& Y = bags.Y;
  const int words = (int)bags.words.size();
  if (words < options.dims)
    throw Error("key projection: the captions hold " + std::to_string(words) + " words in at least " +
                std::to_string(options.min_photos) + " photos each, fewer than the " + std::to_string(options.dims) +
                " directions asked");

  MatD X = keys.cast<double>();
  const Eigen::RowVectorXd center = X.colwise().mean();
  X.rowwise() -= center;
  const Eigen::RowVectorXd bag_mean = Y.colwise().mean();
  Y.rowwise() -= bag_mean;
  const MatD Cxx = ridge_covariance(X, options.regularization);
  const MatD Cyy = ridge_covariance(Y, options.regularization);
  const MatD Cxy = X.transpose() * Y / (double)n;

  // Cxx^-1/2 by its eigenvectors (D x D); Cyy enters only as Cyy^-1 Cyx, solved by Cholesky (the words may be
  // thousands).
  Eigen::SelfAdjointEigenSolver<MatD> ex(Cxx);
  if (ex.info() != Eigen::Success || ex.eigenvalues().minCoeff() <= 0)
    throw Error("key projection: the keys' covariance could not be factored");
  const MatD Kx = ex.eigenvectors() * ex.eigenvalues().cwiseInverse().cwiseSqrt().asDiagonal() *
                  ex.eigenvectors().transpose();
  Eigen::LLT<MatD> cy(Cyy);
  if (cy.info() != Eigen::Success) throw Error("key projection: the words' covariance could not be factored");
  const MatD CyyInvCyx = cy.solve(Cxy.transpose());
  // Whitened keys against the words: Kx Cxy Cyy^-1 Cyx Kx = U S^2 U'; the canonical directions are Kx U, their
  // correlations S.
  const MatD T = Kx * (Cxy * CyyInvCyx) * Kx;
  Eigen::SelfAdjointEigenSolver<MatD> et(0.5 * (T + T.transpose()));
  if (et.info() != Eigen::Success) throw Error("key projection: the canonical correlations could not be found");

  KeyProjection out;
  out.words = words;
  out.center = center.cast<float>();
  out.map.resize(D, options.dims);
  // The word side: the words' canonical direction paired with the keys' a = Kx u (correlation s) is
  // Cyy^-1 Cyx a / s, of unit variance like a; scaled by s^power as the keys' are.
  MatD word_directions = MatD::Zero(words, options.dims);
  for (int k = 0; k < options.dims; ++k) {
    const int e = D - 1 - k;  // eigenvalues ascend
    const double correlation = std::sqrt(std::max(0.0, et.eigenvalues()[e]));
    out.correlations.push_back(correlation);
    const Eigen::VectorXd direction = Kx * et.eigenvectors().col(e);
    const double scale = std::pow(correlation, options.power);
    out.map.col(k) = (direction * scale).cast<float>();
    if (correlation > 1e-9) word_directions.col(k) = CyyInvCyx * direction * (scale / correlation);
  }
  out.vocabulary = std::move(bags.words);
  out.word_map = ((bags.captions_per_photo * bags.idf).asDiagonal() * word_directions).cast<float>();
  out.word_center = (bag_mean * word_directions).cast<float>();
  return out;
}

Vec project_caption(const KeyProjection& projection, const std::vector<std::string>& words) {
  if (!projection.has_word_side()) throw Error("key projection: no word side (the memory was built before it)");
  Vec out = -projection.word_center;
  std::vector<int> rows;
  for (const std::string& w : words) {
    const auto at = std::lower_bound(projection.vocabulary.begin(), projection.vocabulary.end(), w);
    if (at != projection.vocabulary.end() && *at == w) rows.push_back((int)(at - projection.vocabulary.begin()));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());  // a word counts once, as in the memory's bags
  for (int r : rows) out += projection.word_map.row(r);
  return out;
}

std::vector<double> caption_relevances(const KeyProjection& projection, const float* projected_key,
                                       const std::vector<std::vector<std::string>>& captions) {
  const int64_t dims = projection.word_map.cols();
  const Eigen::Map<const Vec> key(projected_key, dims);
  const double key_norm = key.norm();
  std::vector<double> out;
  out.reserve(captions.size());
  for (const auto& words : captions) {
    const Vec caption = project_caption(projection, words);
    const double norm = caption.norm() * key_norm;
    out.push_back(norm > 0 ? (double)caption.dot(key) / norm : 0.0);
  }
  return out;
}

std::string word_side_problem(const KeyProjection& p) {
  if (!p.has_word_side()) return "";
  const int64_t dims = p.map.cols();
  if (p.word_map.rows() != (int64_t)p.vocabulary.size() || p.word_map.cols() != dims || p.word_center.size() != dims)
    return "its word side has " + std::to_string(p.vocabulary.size()) + " words, a " +
           std::to_string(p.word_map.rows()) + " x " + std::to_string(p.word_map.cols()) + " map and a centre of " +
           std::to_string(p.word_center.size()) + " (expected one row per word and " + std::to_string(dims) +
           " columns)";
  for (size_t k = 0; k < p.vocabulary.size(); ++k)
    if (p.vocabulary[k].empty() || (k > 0 && !(p.vocabulary[k - 1] < p.vocabulary[k])))
      return "its word side's vocabulary is not sorted without repeats (word " + std::to_string(k) + ")";
  if (!p.word_map.allFinite() || !p.word_center.allFinite())
    return "its word side holds a value that is not a finite number";
  return "";
}

}  // namespace sat
