#include "seq/attention.hpp"
#include "seq/few_rows.hpp"
#include "seq/grid_bf16.hpp"

#include <cmath>

namespace sat {

RowGrids::RowGrids(std::vector<int> grid_of_row, int grids) : grid(std::move(grid_of_row)), rows(grids) {
  for (int b = 0; b < (int)grid.size(); ++b) {
    if (grid[b] < 0 || grid[b] >= grids)
      throw Error("decoder: row " + std::to_string(b) + " reads grid " + std::to_string(grid[b]) + " of " +
                  std::to_string(grids));
    rows[grid[b]].push_back(b);
  }
}

RowGrids RowGrids::identity(int n) {
  std::vector<int> g(n);
  for (int b = 0; b < n; ++b) g[b] = b;
  return RowGrids(std::move(g), n);
}

RowGrids RowGrids::select(const std::vector<int>& rows_kept) const {
  std::vector<int> g(rows_kept.size());
  for (size_t r = 0; r < rows_kept.size(); ++r) g[r] = grid[rows_kept[r]];
  return RowGrids(std::move(g), grid_count());
}

void softmax_rows(Mat& m) {
  for (int r = 0; r < m.rows(); ++r) {
    auto row = m.row(r);
    float mx = row.maxCoeff();
    row = (row.array() - mx).exp();
    row /= row.sum();
  }
}

namespace {

void init_uniform(Param& p, Rng& rng, double fan_in) {
  double a = 1.0 / std::sqrt(fan_in);
  for (auto& v : p.value) v = (float)rng.uniform(-a, a);
}

class AdditiveScore final : public AttentionScore {
 public:
  AdditiveScore(int D, int n, int A, int L, bool coverage) : D_(D), n_(n), A_(A), L_(L), coverage_(coverage) {
    params_.U = Param("attention.feat_proj.weight", {D, A});
    params_.b = Param("attention.feat_proj.bias", {A});
    params_.W = Param("attention.query_proj.weight", {n, A});
    params_.v = Param("attention.v", {A});
    if (coverage_) params_.w_c = Param("attention.coverage", {A});
  }
  std::vector<Param*> params() override {
    std::vector<Param*> out = {&params_.U, &params_.b, &params_.W, &params_.v};
    if (coverage_) out.push_back(&params_.w_c);
    return out;
  }
  bool uses_coverage() const override { return coverage_; }
  std::string name() const override { return "additive"; }
  void init(Rng& rng) override {
    init_uniform(params_.U, rng, D_);
    std::fill(params_.b.value.begin(), params_.b.value.end(), 0.f);
    init_uniform(params_.W, rng, n_);
    init_uniform(params_.v, rng, A_);
    if (coverage_) init_uniform(params_.w_c, rng, 1.0);
  }
  // U a_i + b once per grid; each row reads its grid's block.
  void precompute(const Mat& F, const RowGrids& rows) override {
    rows_ = rows;
    F_ = &F;
    if (products_)
      products_->times(F, value_of(params_.U), UA_, false);
    else
      UA_.noalias() = F * value_of(params_.U);
    UA_.rowwise() += value_of(params_.b).row(0);
    dUA_.setZero(UA_.rows(), UA_.cols());
    // bf16 products: the per-row passes read the projection as bf16, half the bytes (seq/grid_bf16.hpp); UA_ keeps
    // its buffer, so the next step does not allocate (and page-fault) it again
    if (products_ && products_->precision() == ProductPrecision::bf16)
      round_rows_bf16(UA_, UA16_);
    else
      UA16_.clear();
    if (coverage_) dUA_step_.resize((int64_t)rows_.row_count() * L_, A_);
    q_cache_.clear();
    h_cache_.clear();
  }
  // tanh(U a_i + b + W h + coverage_i w_c) for row b's location i, into T (A floats). Forward and backward both call
  // it, so the backward pass recomputes exactly the values forward used: keeping them instead would write B x L x A
  // floats per step (25 MB at the benchmark's shape) and read them back twice. One location at a time, so that T
  // stays in the first-level cache through the sum, the tanh and what reads it next (a whole row's L x A block made
  // in three passes went through the second-level cache each time).
  void activation_row(int b, int i, const Mat& q, const Mat* coverage, float* T) const {
    const int64_t r = (int64_t)rows_.grid[b] * L_ + i;
    Eigen::Map<Eigen::ArrayXf> t(T, A_);
    Eigen::Map<const Eigen::ArrayXf> qb(q.data() + (int64_t)b * q.outerStride(), A_);
    if (UA16_.empty()) {
      t = Eigen::Map<const Eigen::ArrayXf>(UA_.data() + r * UA_.outerStride(), A_) + qb;
    } else {
      bf16_to_floats(UA16_.row(r), A_, T);
      t += qb;
    }
    if (coverage_) t += (*coverage)(b, i) * Eigen::Map<const Eigen::ArrayXf>(params_.w_c.value.data(), A_);
    t = t.tanh();
  }
  void forward(int t, const Mat& h, const Mat* coverage, Mat& e, bool keep) override {
    if (coverage_ && !coverage) throw Error("attention: this score needs the coverage");
    const int B = rows_.row_count();
    Mat q;  // B x A
    if (products_)
      times(*products_, h, value_of(params_.W), q, false);
    else
      times(h, value_of(params_.W), q, false);
    e.resize(B, L_);
    Eigen::Map<const Eigen::VectorXf> v(params_.v.value.data(), A_);
#pragma omp parallel
    {
      Eigen::VectorXf T(A_);
#pragma omp for schedule(static)
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < L_; ++i) {
          activation_row(b, i, q, coverage, T.data());
          e(b, i) = T.dot(v);
        }
    }
    if (keep) {
      if ((int)q_cache_.size() <= t) q_cache_.resize(t + 1), h_cache_.resize(t + 1), cov_cache_.resize(t + 1);
      q_cache_[t] = std::move(q);
      h_cache_[t] = h;
      if (coverage_) cov_cache_[t] = *coverage;
    }
  }
  void backward(int t, const Mat& de, Mat& dh, Mat* dF, Mat* dcoverage) override {
    const int B = rows_.row_count(), G = rows_.grid_count();
    const Mat& q = q_cache_[t];
    const Mat* cov = coverage_ ? &cov_cache_[t] : nullptr;
    Mat dq = Mat::Zero(B, A_), dv_rows(B, A_);
    // Row by row, with its activations T recomputed (see activations): dv = sum_b de_b T_b, and d(pre-tanh) =
    // de_i * v * (1 - T^2), which feeds U a_i (summed over steps and over the rows reading the grid) and W h (summed
    // over i). One pass over the rows, accumulating into dUA and dq as each row is made; by grid, so that no two
    // threads add into one grid's block, and dv by row, summed after in a fixed order.
    const float* vv = params_.v.value.data();
#pragma omp parallel
    {
      Eigen::VectorXf T(A_);
#pragma omp for schedule(dynamic)
      for (int g = 0; g < G; ++g)
        for (int b : rows_.rows[g]) {
          float* dqb = dq.data() + (int64_t)b * A_;
          float* dvb = dv_rows.data() + (int64_t)b * A_;
          std::fill(dvb, dvb + A_, 0.f);
          for (int i = 0; i < L_; ++i) {
            const float s = de(b, i);
            activation_row(b, i, q, cov, T.data());
            const float* Tr = T.data();
            float* dUr = dUA_.data() + ((int64_t)g * L_ + i) * A_;
            float* step = coverage_ ? dUA_step_.data() + ((int64_t)b * L_ + i) * A_ : nullptr;
            for (int a = 0; a < A_; ++a) {  // one pass over the location's activations
              const float d = s * vv[a] * (1.f - Tr[a] * Tr[a]);
              dvb[a] += s * Tr[a];
              dUr[a] += d;
              dqb[a] += d;
              if (step) step[a] = d;
            }
          }
        }
    }
    params_.v.ensure_grad();
    Eigen::Map<Eigen::RowVectorXf>(params_.v.grad.data(), A_) += dv_rows.colwise().sum();
    if (products_) {
      products_->add_xt_y(h_cache_[t], dq, grad_of(params_.W));
      products_->times_t(dq, value_of(params_.W), dh, true);
    } else {
      grad_of(params_.W).noalias() += h_cache_[t].transpose() * dq;
      dh.noalias() += dq * value_of(params_.W).transpose();
    }
    if (coverage_) {
      // pre-tanh += c_bi * w_c: d w_c = sum_bi c_bi dpre_bi, d c_bi = dpre_bi . w_c
      Eigen::Map<const Eigen::RowVectorXf> cov_flat(cov->data(), (int64_t)B * L_);
      grad_of(params_.w_c).noalias() += cov_flat * dUA_step_;
      Eigen::Map<const Eigen::VectorXf> wc(params_.w_c.value.data(), A_);
      Eigen::VectorXf dc = dUA_step_ * wc;
      if (dcoverage) *dcoverage = Eigen::Map<Mat>(dc.data(), B, L_);
    }
  }
  void finish_backward(Mat* dF) override {
    if (products_)
      products_->add_xt_y(*F_, dUA_, grad_of(params_.U));
    else
      grad_of(params_.U).noalias() += F_->transpose() * dUA_;
    grad_of(params_.b).row(0) += dUA_.colwise().sum();
    if (dF && products_)
      products_->times_t(dUA_, value_of(params_.U), *dF, true);
    else if (dF)
      dF->noalias() += dUA_ * value_of(params_.U).transpose();
  }

 private:
  // e_i = v . tanh(U a_i + b + W h + c_i w_c)
  struct Params {
    Param U;    // attention.feat_proj.weight (D x A)
    Param b;    // attention.feat_proj.bias
    Param W;    // attention.query_proj.weight (n x A)
    Param v;    // attention.v
    Param w_c;  // attention.coverage (with coverage only)
  } params_;
  int D_, n_, A_, L_;
  bool coverage_ = false;
  const Mat* F_ = nullptr;
  Mat UA_, dUA_, dUA_step_;
  Bf16Rows UA16_;  // U a_i + b in bf16 where the products run in bf16 (then read instead of UA_)
  std::vector<Mat> q_cache_, h_cache_, cov_cache_;  // per step: W h, h, coverage
};

}  // namespace

std::unique_ptr<AttentionScore> make_additive_score(int D, int n, int A, int L, bool coverage) {
  return std::make_unique<AdditiveScore>(D, n, A, L, coverage);
}

}  // namespace sat
