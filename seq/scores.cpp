// The other attention scores (additive lives in attention.cpp) and the local window.
#include <cmath>

#include "seq/attention.hpp"

namespace sat {

namespace {

void init_uniform(Param& p, Rng& rng, double fan_in) {
  double a = 1.0 / std::sqrt(fan_in);
  for (auto& v : p.value) v = (float)rng.uniform(-a, a);
}

template <typename T>
void keep_step(std::vector<T>& v, int t, const T& x) {
  if ((int)v.size() <= t) v.resize(t + 1);
  v[t] = x;
}

// Dot (Luong): e_i = h . k_i / sqrt(n), with k_i = a_i when D == n, else a learned projection k_i = W_k a_i
// (algebraically the general score, computed keys-first once per batch). Scaled by 1/sqrt(n) so large feature
// vectors do not saturate the softmax at initialization.
class DotScore final : public AttentionScore {
 public:
  DotScore(int D, int n, int L) : D_(D), n_(n), L_(L), project_(D != n) {
    if (project_) params_.W_k = Param("attention.key_proj.weight", {D, n});
    scale_ = 1.f / std::sqrt((float)n);
  }
  std::string name() const override { return "dot"; }
  std::vector<Param*> params() override {
    if (project_) return {&params_.W_k};
    return {};
  }
  void init(Rng& rng) override {
    if (project_) init_uniform(params_.W_k, rng, D_);
  }
  void precompute(const Mat& F, const RowGrids& rows) override {
    rows_ = rows;
    F_ = &F;
    if (project_)
      K_.noalias() = F * value_of(params_.W_k);
    else
      K_ = F;
    dK_.setZero(K_.rows(), K_.cols());
    h_.clear();
  }
  void forward(int t, const Mat& h, const Mat*, Mat& e, bool keep) override {
    const int B = rows_.row_count();
    e.resize(B, L_);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b) e.row(b).noalias() = scale_ * (keys(b) * h.row(b).transpose()).transpose();
    if (keep) keep_step(h_, t, h);
  }
  void backward(int t, const Mat& de, Mat& dh, Mat*, Mat*) override {
#pragma omp parallel for schedule(dynamic)
    for (int g = 0; g < rows_.grid_count(); ++g)
      for (int b : rows_.rows[g]) {
        dh.row(b).noalias() += scale_ * de.row(b) * keys(b);
        dK_.middleRows((int64_t)g * L_, L_).noalias() += scale_ * de.row(b).transpose() * h_[t].row(b);
      }
  }
  void finish_backward(Mat* dF) override {
    if (project_) {
      grad_of(params_.W_k).noalias() += F_->transpose() * dK_;
      if (dF) dF->noalias() += dK_ * value_of(params_.W_k).transpose();
    } else if (dF) {
      *dF += dK_;
    }
  }

 private:
  ConstRows keys(int b) const {
    return K_.middleRows((int64_t)rows_.grid[b] * L_, L_);
  }  // row b's grid's keys
  struct Params {
    Param W_k;  // attention.key_proj.weight (D x n; D != n only)
  } params_;
  int D_, n_, L_;
  bool project_;
  float scale_;
  const Mat* F_ = nullptr;
  Mat K_, dK_;  // one block per grid
  std::vector<Mat> h_;
};

// General (Luong): e_i = (h W) . a_i / sqrt(D), the query projected into feature space each step.
class GeneralScore final : public AttentionScore {
 public:
  GeneralScore(int D, int n, int L) : D_(D), n_(n), L_(L) {
    params_.W = Param("attention.query_proj.weight", {n, D});
    scale_ = 1.f / std::sqrt((float)D);
  }
  std::string name() const override { return "general"; }
  std::vector<Param*> params() override { return {&params_.W}; }
  void init(Rng& rng) override { init_uniform(params_.W, rng, n_); }
  // The decoder's features are read in place (they outlive the batch and the search).
  void precompute(const Mat& F, const RowGrids& rows) override {
    rows_ = rows;
    F_ = &F;
    h_.clear(), q_.clear();
  }
  void forward(int t, const Mat& h, const Mat*, Mat& e, bool keep) override {
    const int B = rows_.row_count();
    Mat q = h * value_of(params_.W);  // B x D
    e.resize(B, L_);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b) e.row(b).noalias() = scale_ * (feats(rows_.grid[b]) * q.row(b).transpose()).transpose();
    if (keep) keep_step(h_, t, h), keep_step(q_, t, q);
  }
  void backward(int t, const Mat& de, Mat& dh, Mat* dF, Mat*) override {
    Mat dq(rows_.row_count(), D_);
#pragma omp parallel for schedule(dynamic)
    for (int g = 0; g < rows_.grid_count(); ++g)
      for (int b : rows_.rows[g]) {
        dq.row(b).noalias() = scale_ * de.row(b) * feats(g);
        if (dF) dF->middleRows((int64_t)g * L_, L_).noalias() += scale_ * de.row(b).transpose() * q_[t].row(b);
      }
    grad_of(params_.W).noalias() += h_[t].transpose() * dq;
    dh.noalias() += dq * value_of(params_.W).transpose();
  }
  void finish_backward(Mat*) override {}

 private:
  ConstRows feats(int g) const {
    return F_->middleRows((int64_t)g * L_, L_);
  }
  struct Params {
    Param W;  // attention.query_proj.weight (n x D)
  } params_;
  int D_, n_, L_;
  float scale_;
  const Mat* F_ = nullptr;
  std::vector<Mat> h_, q_;
};

// Cosine (content addressing of Neural Turing Machines): e_i = beta * cos(W_q h, U a_i + b), with the key
// strength beta = softplus(w_b . h + b_b) > 0 emitted from the query, so the decoder chooses how sharp to look.
class CosineScore final : public AttentionScore {
 public:
  CosineScore(int D, int n, int A, int L) : D_(D), n_(n), A_(A), L_(L) {
    params_.U = Param("attention.feat_proj.weight", {D, A});
    params_.b = Param("attention.feat_proj.bias", {A});
    params_.W_q = Param("attention.query_proj.weight", {n, A});
    params_.w_b = Param("attention.strength.weight", {n, 1});
    params_.b_b = Param("attention.strength.bias", {1});
  }
  std::string name() const override { return "cosine"; }
  std::vector<Param*> params() override { return {&params_.U, &params_.b, &params_.W_q, &params_.w_b, &params_.b_b}; }
  void init(Rng& rng) override {
    init_uniform(params_.U, rng, D_);
    std::fill(params_.b.value.begin(), params_.b.value.end(), 0.f);
    init_uniform(params_.W_q, rng, n_);
    init_uniform(params_.w_b, rng, n_);
    params_.b_b.value[0] = 2.f;  // softplus(2) ~ 2.1: a moderately sharp start
  }
  void precompute(const Mat& F, const RowGrids& rows) override {
    rows_ = rows;
    F_ = &F;
    K_.noalias() = F * value_of(params_.U);
    K_.rowwise() += value_of(params_.b).row(0);
    knorm_ = (K_.rowwise().squaredNorm().array() + kEps).sqrt().matrix();
    dK_.setZero(K_.rows(), K_.cols());
    steps_.clear();
  }
  void forward(int t, const Mat& h, const Mat*, Mat& e, bool keep) override {
    Step s;
    s.h = h;
    s.q = h * value_of(params_.W_q);
    s.qnorm = (s.q.rowwise().squaredNorm().array() + kEps).sqrt().matrix();
    Mat pre = (h * value_of(params_.w_b)).array() + params_.b_b.value[0];
    s.beta = pre.unaryExpr([](float x) { return x > 20 ? x : std::log1p(std::exp(x)); });
    s.dsoft = pre.unaryExpr([](float x) { return 1.f / (1.f + std::exp(-x)); });
    const int B = rows_.row_count();
    s.cos.resize(B, L_);
    e.resize(B, L_);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b) {
      const int64_t g0 = (int64_t)rows_.grid[b] * L_;
      Eigen::RowVectorXf dots = (K_.middleRows(g0, L_) * s.q.row(b).transpose()).transpose();
      s.cos.row(b) = dots.array() / (knorm_.middleRows(g0, L_).transpose().array() * s.qnorm(b));
      e.row(b) = s.beta(b, 0) * s.cos.row(b);
    }
    if (keep) keep_step(steps_, t, s);
  }
  void backward(int t, const Mat& de, Mat& dh, Mat*, Mat*) override {
    const Step& s = steps_[t];
    const int B = rows_.row_count();
    Mat dq(B, A_), dpre(B, 1);
#pragma omp parallel for schedule(dynamic)
    for (int g = 0; g < rows_.grid_count(); ++g)
      for (int b : rows_.rows[g]) {
        const float beta = s.beta(b, 0), qn = s.qnorm(b);
        dpre(b, 0) = de.row(b).dot(s.cos.row(b)) * s.dsoft(b, 0);
        Eigen::RowVectorXf dc = beta * de.row(b);  // d loss / d cos_i
        auto Kb = K_.middleRows((int64_t)g * L_, L_);
        auto kn = knorm_.middleRows((int64_t)g * L_, L_).col(0).array();
        // d cos_i / d q = k_i / (|q||k_i|) - cos_i q / |q|^2
        Eigen::RowVectorXf w = (dc.transpose().array() / (kn * qn)).matrix().transpose();
        dq.row(b) = w * Kb - (dc.dot(s.cos.row(b)) / (qn * qn)) * s.q.row(b);
        // d cos_i / d k_i = q / (|q||k_i|) - cos_i k_i / |k_i|^2
        auto dKg = dK_.middleRows((int64_t)g * L_, L_);
        dKg += w.transpose() * s.q.row(b);
        Eigen::ArrayXf c = (dc.array() * s.cos.row(b).array()).transpose() / kn.square();
        dKg -= (Kb.array().colwise() * c).matrix();
      }
    grad_of(params_.W_q).noalias() += s.h.transpose() * dq;
    dh.noalias() += dq * value_of(params_.W_q).transpose();
    grad_of(params_.w_b).noalias() += s.h.transpose() * dpre;
    params_.b_b.ensure_grad();
    params_.b_b.grad[0] += dpre.sum();
    dh.noalias() += dpre * value_of(params_.w_b).transpose();
  }
  void finish_backward(Mat* dF) override {
    grad_of(params_.U).noalias() += F_->transpose() * dK_;
    grad_of(params_.b).row(0) += dK_.colwise().sum();
    if (dF) dF->noalias() += dK_ * value_of(params_.U).transpose();
  }

 private:
  // e_i = softplus(h w_b + b_b) * cos(h W_q, U a_i + b)
  struct Params {
    Param U;    // attention.feat_proj.weight (D x A)
    Param b;    // attention.feat_proj.bias
    Param W_q;  // attention.query_proj.weight (n x A)
    Param w_b;  // attention.strength.weight (n x 1)
    Param b_b;  // attention.strength.bias
  } params_;
  static constexpr float kEps = 1e-6f;
  struct Step {
    Mat h, q, qnorm, beta, dsoft, cos;
  };
  int D_, n_, A_, L_;
  const Mat* F_ = nullptr;
  Mat K_, knorm_, dK_;
  std::vector<Step> steps_;
};

// Location-only (Luong): e = W_l h + b over the L positions; the features are not consulted.
class LocationScore final : public AttentionScore {
 public:
  LocationScore(int n, int L) : n_(n), L_(L) {
    params_.W_l = Param("attention.location.weight", {n, L});
    params_.b = Param("attention.location.bias", {L});
  }
  std::string name() const override { return "location"; }
  std::vector<Param*> params() override { return {&params_.W_l, &params_.b}; }
  void init(Rng& rng) override {
    init_uniform(params_.W_l, rng, n_);
    std::fill(params_.b.value.begin(), params_.b.value.end(), 0.f);
  }
  void precompute(const Mat&, const RowGrids& rows) override { rows_ = rows, h_.clear(); }
  void forward(int t, const Mat& h, const Mat*, Mat& e, bool keep) override {
    e.noalias() = h * value_of(params_.W_l);
    e.rowwise() += value_of(params_.b).row(0);
    if (keep) keep_step(h_, t, h);
  }
  void backward(int t, const Mat& de, Mat& dh, Mat*, Mat*) override {
    grad_of(params_.W_l).noalias() += h_[t].transpose() * de;
    grad_of(params_.b).row(0) += de.colwise().sum();
    dh.noalias() += de * value_of(params_.W_l).transpose();
  }
  void finish_backward(Mat*) override {}

 private:
  struct Params {
    Param W_l;  // attention.location.weight (n x L)
    Param b;    // attention.location.bias
  } params_;
  int n_, L_;
  std::vector<Mat> h_;
};

// Local attention (Luong's local-p, in two dimensions): a centre p = (G - 1) * sigmoid(W_2 tanh(W_1 h)) on the
// grid, and the inner score plus the log of a Gaussian window around it: e_i += -|pos_i - p|^2 / (2 sigma^2).
// After the softmax that is the inner attention multiplied by the window and renormalized.
class LocalScore final : public AttentionScore {
 public:
  LocalScore(std::unique_ptr<AttentionScore> inner, int n, int A, int gh, int gw, float sigma)
      : inner_(std::move(inner)), n_(n), A_(A), gh_(gh), gw_(gw), sigma_(sigma) {
    params_.W_1 = Param("attention.centre.hidden", {n, A});
    params_.W_2 = Param("attention.centre.weight", {A, 2});
    params_.b = Param("attention.centre.bias", {2});
  }
  std::string name() const override { return "local+" + inner_->name(); }
  bool uses_coverage() const override { return inner_->uses_coverage(); }
  std::vector<Param*> params() override {
    std::vector<Param*> out = inner_->params();
    out.insert(out.end(), {&params_.W_1, &params_.W_2, &params_.b});
    return out;
  }
  void init(Rng& rng) override {
    inner_->init(rng);
    init_uniform(params_.W_1, rng, n_);
    init_uniform(params_.W_2, rng, A_);
    std::fill(params_.b.value.begin(), params_.b.value.end(), 0.f);  // start at the centre of the grid
  }
  void precompute(const Mat& F, const RowGrids& rows) override {
    rows_ = rows;
    inner_->precompute(F, rows);
    steps_.clear();
  }
  void forward(int t, const Mat& h, const Mat* cov, Mat& e, bool keep) override {
    inner_->forward(t, h, cov, e, keep);
    Step s;
    s.h = h;
    s.u = (h * value_of(params_.W_1)).array().tanh().matrix();
    Mat pre = s.u * value_of(params_.W_2);
    pre.rowwise() += value_of(params_.b).row(0);
    s.sig = (1.f / (1.f + (-pre.array()).exp())).matrix();
    const int B = rows_.row_count();
    s.p.resize(B, 2);
    s.p.col(0) = s.sig.col(0) * (float)(gh_ - 1);
    s.p.col(1) = s.sig.col(1) * (float)(gw_ - 1);
    const float k = 1.f / (2 * sigma_ * sigma_);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < gh_ * gw_; ++i) {
        float dr = i / gw_ - s.p(b, 0), dc = i % gw_ - s.p(b, 1);
        e(b, i) -= k * (dr * dr + dc * dc);
      }
    if (keep) keep_step(steps_, t, s);
  }
  void backward(int t, const Mat& de, Mat& dh, Mat* dF, Mat* dcov) override {
    inner_->backward(t, de, dh, dF, dcov);
    const Step& s = steps_[t];
    const float inv = 1.f / (sigma_ * sigma_);
    const int B = rows_.row_count();
    Mat dsig(B, 2);
    for (int b = 0; b < B; ++b) {
      double gr = 0, gc = 0;  // d e_i / d p = (pos_i - p) / sigma^2
      for (int i = 0; i < gh_ * gw_; ++i) {
        gr += de(b, i) * (i / gw_ - s.p(b, 0)) * inv;
        gc += de(b, i) * (i % gw_ - s.p(b, 1)) * inv;
      }
      dsig(b, 0) = (float)gr * (gh_ - 1) * s.sig(b, 0) * (1 - s.sig(b, 0));
      dsig(b, 1) = (float)gc * (gw_ - 1) * s.sig(b, 1) * (1 - s.sig(b, 1));
    }
    grad_of(params_.W_2).noalias() += s.u.transpose() * dsig;
    grad_of(params_.b).row(0) += dsig.colwise().sum();
    Mat du = (dsig * value_of(params_.W_2).transpose()).array() * (1.f - s.u.array().square());
    grad_of(params_.W_1).noalias() += s.h.transpose() * du;
    dh.noalias() += du * value_of(params_.W_1).transpose();
  }
  void finish_backward(Mat* dF) override { inner_->finish_backward(dF); }
  void set_products(Products* p) override {
    AttentionScore::set_products(p);
    inner_->set_products(p);
  }
  void select_rows(const std::vector<int>& rows) override {
    inner_->select_rows(rows);
    AttentionScore::select_rows(rows);
  }

 private:
  // p = (G - 1) * sigmoid(tanh(h W_1) W_2 + b)
  struct Params {
    Param W_1;  // attention.centre.hidden (n x A)
    Param W_2;  // attention.centre.weight (A x 2)
    Param b;    // attention.centre.bias
  } params_;
  struct Step {
    Mat h, u, sig, p;
  };
  std::unique_ptr<AttentionScore> inner_;
  int n_, A_, gh_, gw_;
  float sigma_;
  std::vector<Step> steps_;
};

}  // namespace

std::unique_ptr<AttentionScore> make_score(const ScoreSpec& s) {
  std::unique_ptr<AttentionScore> inner;
  if (s.kind != "additive" && s.coverage)
    throw Error("coverage works with the additive score only (got '" + s.kind + "')");
  if (s.kind == "additive")
    inner = make_additive_score(s.feature_dim, s.hidden_dim, s.attn_dim, s.grid_h * s.grid_w, s.coverage);
  else if (s.kind == "dot")
    inner = std::make_unique<DotScore>(s.feature_dim, s.hidden_dim, s.grid_h * s.grid_w);
  else if (s.kind == "general")
    inner = std::make_unique<GeneralScore>(s.feature_dim, s.hidden_dim, s.grid_h * s.grid_w);
  else if (s.kind == "cosine")
    inner = std::make_unique<CosineScore>(s.feature_dim, s.hidden_dim, s.attn_dim, s.grid_h * s.grid_w);
  else if (s.kind == "location")
    inner = std::make_unique<LocationScore>(s.hidden_dim, s.grid_h * s.grid_w);
  else
    throw Error("unknown attention score '" + s.kind + "' (additive, dot, general, cosine, location)");
  if (!s.local) return inner;
  float sigma = s.local_sigma > 0 ? s.local_sigma : std::max(1.f, std::max(s.grid_h, s.grid_w) / 4.f);
  return std::make_unique<LocalScore>(std::move(inner), s.hidden_dim, s.attn_dim, s.grid_h, s.grid_w, sigma);
}

}  // namespace sat
