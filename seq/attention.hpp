// Attention scores: how much each grid location matters given the decoder's query (hidden state).
// The score is the swappable part; softmax, context and gate live in the decoder.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "seq/matmul.hpp"
#include "seq/tensor.hpp"

namespace sat {

// Which feature grid each decoder row reads. The captions of one image (and its glimpse samples, and its beams)
// share the image's grid, so the work that depends only on the features (the encoder-side projection, its
// gradient, the mean feature) runs once per image, and beam search reorders rows without copying grids.
struct RowGrids {
  std::vector<int> grid;               // grid of each row
  std::vector<std::vector<int>> rows;  // rows reading each grid (gradients are summed per grid)
  RowGrids() = default;
  // grid_of_row[b] in [0, grids); throws on an index out of range
  RowGrids(std::vector<int> grid_of_row, int grids);
  static RowGrids identity(int n);  // row b reads grid b
  int row_count() const { return (int)grid.size(); }
  int grid_count() const { return (int)rows.size(); }
  // Row r of the result is row rows_kept[r] of this one (beam search keeps and reorders hypotheses).
  RowGrids select(const std::vector<int>& rows_kept) const;
};

// Scores e (B x L) from a query h (B x n) and features F (G*L x D: G grids, row b of the batch reads grid
// rows.grid[b]).
class AttentionScore {
 public:
  virtual ~AttentionScore() = default;
  virtual std::string name() const = 0;
  virtual void init(Rng& rng) = 0;
  // Every parameter of the score (a wrapper such as the local window adds its inner score's), in a fixed order: the
  // decoder's params() ends with them, which optimizers and gradient checks walk.
  virtual std::vector<Param*> params() = 0;
  // Once per batch: work that depends only on the features (once per grid).
  virtual void precompute(const Mat& F, const RowGrids& rows) = 0;
  // e = score(h, coverage); with keep, remembers step t for backward. coverage (B x L, the attention each
  // location received at earlier steps) is used only by scores built with coverage, and may be null otherwise.
  virtual void forward(int t, const Mat& h, const Mat* coverage, Mat& e, bool keep) = 0;
  // de (B x L) -> adds to dh (B x n), to dF (G*L x D), to parameter gradients, and writes dcoverage (B x L)
  // when the score uses coverage.
  virtual void backward(int t, const Mat& de, Mat& dh, Mat* dF, Mat* dcoverage) = 0;
  virtual bool uses_coverage() const { return false; }
  // After all steps: gradients of the precomputed part.
  virtual void finish_backward(Mat* dF) = 0;  // dF null: the features are frozen, skip their gradient
  // Keep only these rows (beam search reorders hypotheses; rows index B). The grids stay.
  virtual void select_rows(const std::vector<int>& rows) { rows_ = rows_.select(rows); }

  const RowGrids& row_grids() const { return rows_; }
  // The decoder's products (seq/matmul.hpp), for the scores whose products are large enough to matter (additive);
  // null: Eigen's. A wrapper passes them on to its inner score.
  virtual void set_products(Products* p) { products_ = p; }

 protected:
  RowGrids rows_;  // set by precompute
  Products* products_ = nullptr;
};

// Additive (Bahdanau): e_i = v . tanh(U a_i + W h + b), plus w_c * c_i with coverage (Tu et al. 2016), where
// c_i is the attention location i received so far: the score can then prefer what has not been looked at.
std::unique_ptr<AttentionScore> make_additive_score(int feature_dim, int hidden_dim, int attn_dim, int locations,
                                                    bool coverage = false);
// The score a decoder config asks for: additive, dot (scaled; projected when D != n), general, cosine (NTM, with
// a key strength), location; optionally wrapped in a local 2-D Gaussian window around a predicted centre.
struct ScoreSpec {
  std::string kind = "additive";
  int feature_dim = 0, hidden_dim = 0, attn_dim = 0, grid_h = 0, grid_w = 0;
  bool coverage = false;
  bool local = false;
  float local_sigma = 0;  // in grid cells; 0: max(1, grid / 4)
};
std::unique_ptr<AttentionScore> make_score(const ScoreSpec& spec);

// Row-wise softmax in place.
void softmax_rows(Mat& m);

}  // namespace sat
