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
MatD caption_bags(const std::vector<std::vector<std::string>>& captions, int min_photos, int* words) {
  const int n = (int)captions.size();
  std::vector<std::vector<std::string>> photo_words(n);
  std::unordered_map<std::string, int> photos_holding;
  for (int i = 0; i < n; ++i) {
    std::unordered_set<std::string> seen;
    for (const std::string& caption : captions[i]) {
      const Tokens words = split_words(caption);
      for (auto& w : std::unordered_set<std::string>(words.begin(), words.end())) {
        photo_words[i].push_back(w);  // once per caption holding it
        if (seen.insert(w).second) ++photos_holding[w];
      }
    }
  }
  std::vector<std::string> kept;
  for (auto& [w, count] : photos_holding)
    if (count >= min_photos) kept.push_back(w);
  std::sort(kept.begin(), kept.end());  // a column order that does not depend on the hash map
  std::unordered_map<std::string, int> column;
  for (size_t k = 0; k < kept.size(); ++k) column[kept[k]] = (int)k;
  MatD Y = MatD::Zero(n, (int)kept.size());
  for (int i = 0; i < n; ++i)
    for (auto& w : photo_words[i])
      if (auto c = column.find(w); c != column.end()) Y(i, c->second) += 1;
  for (size_t k = 0; k < kept.size(); ++k) Y.col((int)k) *= std::log((double)n / photos_holding[kept[k]]);
  *words = (int)kept.size();
  return Y;
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
  int words = 0;
  MatD Y = caption_bags(captions, options.min_photos, &words);
  if (words < options.dims)
    throw Error("key projection: the captions hold " + std::to_string(words) + " words in at least " +
                std::to_string(options.min_photos) + " photos each, fewer than the " + std::to_string(options.dims) +
                " directions asked");

  MatD X = keys.cast<double>();
  const Eigen::RowVectorXd center = X.colwise().mean();
  X.rowwise() -= center;
  Y.rowwise() -= Y.colwise().mean();
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
  for (int k = 0; k < options.dims; ++k) {
    const int e = D - 1 - k;  // eigenvalues ascend
    const double correlation = std::sqrt(std::max(0.0, et.eigenvalues()[e]));
    out.correlations.push_back(correlation);
    const Eigen::VectorXd direction = Kx * et.eigenvectors().col(e) * std::pow(correlation, options.power);
    out.map.col(k) = direction.cast<float>();
  }
  return out;
}

}  // namespace sat
