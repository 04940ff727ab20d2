#include "seq/attention.hpp"

#include <cmath>

namespace sat {

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
    params_.emplace_back("attention.feat_proj.weight", std::vector<int64_t>{D, A});
    params_.emplace_back("attention.feat_proj.bias", std::vector<int64_t>{A});
    params_.emplace_back("attention.query_proj.weight", std::vector<int64_t>{n, A});
    params_.emplace_back("attention.v", std::vector<int64_t>{A});
    if (coverage_) params_.emplace_back("attention.coverage", std::vector<int64_t>{A});
  }
  bool uses_coverage() const override { return coverage_; }
  std::string name() const override { return "additive"; }
  void init(Rng& rng) override {
    init_uniform(params_[0], rng, D_);
    std::fill(params_[1].value.begin(), params_[1].value.end(), 0.f);
    init_uniform(params_[2], rng, n_);
    init_uniform(params_[3], rng, A_);
    if (coverage_) init_uniform(params_[4], rng, 1.0);
  }
  void precompute(const Mat& F, int B) override {
    B_ = B;
    F_ = &F;
    UA_.noalias() = F * value_of(params_[0]);
    UA_.rowwise() += value_of(params_[1]).row(0);
    dUA_.setZero(UA_.rows(), UA_.cols());
    if (coverage_) dUA_step_.resize(UA_.rows(), UA_.cols());
    tanh_cache_.clear();
    h_cache_.clear();
  }
  void forward(int t, const Mat& h, const Mat* coverage, Mat& e, bool keep) override {
    if (coverage_ && !coverage) throw Error("attention: this score needs the coverage");
    Mat q = h * value_of(params_[2]);  // B x A
    Mat T(B_ * L_, A_);
    e.resize(B_, L_);
    Eigen::Map<const Eigen::VectorXf> v(params_[3].value.data(), A_);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B_; ++b) {
      auto Tb = T.middleRows(b * L_, L_);
      Tb = UA_.middleRows(b * L_, L_).rowwise() + q.row(b);
      if (coverage_) Tb.noalias() += coverage->row(b).transpose() * value_of(params_[4]);
      Tb = Tb.array().tanh().matrix();
      e.row(b).noalias() = (Tb * v).transpose();
    }
    if (keep) {
      if ((int)tanh_cache_.size() <= t) tanh_cache_.resize(t + 1), h_cache_.resize(t + 1), cov_cache_.resize(t + 1);
      tanh_cache_[t] = std::move(T);
      h_cache_[t] = h;
      if (coverage_) cov_cache_[t] = *coverage;
    }
  }
  void backward(int t, const Mat& de, Mat& dh, Mat* dF, Mat* dcoverage) override {
    const Mat& T = tanh_cache_[t];
    Eigen::Map<const Eigen::RowVectorXf> v(params_[3].value.data(), A_);
    Eigen::Map<const Eigen::VectorXf> de_flat(de.data(), B_ * L_);
    // dv += T^T de
    Eigen::Map<Eigen::VectorXf>(params_[3].grad.data(), A_).noalias() += T.transpose() * de_flat;
    Mat dq(B_, A_);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B_; ++b) {
      // d(pre-tanh) = de_i * v * (1 - T^2); it feeds U a_i (summed over steps) and W h (summed over i).
      // One pass over the rows: accumulate into dUA and dq as each row is made (memory bound otherwise).
      float* dqb = dq.data() + (int64_t)b * A_;
      std::fill(dqb, dqb + A_, 0.f);
      const float* vv = params_[3].value.data();
      for (int i = 0; i < L_; ++i) {
        const int64_t r = (int64_t)b * L_ + i;
        const float s = de(b, i);
        const float* Tr = T.data() + r * A_;
        float* dUr = dUA_.data() + r * A_;
        float* step = coverage_ ? dUA_step_.data() + r * A_ : nullptr;
        for (int a = 0; a < A_; ++a) {
          const float d = s * vv[a] * (1.f - Tr[a] * Tr[a]);
          dUr[a] += d;
          dqb[a] += d;
        }
        if (step)
          for (int a = 0; a < A_; ++a) step[a] = s * vv[a] * (1.f - Tr[a] * Tr[a]);
      }
    }
    grad_of(params_[2]).noalias() += h_cache_[t].transpose() * dq;
    dh.noalias() += dq * value_of(params_[2]).transpose();
    if (coverage_) {
      // pre-tanh += c_bi * w_c: d w_c = sum_bi c_bi dpre_bi, d c_bi = dpre_bi . w_c
      Eigen::Map<const Eigen::RowVectorXf> cov(cov_cache_[t].data(), B_ * L_);
      grad_of(params_[4]).noalias() += cov * dUA_step_;
      Eigen::Map<const Eigen::VectorXf> wc(params_[4].value.data(), A_);
      Eigen::VectorXf dc = dUA_step_ * wc;
      if (dcoverage) *dcoverage = Eigen::Map<Mat>(dc.data(), B_, L_);
    }
  }
  void finish_backward(Mat* dF) override {
    grad_of(params_[0]).noalias() += F_->transpose() * dUA_;
    grad_of(params_[1]).row(0) += dUA_.colwise().sum();
    if (dF) dF->noalias() += dUA_ * value_of(params_[0]).transpose();
  }
  void select_rows(const std::vector<int>& rows) override {
    Mat out(rows.size() * L_, A_);
    for (size_t r = 0; r < rows.size(); ++r) out.middleRows(r * L_, L_) = UA_.middleRows(rows[r] * L_, L_);
    UA_ = std::move(out);
    B_ = (int)rows.size();
  }

 private:
  int D_, n_, A_, L_, B_ = 0;
  bool coverage_ = false;
  const Mat* F_ = nullptr;
  Mat UA_, dUA_, dUA_step_;
  std::vector<Mat> tanh_cache_, h_cache_, cov_cache_;
};

}  // namespace

std::unique_ptr<AttentionScore> make_additive_score(int D, int n, int A, int L, bool coverage) {
  return std::make_unique<AdditiveScore>(D, n, A, L, coverage);
}

}  // namespace sat
