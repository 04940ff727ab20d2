#include "seq/decoder.hpp"

#include <cmath>

namespace sat {

enum : int {
  kEmbed,
  kInitHW, kInitHB, kInitCW, kInitCB,
  kGateW, kGateB,
  kLstmWEmb, kLstmWCtx, kLstmWHh, kLstmB,
  kOutHidden, kOutContext, kOutW, kOutB,
  kNumParams
};

nlohmann::json DecoderConfig::to_json() const {
  return {{"vocab_size", vocab_size}, {"embed_dim", embed_dim}, {"hidden_dim", hidden_dim}, {"attn_dim", attn_dim},
          {"feature_dim", feature_dim}, {"grid_h", grid_h},        {"grid_w", grid_w},         {"dropout", dropout},
          {"attention", attention},   {"score", score},            {"order", order},           {"gate", gate},
          {"coverage", coverage},     {"local_sigma", local_sigma}};
}

DecoderConfig DecoderConfig::from_json(const nlohmann::json& j) {
  DecoderConfig c;
  try {
    c.vocab_size = j.at("vocab_size");
    c.embed_dim = j.at("embed_dim");
    c.hidden_dim = j.at("hidden_dim");
    c.attn_dim = j.at("attn_dim");
    c.feature_dim = j.at("feature_dim");
    c.grid_h = j.at("grid_h");
    c.grid_w = j.at("grid_w");
    c.dropout = j.at("dropout");
    c.attention = j.at("attention");
    c.score = j.at("score");
    c.order = j.at("order");
    c.gate = j.at("gate");
    c.coverage = j.value("coverage", false);
    c.local_sigma = j.value("local_sigma", 0.f);
  } catch (const std::exception& e) {
    throw Error(std::string("decoder config is malformed (") + e.what() + ")");
  }
  auto bad = [](int v) { return v < 1 || v > (1 << 20); };
  if (bad(c.vocab_size) || bad(c.embed_dim) || bad(c.hidden_dim) || bad(c.attn_dim) || bad(c.feature_dim) ||
      bad(c.grid_h) || bad(c.grid_w) || c.dropout < 0 || c.dropout >= 1)
    throw Error("decoder config has out-of-range sizes");
  if (c.attention != "soft" && c.attention != "local")
    throw Error("decoder config: unknown attention '" + c.attention + "' (soft, local)");
  if (c.order != "bahdanau") throw Error("decoder config: unknown order '" + c.order + "'");
  return c;
}

CaptionBatch CaptionBatch::from_ids(const std::vector<std::vector<int>>& caps, int max_len) {
  CaptionBatch b;
  b.B = (int)caps.size();
  for (auto& c : caps) b.T = std::max(b.T, std::min((int)c.size(), max_len) + 1);
  b.input.assign((size_t)b.B * b.T, 0);
  b.target.assign((size_t)b.B * b.T, 0);
  b.mask.assign((size_t)b.B * b.T, 0.f);
  for (int i = 0; i < b.B; ++i) {
    int n = std::min((int)caps[i].size(), max_len);
    b.input[(size_t)i * b.T] = 1;  // <start>
    for (int t = 0; t < n; ++t) {
      b.input[(size_t)i * b.T + t + 1] = caps[i][t];
      b.target[(size_t)i * b.T + t] = caps[i][t];
    }
    b.target[(size_t)i * b.T + n] = 2;  // <end>
    for (int t = 0; t <= n; ++t) b.mask[(size_t)i * b.T + t] = 1.f;
  }
  return b;
}

static void init_uniform(Param& p, Rng& rng, double a) {
  for (auto& v : p.value) v = (float)rng.uniform(-a, a);
}

Decoder::Decoder(const DecoderConfig& cfg) : cfg_(cfg) {
  const int V = cfg.vocab_size, m = cfg.embed_dim, n = cfg.hidden_dim, D = cfg.feature_dim;
  params_.resize(kNumParams);
  params_[kEmbed] = Param("embed.weight", {V, m});
  params_[kInitHW] = Param("init_h.weight", {D, n});
  params_[kInitHB] = Param("init_h.bias", {n});
  params_[kInitCW] = Param("init_c.weight", {D, n});
  params_[kInitCB] = Param("init_c.bias", {n});
  params_[kGateW] = Param("gate.weight", {n, 1});
  params_[kGateB] = Param("gate.bias", {1});
  params_[kLstmWEmb] = Param("lstm.weight_emb", {m, 4 * n});
  params_[kLstmWCtx] = Param("lstm.weight_ctx", {D, 4 * n});
  params_[kLstmWHh] = Param("lstm.weight_hh", {n, 4 * n});
  params_[kLstmB] = Param("lstm.bias", {4 * n});
  params_[kOutHidden] = Param("out.hidden", {n, m});
  params_[kOutContext] = Param("out.context", {D, m});
  params_[kOutW] = Param("out.weight", {m, V});
  params_[kOutB] = Param("out.bias", {V});
  ScoreSpec spec;
  spec.kind = cfg.score;
  spec.feature_dim = D, spec.hidden_dim = n, spec.attn_dim = cfg.attn_dim;
  spec.grid_h = cfg.grid_h, spec.grid_w = cfg.grid_w;
  spec.coverage = cfg.coverage;
  spec.local = cfg.attention == "local";
  spec.local_sigma = cfg.local_sigma;
  score_ = make_score(spec);
}

std::vector<Param*> Decoder::params() {
  std::vector<Param*> out;
  for (auto& p : params_) out.push_back(&p);
  for (auto* p : score_->params()) out.push_back(p);
  return out;
}

void Decoder::init(Rng& rng) {
  const int n = cfg_.hidden_dim, m = cfg_.embed_dim, D = cfg_.feature_dim;
  init_uniform(P(kEmbed), rng, 0.1);
  init_uniform(P(kInitHW), rng, 1 / std::sqrt((double)D));
  init_uniform(P(kInitCW), rng, 1 / std::sqrt((double)D));
  init_uniform(P(kGateW), rng, 1 / std::sqrt((double)n));
  init_uniform(P(kLstmWEmb), rng, 1 / std::sqrt((double)n));
  init_uniform(P(kLstmWCtx), rng, 1 / std::sqrt((double)n));
  init_uniform(P(kLstmWHh), rng, 1 / std::sqrt((double)n));
  for (int k = 0; k < n; ++k) P(kLstmB).value[n + k] = 1.f;  // forget-gate bias 1: remember by default
  init_uniform(P(kOutHidden), rng, 1 / std::sqrt((double)n));
  init_uniform(P(kOutContext), rng, 1 / std::sqrt((double)D));
  init_uniform(P(kOutW), rng, 1 / std::sqrt((double)m));
  score_->init(rng);
}

void Decoder::context(const Mat& F, const Mat& alpha, Mat& z) const {
  const int B = (int)alpha.rows(), L = cfg_.locations();
  z.resize(B, cfg_.feature_dim);
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; ++b) z.row(b).noalias() = alpha.row(b) * F.middleRows(b * L, L);
}

static Mat sigmoid(const Mat& x) { return (1.f / (1.f + (-x.array()).exp())).matrix(); }

static void dropout_mask(Mat& mask, int rows, int cols, float p, bool training, Rng* rng) {
  mask.resize(rows, cols);
  if (!training || p <= 0) {
    mask.setOnes();
    return;
  }
  const float keep = 1.f / (1.f - p);
  float* d = mask.data();
  for (int64_t k = 0; k < (int64_t)rows * cols; ++k) d[k] = rng->uniform() >= p ? keep : 0.f;
}

DecoderLoss Decoder::forward(const Mat& F, const CaptionBatch& batch, float penalty_weight, bool training, Rng* rng,
                             DecoderCache& C) {
  const int B = batch.B, T = batch.T, L = cfg_.locations(), n = cfg_.hidden_dim;
  if (F.rows() != (int64_t)B * L || F.cols() != cfg_.feature_dim)
    throw Error("decoder: features are " + std::to_string(F.rows()) + "x" + std::to_string(F.cols()) + ", expected " +
                std::to_string((int64_t)B * L) + "x" + std::to_string(cfg_.feature_dim));
  C.B = B, C.T = T, C.F = &F, C.batch = &batch, C.penalty_weight = penalty_weight;
  for (auto* v : {&C.h, &C.c}) v->assign(T + 1, Mat());
  for (auto* v : {&C.alpha, &C.z, &C.beta, &C.zhat, &C.gates, &C.tanh_c, &C.hdrop_mask, &C.out_tanh, &C.odrop_mask,
                  &C.probs})
    v->assign(T, Mat());

  C.mean_feat.resize(B, cfg_.feature_dim);
  for (int b = 0; b < B; ++b) C.mean_feat.row(b) = F.middleRows(b * L, L).colwise().mean();
  C.h[0] = ((C.mean_feat * value_of(P(kInitHW))).rowwise() + value_of(P(kInitHB)).row(0)).array().tanh().matrix();
  C.c[0] = ((C.mean_feat * value_of(P(kInitCW))).rowwise() + value_of(P(kInitCB)).row(0)).array().tanh().matrix();
  score_->precompute(F, B);
  C.alpha_sum.setZero(B, L);
  Mat cov = Mat::Zero(B, L);

  auto E = value_of(P(kEmbed));
  DecoderLoss loss;
  double ce = 0;
  Mat emb(B, cfg_.embed_dim), e;
  for (int t = 0; t < T; ++t) {
    for (int b = 0; b < B; ++b) emb.row(b) = E.row(batch.input[(size_t)b * T + t]);
    const Mat& hp = C.h[t];
    score_->forward(t, hp, cfg_.coverage ? &cov : nullptr, e, true);
    softmax_rows(e);
    C.alpha[t] = e;
    if (cfg_.coverage) cov += e;
    for (int b = 0; b < B; ++b) C.alpha_sum.row(b) += batch.mask[(size_t)b * T + t] * C.alpha[t].row(b);
    context(F, C.alpha[t], C.z[t]);
    if (cfg_.gate) {
      C.beta[t] = sigmoid((hp * value_of(P(kGateW))).array() + P(kGateB).value[0]);
      C.zhat[t] = C.z[t].array().colwise() * C.beta[t].col(0).array();
    } else {
      C.zhat[t] = C.z[t];
    }
    Mat g = emb * value_of(P(kLstmWEmb));
    g.noalias() += C.zhat[t] * value_of(P(kLstmWCtx));
    g.noalias() += hp * value_of(P(kLstmWHh));
    g.rowwise() += value_of(P(kLstmB)).row(0);
    g.leftCols(3 * n) = sigmoid(g.leftCols(3 * n));
    g.rightCols(n) = g.rightCols(n).array().tanh().matrix();
    C.gates[t] = g;
    auto i = g.leftCols(n).array(), f = g.middleCols(n, n).array(), o = g.middleCols(2 * n, n).array(),
         gg = g.rightCols(n).array();
    C.c[t + 1] = (f * C.c[t].array() + i * gg).matrix();
    C.tanh_c[t] = C.c[t + 1].array().tanh().matrix();
    C.h[t + 1] = (o * C.tanh_c[t].array()).matrix();

    dropout_mask(C.hdrop_mask[t], B, n, cfg_.dropout, training, rng);
    Mat hd = C.h[t + 1].cwiseProduct(C.hdrop_mask[t]);
    Mat pre = emb;
    pre.noalias() += hd * value_of(P(kOutHidden));
    pre.noalias() += C.zhat[t] * value_of(P(kOutContext));
    C.out_tanh[t] = pre.array().tanh().matrix();
    dropout_mask(C.odrop_mask[t], B, cfg_.embed_dim, cfg_.dropout, training, rng);
    Mat logits = C.out_tanh[t].cwiseProduct(C.odrop_mask[t]) * value_of(P(kOutW));
    logits.rowwise() += value_of(P(kOutB)).row(0);
    softmax_rows(logits);
    C.probs[t] = std::move(logits);
    for (int b = 0; b < B; ++b) {
      if (batch.mask[(size_t)b * T + t] == 0) continue;
      int y = batch.target[(size_t)b * T + t];
      ce -= std::log(std::max(C.probs[t](b, y), 1e-30f));
      loss.tokens++;
    }
  }
  loss.cross_entropy = loss.tokens ? ce / loss.tokens : 0;
  loss.penalty = penalty_weight * (1.f - C.alpha_sum.array()).square().mean();
  return loss;
}

void Decoder::backward(DecoderCache& C, Mat* dF) {
  const int B = C.B, T = C.T, L = cfg_.locations(), n = cfg_.hidden_dim, D = cfg_.feature_dim;
  const CaptionBatch& batch = *C.batch;
  const Mat& F = *C.F;
  if (dF) dF->setZero((int64_t)B * L, D);
  int64_t tokens = 0;
  for (float m : batch.mask) tokens += m > 0;
  const float inv_tokens = tokens ? 1.f / tokens : 0.f;
  // d penalty / d alpha_sum = -2 lambda (1 - S) / (B L)
  Mat dS = (-2.f * C.penalty_weight / ((float)B * L)) * (1.f - C.alpha_sum.array()).matrix();

  auto E = value_of(P(kEmbed));
  auto gE = grad_of(P(kEmbed));
  Mat dh_next = Mat::Zero(B, n), dc_next = Mat::Zero(B, n);
  Mat emb(B, cfg_.embed_dim);
  // Coverage at step t sums the alphas of all earlier steps, so alpha_t gets the coverage gradients of every
  // later step: dcov_later accumulates them while time runs backward.
  Mat dcov_later = Mat::Zero(B, L), dcov;
  for (int t = T - 1; t >= 0; --t) {
    for (int b = 0; b < B; ++b) emb.row(b) = E.row(batch.input[(size_t)b * T + t]);
    // softmax + cross-entropy
    Mat dlogits = C.probs[t];
    for (int b = 0; b < B; ++b) {
      float m = batch.mask[(size_t)b * T + t] * inv_tokens;
      dlogits.row(b) *= m;
      dlogits(b, batch.target[(size_t)b * T + t]) -= m;
    }
    Mat od = C.out_tanh[t].cwiseProduct(C.odrop_mask[t]);
    grad_of(P(kOutW)).noalias() += od.transpose() * dlogits;
    grad_of(P(kOutB)).row(0) += dlogits.colwise().sum();
    Mat dpre = (dlogits * value_of(P(kOutW)).transpose()).cwiseProduct(C.odrop_mask[t]);
    dpre.array() *= 1.f - C.out_tanh[t].array().square();
    Mat demb = dpre;
    Mat hd = C.h[t + 1].cwiseProduct(C.hdrop_mask[t]);
    grad_of(P(kOutHidden)).noalias() += hd.transpose() * dpre;
    grad_of(P(kOutContext)).noalias() += C.zhat[t].transpose() * dpre;
    Mat dh = dh_next + (dpre * value_of(P(kOutHidden)).transpose()).cwiseProduct(C.hdrop_mask[t]);
    Mat dzhat = dpre * value_of(P(kOutContext)).transpose();

    // LSTM cell
    const Mat& g = C.gates[t];
    auto i = g.leftCols(n).array(), f = g.middleCols(n, n).array(), o = g.middleCols(2 * n, n).array(),
         gg = g.rightCols(n).array();
    auto tc = C.tanh_c[t].array();
    Mat dc = dc_next.array() + dh.array() * o * (1.f - tc.square());
    Mat dgates(B, 4 * n);
    dgates.leftCols(n) = (dc.array() * gg * i * (1.f - i)).matrix();
    dgates.middleCols(n, n) = (dc.array() * C.c[t].array() * f * (1.f - f)).matrix();
    dgates.middleCols(2 * n, n) = (dh.array() * tc * o * (1.f - o)).matrix();
    dgates.rightCols(n) = (dc.array() * i * (1.f - gg.square())).matrix();
    Mat dc_prev = (dc.array() * f).matrix();
    grad_of(P(kLstmWEmb)).noalias() += emb.transpose() * dgates;
    grad_of(P(kLstmWCtx)).noalias() += C.zhat[t].transpose() * dgates;
    grad_of(P(kLstmWHh)).noalias() += C.h[t].transpose() * dgates;
    grad_of(P(kLstmB)).row(0) += dgates.colwise().sum();
    demb.noalias() += dgates * value_of(P(kLstmWEmb)).transpose();
    dzhat.noalias() += dgates * value_of(P(kLstmWCtx)).transpose();
    Mat dh_prev = dgates * value_of(P(kLstmWHh)).transpose();

    // gate beta
    Mat dz;
    if (cfg_.gate) {
      Eigen::ArrayXf beta = C.beta[t].col(0).array();
      Eigen::ArrayXf dbeta = (dzhat.cwiseProduct(C.z[t])).rowwise().sum().array();
      dz = dzhat.array().colwise() * beta;
      Mat ds = (dbeta * beta * (1.f - beta)).matrix();  // B x 1
      grad_of(P(kGateW)).noalias() += C.h[t].transpose() * ds;
      P(kGateB).grad[0] += ds.sum();
      dh_prev.noalias() += ds * value_of(P(kGateW)).transpose();
    } else {
      dz = dzhat;
    }

    // context z = alpha F, then the penalty, then softmax
    Mat dalpha(B, L);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b) {
      dalpha.row(b).noalias() = dz.row(b) * F.middleRows(b * L, L).transpose();
      if (dF) dF->middleRows(b * L, L).noalias() += C.alpha[t].row(b).transpose() * dz.row(b);
      dalpha.row(b) += batch.mask[(size_t)b * T + t] * dS.row(b);
    }
    if (cfg_.coverage) dalpha += dcov_later;
    const Mat& a = C.alpha[t];
    Eigen::ArrayXf dot = (a.cwiseProduct(dalpha)).rowwise().sum().array();
    Mat de = (a.array() * (dalpha.array().colwise() - dot)).matrix();
    score_->backward(t, de, dh_prev, dF, cfg_.coverage ? &dcov : nullptr);
    if (cfg_.coverage) dcov_later += dcov;

    for (int b = 0; b < B; ++b) gE.row(batch.input[(size_t)b * T + t]) += demb.row(b);
    dh_next = std::move(dh_prev);
    dc_next = std::move(dc_prev);
  }
  score_->finish_backward(dF);

  Mat dh0 = dh_next.array() * (1.f - C.h[0].array().square());
  Mat dc0 = dc_next.array() * (1.f - C.c[0].array().square());
  grad_of(P(kInitHW)).noalias() += C.mean_feat.transpose() * dh0;
  grad_of(P(kInitHB)).row(0) += dh0.colwise().sum();
  grad_of(P(kInitCW)).noalias() += C.mean_feat.transpose() * dc0;
  grad_of(P(kInitCB)).row(0) += dc0.colwise().sum();
  if (!dF) return;
  Mat dmean = dh0 * value_of(P(kInitHW)).transpose();
  dmean.noalias() += dc0 * value_of(P(kInitCW)).transpose();
  dmean /= (float)L;
  for (int b = 0; b < B; ++b) dF->middleRows(b * L, L).rowwise() += dmean.row(b);
}

void Decoder::begin(const Mat& F, int B, State& st) {
  const int L = cfg_.locations();
  if (F.rows() != (int64_t)B * L || F.cols() != cfg_.feature_dim)
    throw Error("decoder: features have the wrong shape for this model");
  st.F = F;
  Mat mean(B, cfg_.feature_dim);
  for (int b = 0; b < B; ++b) mean.row(b) = F.middleRows(b * L, L).colwise().mean();
  st.h = ((mean * value_of(P(kInitHW))).rowwise() + value_of(P(kInitHB)).row(0)).array().tanh().matrix();
  st.c = ((mean * value_of(P(kInitCW))).rowwise() + value_of(P(kInitCB)).row(0)).array().tanh().matrix();
  st.coverage = Mat::Zero(B, L);
  score_->precompute(st.F, B);
}

void Decoder::step(const std::vector<int>& tokens, State& st, Mat& logprobs, Mat& alpha) {
  const int B = (int)st.h.rows(), n = cfg_.hidden_dim;
  auto E = value_of(P(kEmbed));
  Mat emb(B, cfg_.embed_dim);
  for (int b = 0; b < B; ++b) emb.row(b) = E.row(tokens[b]);
  score_->forward(0, st.h, &st.coverage, alpha, false);
  softmax_rows(alpha);
  st.coverage += alpha;
  Mat z;
  context(st.F, alpha, z);
  if (cfg_.gate) {
    Mat beta = sigmoid((st.h * value_of(P(kGateW))).array() + P(kGateB).value[0]);
    z = z.array().colwise() * beta.col(0).array();
  }
  Mat g = emb * value_of(P(kLstmWEmb));
  g.noalias() += z * value_of(P(kLstmWCtx));
  g.noalias() += st.h * value_of(P(kLstmWHh));
  g.rowwise() += value_of(P(kLstmB)).row(0);
  g.leftCols(3 * n) = sigmoid(g.leftCols(3 * n));
  g.rightCols(n) = g.rightCols(n).array().tanh().matrix();
  st.c = (g.middleCols(n, n).array() * st.c.array() + g.leftCols(n).array() * g.rightCols(n).array()).matrix();
  st.h = (g.middleCols(2 * n, n).array() * st.c.array().tanh()).matrix();
  Mat pre = emb;
  pre.noalias() += st.h * value_of(P(kOutHidden));
  pre.noalias() += z * value_of(P(kOutContext));
  logprobs = pre.array().tanh().matrix() * value_of(P(kOutW));
  logprobs.rowwise() += value_of(P(kOutB)).row(0);
  for (int b = 0; b < B; ++b) {  // log-softmax
    auto row = logprobs.row(b);
    float mx = row.maxCoeff();
    float lse = mx + std::log((row.array() - mx).exp().sum());
    row.array() -= lse;
  }
}

void Decoder::select_rows(State& st, const std::vector<int>& rows) {
  const int L = cfg_.locations();
  Mat h(rows.size(), st.h.cols()), c(rows.size(), st.c.cols()), F(rows.size() * L, st.F.cols()),
      cov(rows.size(), st.coverage.cols());
  for (size_t r = 0; r < rows.size(); ++r) {
    h.row(r) = st.h.row(rows[r]);
    c.row(r) = st.c.row(rows[r]);
    cov.row(r) = st.coverage.row(rows[r]);
    F.middleRows(r * L, L) = st.F.middleRows(rows[r] * L, L);
  }
  st.h = std::move(h), st.c = std::move(c), st.F = std::move(F), st.coverage = std::move(cov);
  score_->select_rows(rows);
}

}  // namespace sat
