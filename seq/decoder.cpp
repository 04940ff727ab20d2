#include "seq/decoder.hpp"
#include "seq/few_rows.hpp"

#include <cmath>

namespace sat {

nlohmann::json DecoderConfig::to_json() const {
  return {{"vocab_size", vocab_size},
          {"embed_dim", embed_dim},
          {"hidden_dim", hidden_dim},
          {"attn_dim", attn_dim},
          {"feature_dim", feature_dim},
          {"grid_h", grid_h},
          {"grid_w", grid_w},
          {"dropout", dropout},
          {"attention", attention},
          {"score", score},
          {"order", order},
          {"gate", gate},
          {"coverage", coverage},
          {"local_sigma", local_sigma},
          {"hard_window", hard_window},
          {"hard_soft_prob", hard_soft_prob},
          {"reinforce_weight", reinforce_weight},
          {"entropy_weight", entropy_weight},
          {"hard_sample_at_test", hard_sample_at_test}};
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
  if (c.order != "bahdanau" && c.order != "luong" && c.order != "updown")
    throw Error("decoder config: unknown order '" + c.order + "' (bahdanau, luong, updown)");
  return c;
}

int64_t CaptionBatch::real_tokens() const {
  int64_t tokens = 0;
  for (float m : mask) tokens += m > 0;
  return tokens;
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
  DecoderParams& p = params_;
  p.embed = Param("embed.weight", {V, m});
  p.init_h = {Param("init_h.weight", {D, n}), Param("init_h.bias", {n})};
  p.init_c = {Param("init_c.weight", {D, n}), Param("init_c.bias", {n})};
  p.gate = {Param("gate.weight", {n, 1}), Param("gate.bias", {1})};
  // The LSTM's second input: the context (bahdanau; none without attention), h~_{t-1} (luong, input feeding) or the
  // language LSTM's h2_{t-1} (updown).
  const int Dc = cfg.attends() ? D : 0;
  p.lstm = {Param("lstm.weight_emb", {m, 4 * n}),
            Param("lstm.weight_ctx", {cfg.luong() || cfg.updown() ? n : Dc, 4 * n}),
            Param("lstm.weight_hh", {n, 4 * n}), Param("lstm.bias", {4 * n})};
  p.out = {Param("out.hidden", {n, m}),
           Param("out.context", {cfg.luong() ? 0 : Dc, m}),  // luong: the context is inside h~
           Param("out.weight", {m, V}), Param("out.bias", {V})};
  if (cfg.hard()) p.reinforce_baseline = Param("attention.reinforce_baseline", {1}, false);
  if (cfg.luong())
    p.combine = {Param("combine.weight_ctx", {Dc, n}), Param("combine.weight_h", {n, n}), Param("combine.bias", {n})};
  if (cfg.updown()) {
    p.updown.att_lstm_W_mean = Param("lstm.weight_mean", {D, 4 * n});
    p.updown.lang_lstm = {Param("lstm2.weight_ctx", {Dc, 4 * n}), Param("lstm2.weight_in", {n, 4 * n}),
                          Param("lstm2.weight_hh", {n, 4 * n}), Param("lstm2.bias", {4 * n})};
    p.updown.init_h2 = {Param("init_h2.weight", {D, n}), Param("init_h2.bias", {n})};
    p.updown.init_c2 = {Param("init_c2.weight", {D, n}), Param("init_c2.bias", {n})};
  }
  if (!cfg.attends()) return;
  ScoreSpec spec;
  spec.kind = cfg.score;
  spec.feature_dim = D, spec.hidden_dim = n, spec.attn_dim = cfg.attn_dim;
  spec.grid_h = cfg.grid_h, spec.grid_w = cfg.grid_w;
  spec.coverage = cfg.coverage;
  spec.local = cfg.attention == "local";
  spec.local_sigma = cfg.local_sigma;
  score_ = make_score(spec);
  score_->set_products(&products_);
}

std::vector<Param*> Decoder::params() {
  products_.invalidate();  // the caller may change them
  DecoderParams& p = params_;
  std::vector<Param*> out = {&p.embed,  &p.init_h.W,     &p.init_h.b,      &p.init_c.W,    &p.init_c.b,
                             &p.gate.W, &p.gate.b,       &p.lstm.W_in,     &p.lstm.W_x,    &p.lstm.W_hh,
                             &p.lstm.b, &p.out.W_hidden, &p.out.W_context, &p.out.W_vocab, &p.out.b};
  if (cfg_.hard()) out.push_back(&p.reinforce_baseline);
  if (cfg_.luong()) out.insert(out.end(), {&p.combine.W_ctx, &p.combine.W_h, &p.combine.b});
  if (cfg_.updown()) {
    UpDownParams& u = p.updown;
    out.insert(out.end(), {&u.att_lstm_W_mean, &u.lang_lstm.W_in, &u.lang_lstm.W_x, &u.lang_lstm.W_hh, &u.lang_lstm.b,
                           &u.init_h2.W, &u.init_h2.b, &u.init_c2.W, &u.init_c2.b});
  }
  if (score_)
    for (Param* score_param : score_->params()) out.push_back(score_param);
  return out;
}

void Decoder::init(Rng& rng) {
  const int n = cfg_.hidden_dim, m = cfg_.embed_dim, D = cfg_.feature_dim;
  DecoderParams& p = params_;
  // Word vectors start at unit variance (uniform in ±√3), as PyTorch's nn.Embedding's N(0, 1): with ±0.1 the
  // previous word barely reached the deep output at first, and one Flickr8k epoch ended at loss 4.72 instead of 4.58.
  // The draws' order is part of what a seed gives: a change here changes every model trained from a seed.
  init_uniform(p.embed, rng, std::sqrt(3.0));
  init_uniform(p.init_h.W, rng, 1 / std::sqrt((double)D));
  init_uniform(p.init_c.W, rng, 1 / std::sqrt((double)D));
  init_uniform(p.gate.W, rng, 1 / std::sqrt((double)n));
  init_uniform(p.lstm.W_in, rng, 1 / std::sqrt((double)n));
  init_uniform(p.lstm.W_x, rng, 1 / std::sqrt((double)n));
  if (cfg_.luong()) {
    init_uniform(p.combine.W_ctx, rng, 1 / std::sqrt((double)D));
    init_uniform(p.combine.W_h, rng, 1 / std::sqrt((double)n));
  }
  init_uniform(p.lstm.W_hh, rng, 1 / std::sqrt((double)n));
  for (int k = 0; k < n; ++k) p.lstm.b.value[n + k] = 1.f;  // forget-gate bias 1: remember by default
  init_uniform(p.out.W_hidden, rng, 1 / std::sqrt((double)n));
  init_uniform(p.out.W_context, rng, 1 / std::sqrt((double)D));
  init_uniform(p.out.W_vocab, rng, 1 / std::sqrt((double)m));
  if (cfg_.hard()) p.reinforce_baseline.value[0] = 0.f;
  if (cfg_.updown()) {
    UpDownParams& u = p.updown;
    init_uniform(u.att_lstm_W_mean, rng, 1 / std::sqrt((double)n));
    init_uniform(u.lang_lstm.W_in, rng, 1 / std::sqrt((double)n));
    init_uniform(u.lang_lstm.W_x, rng, 1 / std::sqrt((double)n));
    init_uniform(u.lang_lstm.W_hh, rng, 1 / std::sqrt((double)n));
    for (int k = 0; k < n; ++k) u.lang_lstm.b.value[n + k] = 1.f;  // forget-gate bias 1
    init_uniform(u.init_h2.W, rng, 1 / std::sqrt((double)D));
    init_uniform(u.init_c2.W, rng, 1 / std::sqrt((double)D));
  }
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

std::vector<double> leave_one_out_advantages(const std::vector<double>& rewards, int K) {
  if (K < 2 || rewards.size() % K)
    throw Error("leave_one_out_advantages: the group size must be at least 2 and divide the batch");
  std::vector<double> adv(rewards.size());
  for (size_t g = 0; g < rewards.size(); g += K) {
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += rewards[g + k];
    for (int k = 0; k < K; ++k) adv[g + k] = rewards[g + k] - (sum - rewards[g + k]) / (K - 1);
  }
  return adv;
}

static int sample_index(const float* p, int n, double u) {
  double acc = 0;
  for (int i = 0; i < n; ++i)
    if ((acc += p[i]) > u) return i;
  for (int i = n - 1; i >= 0; --i)
    if (p[i] > 0) return i;
  return n - 1;
}

void Decoder::context(const Mat& F, const Bf16Rows* F16, const RowGrids& rows, const Mat& alpha, Mat& z) const {
  const int B = (int)alpha.rows(), L = cfg_.locations(), D = cfg_.feature_dim;
  z.resize(B, D);
  if (F16 && !F16->empty()) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b)
      weighted_sum_of_rows_bf16(&alpha(b, 0), F16->row((int64_t)rows.grid[b] * L), L, D, &z(b, 0));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; ++b) z.row(b).noalias() = alpha.row(b) * F.middleRows((int64_t)rows.grid[b] * L, L);
}

// Mean feature of each row's grid (computed once per grid).
static Mat mean_features(const Mat& F, const RowGrids& rows, int L) {
  Mat mean(rows.row_count(), F.cols());
  for (int g = 0; g < rows.grid_count(); ++g) {
    if (rows.rows[g].empty()) continue;
    Eigen::RowVectorXf m = F.middleRows((int64_t)g * L, L).colwise().mean();
    for (int b : rows.rows[g]) mean.row(b) = m;
  }
  return mean;
}

Mat Decoder::init_state(const Mat& mean, AffineParams& init) {
  Mat s;
  products_.times(mean, value_of(init.W), s, false);
  s.rowwise() += value_of(init.b).row(0);
  return s.array().tanh().matrix();
}

static Mat sigmoid(const Mat& x) {
  return (1.f / (1.f + (-x.array()).exp())).matrix();
}

void Decoder::dropout_mask(float* mask, int rows, int cols, Draws& draws) const {
  const float p = cfg_.dropout;
  if (!draws.any() || p <= 0) {
    std::fill(mask, mask + (int64_t)rows * cols, 1.f);
    return;
  }
  const float keep = 1.f / (1.f - p);
  for (int b = 0; b < rows; ++b) {
    float* d = mask + (int64_t)b * cols;
    for (int k = 0; k < cols; ++k) d[k] = draws.uniform(b) >= p ? keep : 0.f;
  }
}

// The normalizers of the loss: real tokens and rows of the batch, or of the global batch it is a share of.
static float inverse_tokens(const CaptionBatch& batch) {
  const int64_t tokens = batch.norm_tokens > 0 ? batch.norm_tokens : batch.real_tokens();
  return tokens ? 1.f / tokens : 0.f;
}
static int normalizing_rows(const CaptionBatch& batch) {
  return batch.norm_rows > 0 ? batch.norm_rows : batch.B;
}

void Decoder::attend_step(int t, const Mat& q, Mat& cov, Draws& draws, DecoderCache& C, double& entropy,
                          int64_t& hard_steps) {
  const int B = C.B, T = C.T, L = cfg_.locations();
  const CaptionBatch& batch = *C.batch;
  const Mat& F = *C.F;
  if (!score_) {  // no attention: no context at all (zero-width, so the context products vanish)
    C.z[t].resize(B, 0);
    C.zhat[t].resize(B, 0);
    return;
  }
  Mat e;
  score_->forward(t, q, cfg_.coverage ? &cov : nullptr, e, true);
  softmax_rows(e);
  C.alpha[t] = e;
  if (cfg_.coverage) cov += e;
  for (int b = 0; b < B; ++b) C.alpha_sum.row(b) += batch.mask[(size_t)b * T + t] * C.alpha[t].row(b);
  if (cfg_.hard()) {
    // s ~ Categorical(alpha); in training, with probability hard_soft_prob the step takes the expected context.
    Mat& W = C.glimpse[t];
    W = C.alpha[t];
    for (int b = 0; b < B; ++b) {
      bool soft = draws.any() && draws.uniform(b) < cfg_.hard_soft_prob;
      int s = draws.any() ? sample_index(&C.alpha[t](b, 0), L, draws.uniform(b)) : 0;
      if (!draws.any()) C.alpha[t].row(b).maxCoeff(&s);
      C.location[t][b] = s;
      C.soft_step[t][b] = soft;
      if (!soft) glimpse_weights(s, &W(b, 0));
      if (!soft && batch.mask[(size_t)b * T + t] > 0) {
        double h = 0;
        for (int i = 0; i < L; ++i) h -= C.alpha[t](b, i) > 0 ? C.alpha[t](b, i) * std::log(C.alpha[t](b, i)) : 0.0;
        entropy += h, ++hard_steps;
      }
    }
    context(F, &C.F16, C.rows, W, C.z[t]);
  } else {
    context(F, &C.F16, C.rows, C.alpha[t], C.z[t]);
  }
  if (cfg_.gate) {
    C.beta[t] = sigmoid((q * value_of(params_.gate.W)).array() + params_.gate.b.value[0]);
    C.zhat[t] = C.z[t].array().colwise() * C.beta[t].col(0).array();
  } else {
    C.zhat[t] = C.z[t];
  }
}

// One LSTM step of weights W: gates from (in, x, h), then c and h (in: the word vectors, or the context for the
// Up-Down order's language LSTM). gates keeps the activated gates for backward.
static void lstm_activate(Mat& g, const Mat& c, Mat& c_next, Mat* tanh_c, Mat& h_next);
static void lstm_step(Products& P, const Mat& in, const Mat& x, const Mat& h, const Mat& c, LstmParams& W, Mat& gates,
                      Mat& c_next, Mat* tanh_c, Mat& h_next) {
  Mat& g = gates;  // a float32 search's few rows: the few-rows product (seq/few_rows.hpp)
  times(P, in, value_of(W.W_in), g, false);
  times(P, x, value_of(W.W_x), g, true);
  times(P, h, value_of(W.W_hh), g, true);
  g.rowwise() += value_of(W.b).row(0);
  lstm_activate(g, c, c_next, tanh_c, h_next);
}

// The same when the embedding's part of the gates (emb W_in + b) is already computed: emb_part.
template <class Rows>
static void lstm_step_from(Products& P, const Rows& emb_part, const Mat& x, const Mat& h, const Mat& c, LstmParams& W,
                           Mat& gates, Mat& c_next, Mat* tanh_c, Mat& h_next) {
  Mat& g = gates;
  g = emb_part;
  P.times(x, value_of(W.W_x), g, true);
  P.times(h, value_of(W.W_hh), g, true);
  lstm_activate(g, c, c_next, tanh_c, h_next);
}

// gates (pre-activation, i f o g) -> activated in place; c and h of the next step.
// Row by row, so that each row's gates, cell and state are read from memory once and every later pass over them
// hits the first-level cache (the whole B x 4n block at once took six passes through memory).
static void lstm_activate(Mat& g, const Mat& c, Mat& c_next, Mat* tanh_c, Mat& h_next) {
  const int B = (int)g.rows(), n = (int)c.cols();
  c_next.resize(B, n), h_next.resize(B, n);
  if (tanh_c) tanh_c->resize(B, n);
  using Row = Eigen::Map<Eigen::ArrayXf>;
  for (int b = 0; b < B; ++b) {
    Row ifo(&g(b, 0), 3 * n), gg(&g(b, 3 * n), n), cn(&c_next(b, 0), n), h(&h_next(b, 0), n);
    ifo = 1.f / (1.f + (-ifo).exp());
    gg = gg.tanh();
    cn = Row(&g(b, n), n) * Eigen::Map<const Eigen::ArrayXf>(&c(b, 0), n) + Row(&g(b, 0), n) * gg;
    if (tanh_c) {
      Row tc(&(*tanh_c)(b, 0), n);
      tc = cn.tanh();
      h = Row(&g(b, 2 * n), n) * tc;
    } else {
      h = Row(&g(b, 2 * n), n) * cn.tanh();
    }
  }
}

DecoderLoss Decoder::forward(const Mat& F, const CaptionBatch& batch, float penalty_weight, bool training, Rng* rng,
                             DecoderCache& C) {
  const int B = batch.B, T = batch.T, L = cfg_.locations(), n = cfg_.hidden_dim;
  const int64_t grids = batch.grid.empty() ? B : F.rows() / L;
  if (F.rows() != grids * L || F.cols() != cfg_.feature_dim)
    throw Error("decoder: features are " + std::to_string(F.rows()) + "x" + std::to_string(F.cols()) + ", expected " +
                std::to_string(grids * L) + "x" + std::to_string(cfg_.feature_dim));
  if (!batch.grid.empty() && (int)batch.grid.size() != B)
    throw Error("decoder: grid has " + std::to_string(batch.grid.size()) + " entries for " + std::to_string(B) +
                " rows");
  if (!batch.row_weight.empty() && (int)batch.row_weight.size() != B)
    throw Error("decoder: row_weight has " + std::to_string(batch.row_weight.size()) + " entries for " +
                std::to_string(B) + " rows");
  if (!batch.row_seed.empty() && (int)batch.row_seed.size() != B)
    throw Error("decoder: row_seed has " + std::to_string(batch.row_seed.size()) + " entries for " + std::to_string(B) +
                " rows");
  products_.invalidate();  // once per training step: the bf16 copies follow the optimizer's last update
  Draws draws;
  if (training && !batch.row_seed.empty())
    for (uint64_t seed : batch.row_seed) draws.rows.emplace_back(seed);
  else if (training)
    draws.shared = rng;
  C.B = B, C.T = T, C.F = &F, C.batch = &batch, C.penalty_weight = penalty_weight;
  C.rows = batch.grid.empty() ? RowGrids::identity(B) : RowGrids(batch.grid, (int)grids);
  for (auto* v : {&C.h, &C.c}) v->assign(T + 1, Mat());
  for (auto* v : {&C.alpha, &C.z, &C.beta, &C.zhat, &C.gates, &C.tanh_c}) v->assign(T, Mat());
  const int64_t TB = (int64_t)T * B;
  const int En = cfg_.embed_dim;
  C.hd.resize(TB, n);
  C.hdrop_mask.resize(TB, n);
  C.odrop_mask.resize(TB, En);
  const bool luong = cfg_.luong(), updown = cfg_.updown();
  C.htilde.assign(luong ? T : 0, Mat());
  if (luong) C.zero_feed.setZero(B, n);
  for (auto* v : {&C.h2, &C.c2}) v->assign(updown ? T + 1 : 0, Mat());
  for (auto* v : {&C.gates2, &C.tanh_c2}) v->assign(updown ? T : 0, Mat());

  C.mean_feat = mean_features(F, C.rows, L);
  C.h[0] = init_state(C.mean_feat, params_.init_h);
  C.c[0] = init_state(C.mean_feat, params_.init_c);
  if (updown) {
    C.h2[0] = init_state(C.mean_feat, params_.updown.init_h2);
    C.c2[0] = init_state(C.mean_feat, params_.updown.init_c2);
    products_.times(C.mean_feat, value_of(params_.updown.att_lstm_W_mean), C.mean_gates, false);
  }
  // bf16 products: the attention's per-row passes read the grids in bf16 (seq/grid_bf16.hpp)
  if (score_ && products_.precision() == ProductPrecision::bf16)
    round_rows_bf16(F, C.F16);
  else
    C.F16.clear();
  if (score_) score_->precompute(F, C.rows);
  C.alpha_sum.setZero(B, L);
  Mat cov = Mat::Zero(B, L);
  const bool hard = cfg_.hard();
  if (hard) {
    C.glimpse.assign(T, Mat());
    C.location.assign(T, std::vector<int>(B, -1));
    C.soft_step.assign(T, std::vector<char>(B, 1));
  }
  std::vector<double> logp_caption(B, 0.0), logp_step(hard ? (size_t)B * T : 0, 0.0);

  auto E = value_of(params_.embed);
  DecoderLoss loss;
  double ce = 0, wce = 0, entropy = 0;
  int64_t hard_steps = 0;
  // The words read at every step, and their part of the LSTM's gates, as one product over all T*B rows (step t's
  // rows t*B .. t*B + B - 1): only the recurrent parts stay in the loop.
  C.emb.resize(TB, En);
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < B; ++b) C.emb.row((int64_t)t * B + b) = E.row(batch.input[(size_t)b * T + t]);
  Mat emb_gates;
  products_.times(C.emb, value_of(params_.lstm.W_in), emb_gates, false);
  emb_gates.rowwise() += value_of(params_.lstm.b).row(0);
  for (int t = 0; t < T; ++t) {
    const int64_t r = (int64_t)t * B;
    const Mat* out_hidden;  // what the output layer reads: h_t (bahdanau), h~_t (luong) or h2_t (updown)
    if (updown) {
      lstm_step_from(products_, emb_gates.middleRows(r, B) + C.mean_gates, C.h2[t], C.h[t], C.c[t], params_.lstm,
                     C.gates[t], C.c[t + 1], &C.tanh_c[t], C.h[t + 1]);
      attend_step(t, C.h[t + 1], cov, draws, C, entropy, hard_steps);
      lstm_step(products_, C.zhat[t], C.h[t + 1], C.h2[t], C.c2[t], params_.updown.lang_lstm, C.gates2[t], C.c2[t + 1],
                &C.tanh_c2[t], C.h2[t + 1]);
      out_hidden = &C.h2[t + 1];
    } else if (!luong) {
      attend_step(t, C.h[t], cov, draws, C, entropy, hard_steps);
      lstm_step_from(products_, emb_gates.middleRows(r, B), C.zhat[t], C.h[t], C.c[t], params_.lstm, C.gates[t],
                     C.c[t + 1], &C.tanh_c[t], C.h[t + 1]);
      out_hidden = &C.h[t + 1];
    } else {
      const Mat& feed = t ? C.htilde[t - 1] : C.zero_feed;
      lstm_step_from(products_, emb_gates.middleRows(r, B), feed, C.h[t], C.c[t], params_.lstm, C.gates[t], C.c[t + 1],
                     &C.tanh_c[t], C.h[t + 1]);
      attend_step(t, C.h[t + 1], cov, draws, C, entropy, hard_steps);
      Mat u;
      products_.times(C.zhat[t], value_of(params_.combine.W_ctx), u, false);
      products_.times(C.h[t + 1], value_of(params_.combine.W_h), u, true);
      u.rowwise() += value_of(params_.combine.b).row(0);
      C.htilde[t] = u.array().tanh().matrix();
      out_hidden = &C.htilde[t];
    }

    // the masks are drawn here, in the order every step draws its random numbers
    // (straight into the step's rows of the masks: no copy)
    dropout_mask(&C.hdrop_mask(r, 0), B, n, draws);
    C.hd.middleRows(r, B) = out_hidden->cwiseProduct(C.hdrop_mask.middleRows(r, B));
    dropout_mask(&C.odrop_mask(r, 0), B, En, draws);
  }
  // The deep output layer and the words' probabilities read nothing the recurrence needs: every step's at once, in
  // products of T*B rows (near the machine's peak, where T products of B rows are not).
  Mat pre = C.emb;
  products_.times(C.hd, value_of(params_.out.W_hidden), pre, true);
  if (!luong) {
    C.zhat_all.resize(TB, C.zhat[0].cols());
    for (int t = 0; t < T; ++t) C.zhat_all.middleRows((int64_t)t * B, B) = C.zhat[t];
    products_.times(C.zhat_all, value_of(params_.out.W_context), pre, true);
  }
  C.out_tanh = pre.array().tanh().matrix();
  C.od = C.out_tanh.cwiseProduct(C.odrop_mask);
  products_.times(C.od, value_of(params_.out.W_vocab), C.probs, false);
  C.probs.rowwise() += value_of(params_.out.b).row(0);
  softmax_rows(C.probs);
  const double eps = batch.label_smoothing;
  if (eps < 0 || eps >= 1) throw Error("decoder: label smoothing must be in [0, 1)");
  if (!batch.word_weight.empty() && (int64_t)batch.word_weight.size() != C.probs.cols())
    throw Error("decoder: " + std::to_string(batch.word_weight.size()) + " word weights for a vocabulary of " +
                std::to_string(C.probs.cols()));
  for (int t = 0; t < T; ++t) {
    for (int b = 0; b < B; ++b) {
      if (batch.mask[(size_t)b * T + t] == 0) continue;
      int y = batch.target[(size_t)b * T + t];
      const int64_t r = (int64_t)t * B + b;
      double lp = std::log(std::max(C.probs(r, y), 1e-30f));
      ce -= lp;
      double trained = -lp;  // this token's term of the objective backward differentiates
      if (eps > 0) trained = -(1 - eps) * lp - eps * (double)C.probs.row(r).array().max(1e-30f).log().mean();
      if (!batch.word_weight.empty()) trained *= batch.word_weight[y];
      wce += (batch.row_weight.empty() ? 1.0 : batch.row_weight[b]) * trained;
      logp_caption[b] += lp;
      if (hard) logp_step[(size_t)b * T + t] = lp;
      loss.tokens++;
    }
  }
  if (hard) {
    // REINFORCE weights. One sample per caption (Xu et al.): every step of a caption gets log p(y | s) - b with the
    // moving-average baseline b <- 0.9 b + 0.1 mean log p(y | s) (updated after the batch, training only).
    // Several samples per caption: step t gets its reward-to-go R_t = sum_{u >= t} log p(y_u | s) (the words before
    // t do not depend on s_t) minus the mean R_t of the caption's other samples. Both are unbiased; the second
    // removes the caption's own difficulty from the weights, which is most of their variance.
    float& baseline = params_.reinforce_baseline.value[0];
    C.advantage.assign((size_t)B * T, 0.0);
    const int K = batch.samples;
    if (K >= 2 && B % K == 0) {
      std::vector<double> reward(B, 0.0);
      for (int t = T - 1; t >= 0; --t) {
        for (int b = 0; b < B; ++b) reward[b] += logp_step[(size_t)b * T + t];
        const std::vector<double> adv = leave_one_out_advantages(reward, K);
        for (int b = 0; b < B; ++b) C.advantage[(size_t)b * T + t] = adv[b];
      }
    } else {
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) C.advantage[(size_t)b * T + t] = logp_caption[b] - baseline;
    }
    double mean_logp = 0;
    for (int b = 0; b < B; ++b) mean_logp += logp_caption[b] / B;
    std::vector<double> weights;  // statistics over the steps that sampled a location
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        if (batch.mask[(size_t)b * T + t] > 0 && !C.soft_step[t][b]) weights.push_back(C.advantage[(size_t)b * T + t]);
    loss.advantage_count = (int64_t)weights.size();
    for (double w : weights) loss.advantage_mean += w / weights.size();
    for (double w : weights)
      loss.advantage_var += (w - loss.advantage_mean) * (w - loss.advantage_mean) / weights.size();
    loss.entropy = hard_steps ? entropy / hard_steps : 0.0;
    if (training) baseline = 0.9f * baseline + 0.1f * (float)mean_logp;
  }
  loss.cross_entropy = loss.tokens ? ce / loss.tokens : 0;
  loss.weighted = !batch.row_weight.empty() || !batch.word_weight.empty();
  loss.smoothed = eps > 0;
  loss.trained_cross_entropy = loss.tokens ? wce / loss.tokens : 0;
  loss.penalty = score_ ? penalty_weight * (1.f - C.alpha_sum.array()).square().mean() : 0.0;
  return loss;
}

void Decoder::attend_backward(int t, const Mat& q, const Mat& dzhat, const Mat& dS, Mat& dcov_later, DecoderCache& C,
                              Mat& dq, Mat* dF) {
  if (!score_) return;
  const int B = C.B, T = C.T, L = cfg_.locations();
  const CaptionBatch& batch = *C.batch;
  const Mat& F = *C.F;
  const bool hard = cfg_.hard();
  // gate beta
  Mat dz;
  if (cfg_.gate) {
    Eigen::ArrayXf beta = C.beta[t].col(0).array();
    Eigen::ArrayXf dbeta = (dzhat.cwiseProduct(C.z[t])).rowwise().sum().array();
    dz = dzhat.array().colwise() * beta;
    Mat ds = (dbeta * beta * (1.f - beta)).matrix();  // B x 1
    grad_of(params_.gate.W).noalias() += q.transpose() * ds;
    params_.gate.b.ensure_grad();
    params_.gate.b.grad[0] += ds.sum();
    dq.noalias() += ds * value_of(params_.gate.W).transpose();
  } else {
    dz = dzhat;
  }

  // context z = W F (W = alpha, or the glimpse of hard attention), then the penalty, then softmax
  // and the softmax's backward de = alpha * (dalpha - alpha . dalpha), each row as soon as its dalpha is made, while
  // it is still in the first-level cache (de holds dalpha until then)
  const Mat& W = hard ? C.glimpse[t] : C.alpha[t];
  const Mat& a = C.alpha[t];
  Mat de(B, L);
#pragma omp parallel for schedule(dynamic)
  for (int g = 0; g < C.rows.grid_count(); ++g)  // by grid: no two threads add into one grid's dF
    for (int b : C.rows.rows[g]) {
      auto d = de.row(b);
      if (C.F16.empty())
        d.noalias() = dz.row(b) * F.middleRows((int64_t)g * L, L).transpose();
      else
        rows_dot_bf16(C.F16.row((int64_t)g * L), L, (int)F.cols(), &dz(b, 0), &d(0));
      if (dF) dF->middleRows((int64_t)g * L, L).noalias() += W.row(b).transpose() * dz.row(b);
      if (hard && !C.soft_step[t][b]) d.setZero();  // a sampled glimpse does not depend on alpha
      d += batch.mask[(size_t)b * T + t] * dS.row(b);
      if (cfg_.coverage) d += dcov_later.row(b);
      const float dot = a.row(b).dot(d);
      d = (a.row(b).array() * (d.array() - dot)).matrix();
    }
  if (hard) {
    // Surrogate of the lower bound (Xu et al. eq. 12), per sampled step and normalized like the cross-entropy:
    //   - lambda_r (log p(y|s) - b) log alpha_s - lambda_e H(alpha)
    // d/de log alpha_s = onehot(s) - alpha;  d/de H = -alpha (log alpha + H).
    const float inv_tokens = inverse_tokens(batch);
    for (int b = 0; b < B; ++b) {
      const float m = batch.mask[(size_t)b * T + t] * inv_tokens;
      if (C.soft_step[t][b] || m == 0) continue;
      add_reinforce_grad(&a(b, 0), L, C.location[t][b], (float)C.advantage[(size_t)b * T + t], cfg_.reinforce_weight,
                         cfg_.entropy_weight, m, &de(b, 0));
    }
  }
  Mat dcov;
  score_->backward(t, de, dq, dF, cfg_.coverage ? &dcov : nullptr);
  // Coverage at step t sums the alphas of all earlier steps, so alpha_t gets the coverage gradients of every
  // later step: dcov_later accumulates them while time runs backward.
  if (cfg_.coverage) dcov_later += dcov;
}

// One LSTM cell's backward: from dh (this step's h) and dc_next (reaching c_t from the step after), the
// pre-activation gate gradients (i f o g) and the gradient reaching c_{t-1}. g: the activated gates; tanh_c: tanh(c_t);
// c_prev: c_{t-1}.
template <class Out>
static void lstm_cell_backward(const Mat& g, const Mat& tanh_c, const Mat& c_prev, const Mat& dh, const Mat& dc_next,
                               Out&& dgates, Mat& dc_prev) {
  const int B = (int)g.rows(), n = (int)c_prev.cols();
  dc_prev.resize(B, n);
  using In = Eigen::Map<const Eigen::ArrayXf>;
  using Row = Eigen::Map<Eigen::ArrayXf>;
  // one row at a time, as lstm_activate: the row's gates, cell and gradients stay in the first-level cache
  for (int b = 0; b < B; ++b) {
    In i(&g(b, 0), n), f(&g(b, n), n), o(&g(b, 2 * n), n), gg(&g(b, 3 * n), n), tc(&tanh_c(b, 0), n),
        cp(&c_prev(b, 0), n), dhb(&dh(b, 0), n), dcn(&dc_next(b, 0), n);
    Row dc(&dc_prev(b, 0), n);  // dc_t first, then times f: dc_{t-1}
    dc = dcn + dhb * o * (1.f - tc.square());
    float* dg = &dgates(b, 0);
    Row(dg, n) = dc * gg * i * (1.f - i);
    Row(dg + n, n) = dc * cp * f * (1.f - f);
    Row(dg + 2 * n, n) = dhb * tc * o * (1.f - o);
    Row(dg + 3 * n, n) = dc * i * (1.f - gg.square());
    dc *= f;
  }
}

void Decoder::backward(DecoderCache& C, Mat* dF) {
  const int B = C.B, T = C.T, L = cfg_.locations(), n = cfg_.hidden_dim, D = cfg_.feature_dim;
  const CaptionBatch& batch = *C.batch;
  const bool luong = cfg_.luong(), updown = cfg_.updown();
  if (dF) dF->setZero((int64_t)C.rows.grid_count() * L, D);
  const float inv_tokens = inverse_tokens(batch);
  // d penalty / d alpha_sum = -2 lambda (1 - S) / (B L)
  Mat dS = (-2.f * C.penalty_weight / ((float)normalizing_rows(batch) * L)) * (1.f - C.alpha_sum.array()).matrix();

  auto gE = grad_of(params_.embed);
  Mat dh_next = Mat::Zero(B, n), dc_next = Mat::Zero(B, n);
  Mat dfeed_next = Mat::Zero(B, luong ? n : 0);  // luong: gradient reaching h~_t through the next step's input
  Mat dcov_later = Mat::Zero(B, L);
  // softmax + cross-entropy, and the output layer, for all steps at once (as in forward)
  Mat dlogits = C.probs;
  const float eps = batch.label_smoothing, eps_per_word = eps / (float)C.probs.cols();
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < B; ++b) {
      float m = batch.mask[(size_t)b * T + t] * inv_tokens;
      if (!batch.row_weight.empty()) m *= batch.row_weight[b];
      if (!batch.word_weight.empty()) m *= batch.word_weight[batch.target[(size_t)b * T + t]];
      const int64_t r = (int64_t)t * B + b;
      dlogits.row(r) *= m;
      if (eps > 0) {  // target (1 - eps) on the word, eps / V on every word
        dlogits(r, batch.target[(size_t)b * T + t]) -= m * (1 - eps);
        dlogits.row(r).array() -= m * eps_per_word;
      } else {
        dlogits(r, batch.target[(size_t)b * T + t]) -= m;
      }
    }
  products_.add_xt_y(C.od, dlogits, grad_of(params_.out.W_vocab));
  grad_of(params_.out.b).row(0) += dlogits.colwise().sum();
  // Then the deep output layer pre = emb + hd W_oh (+ zhat W_oc), out = tanh(pre): its gradients do not depend on
  // the recurrence either, so they too are products over all T*B rows; the loop below runs the recurrence only.
  const int64_t TB = (int64_t)T * B;
  const int En = cfg_.embed_dim, Z = (int)C.zhat[0].cols();
  Mat dpre(TB, En);
  products_.times_t(dlogits, value_of(params_.out.W_vocab), dpre, false);
  dpre.array() *= C.odrop_mask.array() * (1.f - C.out_tanh.array().square());
  products_.add_xt_y(C.hd, dpre, grad_of(params_.out.W_hidden));
  if (!luong) products_.add_xt_y(C.zhat_all, dpre, grad_of(params_.out.W_context));
  Mat dout_hidden(TB, n), dzhat_out(luong ? 0 : TB, Z);
  products_.times_t(dpre, value_of(params_.out.W_hidden), dout_hidden, false);
  dout_hidden.array() *= C.hdrop_mask.array();
  if (!luong) products_.times_t(dpre, value_of(params_.out.W_context), dzhat_out, false);
  Mat& demb = dpre;  // d emb = d pre + dgates W_emb^T (added after the loop)

  // The LSTM's weight gradients are sums over steps of (input_t)^T dgates_t: the loop keeps dgates_t, the sums are
  // one product each after it.
  Mat dgates_all(TB, 4 * n);
  // updown: the language LSTM's gate gradients, and the gradients reaching its state from the step after
  Mat dgates2_all(updown ? TB : 0, 4 * n), dh2_next = Mat::Zero(B, updown ? n : 0), dc2_next = dh2_next;
  for (int t = T - 1; t >= 0; --t) {
    const int64_t r = (int64_t)t * B;
    Mat dzhat = luong ? Mat::Zero(B, Z) : Mat(dzhat_out.middleRows(r, B));
    Mat dh = dh_next;
    if (updown) {
      // h2_t, c2_t = LSTM2([zhat_t; h1_t], h2_{t-1}, c2_{t-1}), read by the output; then attention with h1_t
      Mat dh2 = dh2_next + dout_hidden.middleRows(r, B), dc2_prev;
      auto dgates2 = dgates2_all.middleRows(r, B);
      lstm_cell_backward(C.gates2[t], C.tanh_c2[t], C.c2[t], dh2, dc2_next, dgates2, dc2_prev);
      products_.times_t(dgates2, value_of(params_.updown.lang_lstm.W_hh), dh2_next, false);
      dc2_next = std::move(dc2_prev);
      products_.times_t(dgates2, value_of(params_.updown.lang_lstm.W_in), dzhat, true);
      products_.times_t(dgates2, value_of(params_.updown.lang_lstm.W_x), dh, true);
      attend_backward(t, C.h[t + 1], dzhat, dS, dcov_later, C, dh, dF);
    } else if (luong) {
      // h~ = tanh(W_c [zhat; h] + b_c), read by the output and fed to the next step
      Mat du = (dout_hidden.middleRows(r, B) + dfeed_next).array() * (1.f - C.htilde[t].array().square());
      products_.add_xt_y(C.zhat[t], du, grad_of(params_.combine.W_ctx));
      products_.add_xt_y(C.h[t + 1], du, grad_of(params_.combine.W_h));
      grad_of(params_.combine.b).row(0) += du.colwise().sum();
      products_.times_t(du, value_of(params_.combine.W_ctx), dzhat, true);
      products_.times_t(du, value_of(params_.combine.W_h), dh, true);
      attend_backward(t, C.h[t + 1], dzhat, dS, dcov_later, C, dh, dF);
    } else {
      dh += dout_hidden.middleRows(r, B);
    }

    // LSTM cell (updown: the attention LSTM)
    auto dgates = dgates_all.middleRows(r, B);
    Mat dc_prev;
    lstm_cell_backward(C.gates[t], C.tanh_c[t], C.c[t], dh, dc_next, dgates, dc_prev);
    Mat dh_prev(B, n);
    products_.times_t(dgates, value_of(params_.lstm.W_hh), dh_prev, false);
    if (updown) {
      products_.times_t(dgates, value_of(params_.lstm.W_x), dh2_next, true);  // it read h2_{t-1}
    } else if (luong) {
      products_.times_t(dgates, value_of(params_.lstm.W_x), dfeed_next, false);
    } else {
      products_.times_t(dgates, value_of(params_.lstm.W_x), dzhat, true);
      attend_backward(t, C.h[t], dzhat, dS, dcov_later, C, dh_prev, dF);
    }
    dh_next = std::move(dh_prev);
    dc_next = std::move(dc_prev);
  }
  {
    // the LSTM's inputs at every step, row-aligned with dgates_all: h_t, and x_t: the contexts forward already
    // gathered (bahdanau), the fed-back h~ (luong) or the language LSTM's h2_{t-1} (updown)
    Mat feed_all(luong || updown ? TB : 0, n), h_all(TB, n);
    for (int t = 0; t < T; ++t) {
      const int64_t r = (int64_t)t * B;
      if (luong) feed_all.middleRows(r, B) = t ? C.htilde[t - 1] : C.zero_feed;
      if (updown) feed_all.middleRows(r, B) = C.h2[t];
      h_all.middleRows(r, B) = C.h[t];
    }
    const Mat& x_all = luong || updown ? feed_all : C.zhat_all;
    if (updown) {
      // the language LSTM: inputs zhat_t and h1_t (the attention LSTM's new state), recurrent h2_{t-1}
      Mat h1_all(TB, n);
      for (int t = 0; t < T; ++t) h1_all.middleRows((int64_t)t * B, B) = C.h[t + 1];
      products_.add_xt_y(C.zhat_all, dgates2_all, grad_of(params_.updown.lang_lstm.W_in));
      products_.add_xt_y(h1_all, dgates2_all, grad_of(params_.updown.lang_lstm.W_x));
      products_.add_xt_y(feed_all, dgates2_all, grad_of(params_.updown.lang_lstm.W_hh));
      grad_of(params_.updown.lang_lstm.b).row(0) += dgates2_all.colwise().sum();
    }
    products_.add_xt_y(C.emb, dgates_all, grad_of(params_.lstm.W_in));
    products_.add_xt_y(x_all, dgates_all, grad_of(params_.lstm.W_x));
    products_.add_xt_y(h_all, dgates_all, grad_of(params_.lstm.W_hh));
    grad_of(params_.lstm.b).row(0) += dgates_all.colwise().sum();
    products_.times_t(dgates_all, value_of(params_.lstm.W_in), demb, true);
    for (int t = 0; t < T; ++t)
      for (int b = 0; b < B; ++b) gE.row(batch.input[(size_t)b * T + t]) += demb.row((int64_t)t * B + b);
  }
  if (score_) score_->finish_backward(dF);
  products_.invalidate();  // the optimizer updates the weights next

  Mat dh0 = dh_next.array() * (1.f - C.h[0].array().square());
  Mat dc0 = dc_next.array() * (1.f - C.c[0].array().square());
  products_.add_xt_y(C.mean_feat, dh0, grad_of(params_.init_h.W));
  grad_of(params_.init_h.b).row(0) += dh0.colwise().sum();
  products_.add_xt_y(C.mean_feat, dc0, grad_of(params_.init_c.W));
  grad_of(params_.init_c.b).row(0) += dc0.colwise().sum();
  Mat dmean_updown;  // updown: what reaches the mean feature through the first LSTM's input and the second's init
  if (updown) {
    Mat dgates_sum = Mat::Zero(B, 4 * n);  // the mean feature's part of the gates is the same at every step
    for (int t = 0; t < T; ++t) dgates_sum += dgates_all.middleRows((int64_t)t * B, B);
    products_.add_xt_y(C.mean_feat, dgates_sum, grad_of(params_.updown.att_lstm_W_mean));
    Mat dh20 = dh2_next.array() * (1.f - C.h2[0].array().square());
    Mat dc20 = dc2_next.array() * (1.f - C.c2[0].array().square());
    products_.add_xt_y(C.mean_feat, dh20, grad_of(params_.updown.init_h2.W));
    grad_of(params_.updown.init_h2.b).row(0) += dh20.colwise().sum();
    products_.add_xt_y(C.mean_feat, dc20, grad_of(params_.updown.init_c2.W));
    grad_of(params_.updown.init_c2.b).row(0) += dc20.colwise().sum();
    if (dF) {
      dmean_updown.resize(B, D);
      products_.times_t(dgates_sum, value_of(params_.updown.att_lstm_W_mean), dmean_updown, false);
      products_.times_t(dh20, value_of(params_.updown.init_h2.W), dmean_updown, true);
      products_.times_t(dc20, value_of(params_.updown.init_c2.W), dmean_updown, true);
    }
  }
  if (!dF) return;
  Mat dmean(B, D);
  products_.times_t(dh0, value_of(params_.init_h.W), dmean, false);
  products_.times_t(dc0, value_of(params_.init_c.W), dmean, true);
  if (updown) dmean += dmean_updown;
  dmean /= (float)L;
  for (int b = 0; b < B; ++b) dF->middleRows((int64_t)C.rows.grid[b] * L, L).rowwise() += dmean.row(b);
}

void Decoder::begin(const Mat& F, int N, State& st, int copies) {
  const int L = cfg_.locations(), B = N * copies;
  if (F.rows() != (int64_t)N * L || F.cols() != cfg_.feature_dim)
    throw Error("decoder: features have the wrong shape for this model");
  st.F = &F;
  std::vector<int> grid(B);
  for (int b = 0; b < B; ++b) grid[b] = b / copies;
  st.rows = RowGrids(std::move(grid), N);
  Mat mean = mean_features(F, st.rows, L);
  st.h = init_state(mean, params_.init_h);
  st.c = init_state(mean, params_.init_c);
  st.feed = Mat::Zero(B, cfg_.luong() ? cfg_.hidden_dim : 0);
  if (cfg_.updown()) {
    st.h2 = init_state(mean, params_.updown.init_h2);
    st.c2 = init_state(mean, params_.updown.init_c2);
    products_.times(mean, value_of(params_.updown.att_lstm_W_mean), st.mean_gates, false);
  } else {
    st.h2.resize(B, 0), st.c2.resize(B, 0), st.mean_gates.resize(B, 0);
  }
  st.coverage = Mat::Zero(B, L);
  st.location.assign(B, -1);
  st.rng = Rng(12345);
  st.word_gates_row.assign(cfg_.vocab_size, -1);
  st.word_gates.resize(0, 0);
  st.word_gates_filled = 0;
  if (score_) score_->precompute(F, st.rows);
}

void Decoder::word_gates(const std::vector<int>& tokens, State& st, Mat& gates) {
  auto E = value_of(params_.embed);
  auto W = value_of(params_.lstm.W_in);
  const int B = (int)tokens.size(), G = (int)W.cols();
  if ((int)st.word_gates_row.size() != E.rows()) st.word_gates_row.assign(E.rows(), -1), st.word_gates_filled = 0;
  std::vector<int> fresh;
  for (int w : tokens) {
    if (w < 0 || w >= E.rows()) throw Error("decoder: word " + std::to_string(w) + " is outside the vocabulary");
    if (st.word_gates_row[w] < 0) {
      st.word_gates_row[w] = st.word_gates_filled + (int)fresh.size();
      fresh.push_back(w);
    }
  }
  if (!fresh.empty()) {
    const int need = st.word_gates_filled + (int)fresh.size();
    if (need > st.word_gates.rows() || st.word_gates.cols() != G)
      st.word_gates.conservativeResize(std::max<int64_t>(need, 2 * st.word_gates.rows()), G);
    Mat emb((int)fresh.size(), E.cols());
    for (size_t i = 0; i < fresh.size(); ++i) emb.row(i) = E.row(fresh[i]);
    // The few-rows product at any count: each entry summed in the same order as a search of a few rows always did.
    if (products_.precision() != ProductPrecision::f32)
      products_.weight(operand(emb), operand(W),
                       st.word_gates.data() + (int64_t)st.word_gates_filled * st.word_gates.outerStride(),
                       st.word_gates.outerStride(), false);
    else
      few_rows_product(emb.data(), emb.outerStride(), (int)emb.rows(), (int)emb.cols(), W.data(), W.outerStride(), G,
                       st.word_gates.data() + (int64_t)st.word_gates_filled * st.word_gates.outerStride(),
                       st.word_gates.outerStride(), false);
    st.word_gates_filled = need;
  }
  gates.resize(B, G);
  for (int b = 0; b < B; ++b) gates.row(b) = st.word_gates.row(st.word_gates_row[tokens[b]]);
}

void Decoder::step_attend(const Mat& q, State& st, Mat& alpha, Mat& z) {
  const int B = (int)q.rows(), L = cfg_.locations();
  if (!score_) {
    alpha = Mat::Zero(B, L);  // nothing attended
    z.resize(B, 0);
    return;
  }
  score_->forward(0, q, &st.coverage, alpha, false);
  softmax_rows(alpha);
  st.coverage += alpha;
  if (cfg_.hard()) {  // the glimpse at the argmax location (or a seeded sample)
    Mat W(B, L);
    st.location.resize(B);
    for (int b = 0; b < B; ++b) {
      int s = 0;
      if (cfg_.hard_sample_at_test)
        s = sample_index(&alpha(b, 0), L, st.rng.uniform());
      else
        alpha.row(b).maxCoeff(&s);
      st.location[b] = s;
      glimpse_weights(s, &W(b, 0));
    }
    context(*st.F, nullptr, st.rows, W, z);
  } else {
    context(*st.F, nullptr, st.rows, alpha, z);
  }
  if (cfg_.gate) {
    Mat beta = sigmoid((q * value_of(params_.gate.W)).array() + params_.gate.b.value[0]);
    z = z.array().colwise() * beta.col(0).array();
  }
}

void Decoder::first_lstm_step(const std::vector<int>& tokens, const Mat& x, const Mat* extra, State& st, Mat& gates,
                              Mat& c, Mat& h) {
  word_gates(tokens, st, gates);  // then the same sums as lstm_step's, in its order
  times(products_, x, value_of(params_.lstm.W_x), gates, true);
  times(products_, st.h, value_of(params_.lstm.W_hh), gates, true);
  gates.rowwise() += value_of(params_.lstm.b).row(0);
  if (extra) gates += *extra;
  lstm_activate(gates, st.c, c, nullptr, h);
}

void Decoder::step(const std::vector<int>& tokens, State& st, Mat& logprobs, Mat& alpha) {
  const int B = (int)st.h.rows();
  auto E = value_of(params_.embed);
  Mat emb(B, cfg_.embed_dim);
  for (int b = 0; b < B; ++b) emb.row(b) = E.row(tokens[b]);
  Mat z, gates, c, h;
  Mat pre = emb;
  if (cfg_.updown()) {
    first_lstm_step(tokens, st.h2, &st.mean_gates, st, gates, c, h);
    step_attend(h, st, alpha, z);
    Mat gates2, c2, h2;
    lstm_step(products_, z, h, st.h2, st.c2, params_.updown.lang_lstm, gates2, c2, nullptr, h2);
    times(products_, h2, value_of(params_.out.W_hidden), pre, true);
    times(products_, z, value_of(params_.out.W_context), pre, true);
    st.h2 = std::move(h2), st.c2 = std::move(c2);
  } else if (!cfg_.luong()) {
    step_attend(st.h, st, alpha, z);
    first_lstm_step(tokens, z, nullptr, st, gates, c, h);
    times(products_, h, value_of(params_.out.W_hidden), pre, true);
    times(products_, z, value_of(params_.out.W_context), pre, true);
  } else {
    first_lstm_step(tokens, st.feed, nullptr, st, gates, c, h);
    step_attend(h, st, alpha, z);
    Mat u;
    times(products_, z, value_of(params_.combine.W_ctx), u, false);
    times(products_, h, value_of(params_.combine.W_h), u, true);
    u.rowwise() += value_of(params_.combine.b).row(0);
    st.feed = u.array().tanh().matrix();
    times(products_, st.feed, value_of(params_.out.W_hidden), pre, true);
  }
  st.h = std::move(h), st.c = std::move(c);
  const Mat deep = pre.array().tanh().matrix();
  times(products_, deep, value_of(params_.out.W_vocab), logprobs, false);
  logprobs.rowwise() += value_of(params_.out.b).row(0);
  for (int b = 0; b < B; ++b) {  // log-softmax
    auto row = logprobs.row(b);
    float mx = row.maxCoeff();
    float lse = mx + std::log((row.array() - mx).exp().sum());
    row.array() -= lse;
  }
}

void Decoder::select_rows(State& st, const std::vector<int>& rows) {
  auto pick = [&](Mat& m) {
    Mat out(rows.size(), m.cols());
    for (size_t r = 0; r < rows.size(); ++r) out.row(r) = m.row(rows[r]);
    m = std::move(out);
  };
  for (Mat* m : {&st.h2, &st.c2, &st.mean_gates}) pick(*m);
  Mat h(rows.size(), st.h.cols()), c(rows.size(), st.c.cols()), cov(rows.size(), st.coverage.cols()),
      feed(rows.size(), st.feed.cols());
  for (size_t r = 0; r < rows.size(); ++r) {
    h.row(r) = st.h.row(rows[r]);
    c.row(r) = st.c.row(rows[r]);
    cov.row(r) = st.coverage.row(rows[r]);
    feed.row(r) = st.feed.row(rows[r]);
  }
  st.rows = st.rows.select(rows);
  std::vector<int> loc(rows.size(), -1);
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r] < (int)st.location.size()) loc[r] = st.location[rows[r]];
  st.h = std::move(h), st.c = std::move(c), st.coverage = std::move(cov);
  st.feed = std::move(feed);
  st.location = std::move(loc);
  if (score_) score_->select_rows(rows);
}

}  // namespace sat
