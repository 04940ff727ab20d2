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
          {"coverage", coverage},     {"local_sigma", local_sigma}, {"hard_window", hard_window},
          {"hard_soft_prob", hard_soft_prob}, {"reinforce_weight", reinforce_weight},
          {"entropy_weight", entropy_weight}, {"hard_sample_at_test", hard_sample_at_test}};
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
    c.hard_window = j.value("hard_window", 1);
    c.hard_soft_prob = j.value("hard_soft_prob", 0.5f);
    c.reinforce_weight = j.value("reinforce_weight", 1.f);
    c.entropy_weight = j.value("entropy_weight", 0.002f);
    c.hard_sample_at_test = j.value("hard_sample_at_test", false);
  } catch (const std::exception& e) {
    throw Error(std::string("decoder config is malformed (") + e.what() + ")");
  }
  auto bad = [](int v) { return v < 1 || v > (1 << 20); };
  if (bad(c.vocab_size) || bad(c.embed_dim) || bad(c.hidden_dim) || bad(c.attn_dim) || bad(c.feature_dim) ||
      bad(c.grid_h) || bad(c.grid_w) || c.dropout < 0 || c.dropout >= 1)
    throw Error("decoder config has out-of-range sizes");
  if (c.attention != "soft" && c.attention != "local" && c.attention != "hard" && c.attention != "none")
    throw Error("decoder config: unknown attention '" + c.attention + "' (soft, hard, local, none)");
  if (c.hard_window < 1 || c.hard_window % 2 == 0) throw Error("decoder config: hard_window must be odd and positive");
  if (c.hard_soft_prob < 0 || c.hard_soft_prob > 1) throw Error("decoder config: hard_soft_prob must be in [0, 1]");
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
  const int Dc = cfg.attends() ? D : 0;  // without attention there is no context input
  params_[kLstmWCtx] = Param("lstm.weight_ctx", {Dc, 4 * n});
  params_[kLstmWHh] = Param("lstm.weight_hh", {n, 4 * n});
  params_[kLstmB] = Param("lstm.bias", {4 * n});
  params_[kOutHidden] = Param("out.hidden", {n, m});
  params_[kOutContext] = Param("out.context", {Dc, m});
  params_[kOutW] = Param("out.weight", {m, V});
  params_[kOutB] = Param("out.bias", {V});
  if (cfg.hard()) params_.emplace_back("attention.reinforce_baseline", std::vector<int64_t>{1}, false);
  if (!cfg.attends()) return;
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
  if (score_)
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
  if (cfg_.hard()) params_[kNumParams].value[0] = 0.f;
  if (score_) score_->init(rng);
}

void Decoder::glimpse_weights(int s, float* w) const {
  const int L = cfg_.locations(), gw = cfg_.grid_w, r = cfg_.hard_window / 2;
  std::fill(w, w + L, 0.f);
  if (r == 0) {
    w[s] = 1.f;
    return;
  }
  const float sigma = std::max(0.5f, cfg_.hard_window / 3.f);
  double sum = 0;
  for (int dy = -r; dy <= r; ++dy)
    for (int dx = -r; dx <= r; ++dx) {
      int y = s / gw + dy, x = s % gw + dx;
      if (y < 0 || x < 0 || y >= cfg_.grid_h || x >= gw) continue;
      float v = std::exp(-(dy * dy + dx * dx) / (2 * sigma * sigma));
      w[y * gw + x] = v;
      sum += v;
    }
  for (int i = 0; i < L; ++i) w[i] = (float)(w[i] / sum);
}

void add_reinforce_grad(const float* alpha, int L, int s, float advantage, float lambda_r, float lambda_e, float scale,
                        float* de) {
  double H = 0;
  for (int i = 0; i < L; ++i) H -= alpha[i] > 0 ? alpha[i] * std::log(alpha[i]) : 0.0;
  for (int i = 0; i < L; ++i) {
    const float log_a = alpha[i] > 0 ? std::log(alpha[i]) : 0.f;
    de[i] += scale * (lambda_r * advantage * alpha[i] + lambda_e * alpha[i] * (log_a + (float)H));
  }
  de[s] -= scale * lambda_r * advantage;
}

static int sample_index(const float* p, int n, double u) {
  double acc = 0;
  for (int i = 0; i < n; ++i)
    if ((acc += p[i]) > u) return i;
  for (int i = n - 1; i >= 0; --i)
    if (p[i] > 0) return i;
  return n - 1;
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
  if (score_) score_->precompute(F, B);
  C.alpha_sum.setZero(B, L);
  Mat cov = Mat::Zero(B, L);
  const bool hard = cfg_.hard();
  if (hard) {
    C.glimpse.assign(T, Mat());
    C.location.assign(T, std::vector<int>(B, -1));
    C.soft_step.assign(T, std::vector<char>(B, 1));
  }
  std::vector<double> logp_caption(B, 0.0);

  auto E = value_of(P(kEmbed));
  DecoderLoss loss;
  double ce = 0, entropy = 0;
  int64_t hard_steps = 0;
  Mat emb(B, cfg_.embed_dim), e;
  for (int t = 0; t < T; ++t) {
    for (int b = 0; b < B; ++b) emb.row(b) = E.row(batch.input[(size_t)b * T + t]);
    const Mat& hp = C.h[t];
    if (!score_) {  // no attention: no context at all (zero-width, so the context products vanish)
      C.z[t].resize(B, 0);
    } else {
      score_->forward(t, hp, cfg_.coverage ? &cov : nullptr, e, true);
      softmax_rows(e);
      C.alpha[t] = e;
      if (cfg_.coverage) cov += e;
      for (int b = 0; b < B; ++b) C.alpha_sum.row(b) += batch.mask[(size_t)b * T + t] * C.alpha[t].row(b);
      if (hard) {
        // s ~ Categorical(alpha); in training, with probability hard_soft_prob the step takes the expected context.
        Mat& W = C.glimpse[t];
        W = C.alpha[t];
        for (int b = 0; b < B; ++b) {
          bool soft = training && rng && rng->uniform() < cfg_.hard_soft_prob;
          int s = training && rng ? sample_index(&C.alpha[t](b, 0), L, rng->uniform()) : 0;
          if (!training || !rng) C.alpha[t].row(b).maxCoeff(&s);
          C.location[t][b] = s;
          C.soft_step[t][b] = soft;
          if (!soft) glimpse_weights(s, &W(b, 0));
          if (!soft && batch.mask[(size_t)b * T + t] > 0) {
            double h = 0;
            for (int i = 0; i < L; ++i) h -= C.alpha[t](b, i) > 0 ? C.alpha[t](b, i) * std::log(C.alpha[t](b, i)) : 0.0;
            entropy += h, ++hard_steps;
          }
        }
        context(F, W, C.z[t]);
      } else {
        context(F, C.alpha[t], C.z[t]);
      }
    }
    if (cfg_.gate && score_) {
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
      double lp = std::log(std::max(C.probs[t](b, y), 1e-30f));
      ce -= lp;
      logp_caption[b] += lp;
      loss.tokens++;
    }
  }
  if (hard) {
    // REINFORCE with a moving-average baseline: the advantage of each caption is log p(y | s) - b, and
    // b <- 0.9 b + 0.1 mean log p(y | s) after the batch (training only).
    float& baseline = params_[kNumParams].value[0];
    C.advantage.assign(B, 0.0);
    double mean_logp = 0;
    for (int b = 0; b < B; ++b) C.advantage[b] = logp_caption[b] - baseline, mean_logp += logp_caption[b] / B;
    for (double a : C.advantage) loss.advantage_mean += a / B;
    for (double a : C.advantage) loss.advantage_var += (a - loss.advantage_mean) * (a - loss.advantage_mean) / B;
    loss.entropy = hard_steps ? entropy / hard_steps : 0.0;
    if (training) baseline = 0.9f * baseline + 0.1f * (float)mean_logp;
  }
  loss.cross_entropy = loss.tokens ? ce / loss.tokens : 0;
  loss.penalty = score_ ? penalty_weight * (1.f - C.alpha_sum.array()).square().mean() : 0.0;
  return loss;
}

void Decoder::backward(DecoderCache& C, Mat* dF) {
  const int B = C.B, T = C.T, L = cfg_.locations(), n = cfg_.hidden_dim, D = cfg_.feature_dim;
  const CaptionBatch& batch = *C.batch;
  const Mat& F = *C.F;
  const bool hard = cfg_.hard();
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

    if (score_) {
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

      // context z = W F (W = alpha, or the glimpse of hard attention), then the penalty, then softmax
      const Mat& W = hard ? C.glimpse[t] : C.alpha[t];
      Mat dalpha(B, L);
#pragma omp parallel for schedule(static)
      for (int b = 0; b < B; ++b) {
        dalpha.row(b).noalias() = dz.row(b) * F.middleRows(b * L, L).transpose();
        if (dF) dF->middleRows(b * L, L).noalias() += W.row(b).transpose() * dz.row(b);
        if (hard && !C.soft_step[t][b]) dalpha.row(b).setZero();  // a sampled glimpse does not depend on alpha
        dalpha.row(b) += batch.mask[(size_t)b * T + t] * dS.row(b);
      }
      if (cfg_.coverage) dalpha += dcov_later;
      const Mat& a = C.alpha[t];
      Eigen::ArrayXf dot = (a.cwiseProduct(dalpha)).rowwise().sum().array();
      Mat de = (a.array() * (dalpha.array().colwise() - dot)).matrix();
      if (hard) {
        // Surrogate of the lower bound (Xu et al. eq. 12), per sampled step and normalized like the cross-entropy:
        //   - lambda_r (log p(y|s) - b) log alpha_s - lambda_e H(alpha)
        // d/de log alpha_s = onehot(s) - alpha;  d/de H = -alpha (log alpha + H).
        for (int b = 0; b < B; ++b) {
          const float m = batch.mask[(size_t)b * T + t] * inv_tokens;
          if (C.soft_step[t][b] || m == 0) continue;
          add_reinforce_grad(&a(b, 0), L, C.location[t][b], (float)C.advantage[b], cfg_.reinforce_weight,
                             cfg_.entropy_weight, m, &de(b, 0));
        }
      }
      score_->backward(t, de, dh_prev, dF, cfg_.coverage ? &dcov : nullptr);
      if (cfg_.coverage) dcov_later += dcov;
    }

    for (int b = 0; b < B; ++b) gE.row(batch.input[(size_t)b * T + t]) += demb.row(b);
    dh_next = std::move(dh_prev);
    dc_next = std::move(dc_prev);
  }
  if (score_) score_->finish_backward(dF);

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
  st.location.assign(B, -1);
  st.rng = Rng(12345);
  if (score_) score_->precompute(st.F, B);
}

void Decoder::step(const std::vector<int>& tokens, State& st, Mat& logprobs, Mat& alpha) {
  const int B = (int)st.h.rows(), n = cfg_.hidden_dim;
  auto E = value_of(P(kEmbed));
  Mat emb(B, cfg_.embed_dim);
  for (int b = 0; b < B; ++b) emb.row(b) = E.row(tokens[b]);
  const int L = cfg_.locations();
  Mat z;
  if (!score_) {
    alpha = Mat::Zero(B, L);  // nothing attended
    z.resize(B, 0);
  } else {
    score_->forward(0, st.h, &st.coverage, alpha, false);
    softmax_rows(alpha);
    st.coverage += alpha;
    if (cfg_.hard()) {  // the glimpse at the argmax location (or a seeded sample)
      Mat W(B, L);
      st.location.resize(B);
      for (int b = 0; b < B; ++b) {
        int s = 0;
        if (cfg_.hard_sample_at_test) s = sample_index(&alpha(b, 0), L, st.rng.uniform());
        else alpha.row(b).maxCoeff(&s);
        st.location[b] = s;
        glimpse_weights(s, &W(b, 0));
      }
      context(st.F, W, z);
    } else {
      context(st.F, alpha, z);
    }
  }
  if (cfg_.gate && score_) {
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
  std::vector<int> loc(rows.size(), -1);
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r] < (int)st.location.size()) loc[r] = st.location[rows[r]];
  st.h = std::move(h), st.c = std::move(c), st.F = std::move(F), st.coverage = std::move(cov);
  st.location = std::move(loc);
  if (score_) score_->select_rows(rows);
}

}  // namespace sat
