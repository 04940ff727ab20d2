// LSTM decoder with attention over the feature grid. Two orderings:
// "bahdanau" (Xu et al. 2015): attend with the previous state, the context feeds the LSTM
//   h0, c0 = tanh(MLP(mean feature));  alpha_t = softmax(score(h_{t-1}, a));  z_t = beta_t * sum_i alpha_ti a_i
//   beta_t = sigmoid(w . h_{t-1} + b);  h_t, c_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_{t-1})
//   p(y_t) = softmax(L_o dropout(tanh(E y_{t-1} + L_h dropout(h_t) + L_z z_t)))   (deep output layer)
// "luong" (Luong et al. 2015, with input feeding): the LSTM steps first, then attends with its new state
//   h_t, c_t = LSTM([E y_{t-1}; h~_{t-1}], h_{t-1}, c_{t-1})   (h~_0 = 0)
//   alpha_t = softmax(score(h_t, a));  z_t = beta_t * sum_i alpha_ti a_i;  beta_t = sigmoid(w . h_t + b)
//   h~_t = tanh(W_c [z_t; h_t] + b_c);  p(y_t) = softmax(L_o dropout(tanh(E y_{t-1} + L_h dropout(h~_t))))
// "updown" (Anderson et al. 2018's top-down attention LSTM): two LSTMs, the first attends, the second speaks
//   h1_t, c1_t = LSTM1([E y_{t-1}; h2_{t-1}; mean feature], h1_{t-1}, c1_{t-1})
//   alpha_t = softmax(score(h1_t, a));  z_t = beta_t * sum_i alpha_ti a_i;  beta_t = sigmoid(w . h1_t + b)
//   h2_t, c2_t = LSTM2([z_t; h1_t], h2_{t-1}, c2_{t-1});  p(y_t) as bahdanau's with h2_t in place of h_t
//   both LSTMs start from their own init MLP of the mean feature
// Forward keeps what backward needs in a Cache; backward is written out by hand.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "seq/attention.hpp"
#include "seq/grid_bf16.hpp"
#include "seq/matmul.hpp"
#include "seq/tensor.hpp"

namespace sat {

struct DecoderConfig {
  int vocab_size = 0;
  int embed_dim = 128;
  int hidden_dim = 256;
  int attn_dim = 128;
  int feature_dim = 0;
  int grid_h = 0, grid_w = 0;
  float dropout = 0.3f;
  std::string attention = "soft";
  std::string score = "additive";
  std::string order = "bahdanau";
  bool gate = true;       // the scalar gate beta on the context
  bool coverage = false;  // the attention score also sees how much each location was attended so far
  float local_sigma = 0;  // attention "local": Gaussian window width in grid cells (0: max(1, grid / 4))
  // attention "hard" (Xu et al. 2015, section 4.1): a location s ~ Categorical(alpha) per step, glimpse there
  int hard_window = 1;               // glimpse: the feature at s (1) or a Gaussian-weighted k x k window around it
  float hard_soft_prob = 0.5f;       // training: with this probability a step uses the expected (soft) context
  float reinforce_weight = 1.f;      // lambda_r: weight of the REINFORCE term (log p(y) - baseline) grad log p(s)
  float entropy_weight = 0.002f;     // lambda_e: entropy bonus on alpha
  bool hard_sample_at_test = false;  // test time: sample s (seeded) instead of taking the argmax

  bool attends() const { return attention != "none"; }
  bool luong() const { return order == "luong"; }
  bool updown() const { return order == "updown"; }
  bool hard() const { return attention == "hard"; }

  int locations() const { return grid_h * grid_w; }
  nlohmann::json to_json() const;
  static DecoderConfig from_json(const nlohmann::json& j);
};

// Teacher-forced captions: input is <start> w1..wn, target is w1..wn <end>; pads are masked out.
struct CaptionBatch {
  int B = 0, T = 0;
  std::vector<int> input, target;  // B x T
  std::vector<float> mask;         // B x T, 1 where target is a real token
  // Rows come in groups of `samples` consecutive copies of one caption (hard attention draws several glimpse
  // sequences per caption; with 2 or more the REINFORCE baseline is the mean of the other samples).
  int samples = 1;
  // Per row, a factor on that row's cross-entropy in the gradient (self-critical training: the caption's advantage,
  // which may be negative). Empty: 1 for every row. The reported loss stays the plain cross-entropy.
  std::vector<float> row_weight;
  // Label smoothing (Szegedy et al. 2016): the gradient's target puts 1 - label_smoothing on the reference word and
  // label_smoothing spread evenly over the whole vocabulary. 0: the reference word alone. The reported loss stays
  // the plain cross-entropy.
  float label_smoothing = 0;
  // Per vocabulary word, a factor on the cross-entropy of the tokens whose target it is, in the gradient (a
  // class-weighted loss: words that matter and are rare can count for more). Empty: 1 for every word. The reported
  // loss stays the plain cross-entropy.
  std::vector<float> word_weight;
  // Per row, the feature grid it reads (the captions of one image share its grid, which is then stored, projected
  // and differentiated once). Empty: row b reads grid b.
  std::vector<int> grid;
  // Data-parallel training: this batch is one rank's share of a global batch, normalized by the global batch's totals
  // so that the ranks' gradients sum to the global batch's gradient: its real tokens (cross-entropy, REINFORCE terms)
  // and its rows (the attention penalty's mean). 0: this batch's own.
  int64_t norm_tokens = 0;
  int norm_rows = 0;
  // Per row, the seed of the row's own random stream (RowRng) for its dropout masks and glimpses in training, so a
  // caption draws the same numbers whichever batch or process holds it. Empty: every row draws from forward's rng.
  std::vector<uint64_t> row_seed;
  int64_t real_tokens() const;  // entries of mask that are 1
  static CaptionBatch from_ids(const std::vector<std::vector<int>>& captions, int max_len);
};

struct DecoderLoss {
  double cross_entropy = 0;  // mean over real tokens
  double penalty = 0;        // lambda * mean_{b,i} (1 - sum_t alpha_ti)^2
  int64_t tokens = 0;
  // hard attention: the REINFORCE weights (advantages) over the sampled steps (their variance is the variance
  // of the estimator's weights), and the mean entropy of alpha
  double advantage_mean = 0, advantage_var = 0, entropy = 0;
  int64_t advantage_count = 0;  // the sampled steps those are over
  // With row weights or label smoothing: what backward differentiates in place of the cross-entropy, the sum over
  // real tokens of w_row * ((1 - eps) * -log p(word) + eps * mean over the vocabulary of -log p), over the number of
  // real tokens (w_row 1 without row weights, eps the label smoothing).
  bool weighted = false, smoothed = false;
  double trained_cross_entropy = 0;
  double total() const { return (weighted || smoothed ? trained_cross_entropy : cross_entropy) + penalty; }
};

struct DecoderCache {
  int B = 0, T = 0;
  const Mat* F = nullptr;
  Bf16Rows F16;  // the grids in bf16, for the attention's per-row passes, where the products run in bf16
  RowGrids rows;
  const CaptionBatch* batch = nullptr;
  float penalty_weight = 0;
  Mat mean_feat;
  std::vector<Mat> h, c;                     // T+1 each; index 0 is the initial state (updown: the attention LSTM's)
  std::vector<Mat> h2, c2, gates2, tanh_c2;  // updown: the language LSTM's (h2, c2: T+1 each)
  Mat mean_gates;                            // updown: the mean feature's part of the attention LSTM's gates (B x 4n)
  std::vector<Mat> alpha, z, beta, zhat, gates, tanh_c;
  // What feeds nothing back into the recurrence, over all steps at once: T*B rows, step t's rows t*B .. t*B + B - 1.
  // emb: the words read; hdrop_mask, hd: the output layer's hidden input and its dropout (hd = h_t or h~_t times
  // the mask); zhat_all: the contexts (bahdanau); out_tanh, odrop_mask, od: the deep output and its dropout
  // (od = out_tanh times the mask); probs: the words' probabilities.
  Mat emb, hdrop_mask, hd, zhat_all, out_tanh, odrop_mask, od, probs;
  std::vector<Mat> htilde;  // luong: the attentional state h~_t (fed to the next step and to the output)
  Mat zero_feed;            // luong: h~_0
  Mat alpha_sum;            // B x L: sum over real steps
  // hard attention: per step the glimpse weights used for the context (one-hot/window, or alpha when the step
  // took the expected context), the sampled location and whether the step was soft
  std::vector<Mat> glimpse;
  std::vector<std::vector<int>> location;
  std::vector<std::vector<char>> soft_step;
  std::vector<double> advantage;  // B x T: the REINFORCE weight of the location sampled at step t
};

// Leave-one-out baseline: rewards in groups of K consecutive samples of one caption (K >= 2, size divisible by K);
// the advantage of a sample is its reward minus the mean reward of the other K - 1 samples of its group. Those do
// not depend on the sample's own locations, so the REINFORCE estimate stays unbiased.
std::vector<double> leave_one_out_advantages(const std::vector<double>& rewards, int K);

// Hard attention's REINFORCE step on the scores e of one row (alpha = softmax(e), s the sampled location):
// adds scale * d/de [ -lambda_r * advantage * log alpha_s - lambda_e * H(alpha) ], i.e.
//   scale * ( lambda_r * advantage * (alpha - onehot(s)) + lambda_e * alpha * (log alpha + H) ).
// Its expectation over s ~ alpha is the gradient of -lambda_r E[f(s)] when advantage = f(s) - b (any constant b).
void add_reinforce_grad(const float* alpha, int L, int s, float advantage, float lambda_r, float lambda_e, float scale,
                        float* de);

// The decoder's parameters by name, a plain struct per block (as llm.c names its parameter tensors); each member's
// comment gives its tensor's name in model files. Decoder::params() lists them in a fixed order (members of a block
// in their order here, then the blocks in the order of DecoderParams, then the attention score's): the order model
// files store them in and optimizers and gradient checks walk, so it must not change. The optional blocks
// (reinforce_baseline, combine, updown) are listed only when the config has them, and otherwise stay empty.
struct AffineParams {  // x W + b
  Param W, b;
};
// An LSTM's pre-activation gates (i f o g, 4n wide): in W_in + x W_x + h_{t-1} W_hh + b, for two inputs in and x.
struct LstmParams {
  Param W_in, W_x, W_hh, b;
};
// The deep output layer: logits = dropout(tanh(E y_{t-1} + hidden W_hidden + z W_context)) W_vocab + b.
struct OutputParams {
  Param W_hidden;   // out.hidden
  Param W_context;  // out.context (luong: zero rows, its context is inside h~)
  Param W_vocab;    // out.weight
  Param b;          // out.bias
};
// luong: the attentional state h~ = tanh(z W_ctx + h W_h + b).
struct CombineParams {
  Param W_ctx;  // combine.weight_ctx
  Param W_h;    // combine.weight_h
  Param b;      // combine.bias
};
// updown: the attention LSTM's mean-feature input and the language LSTM with its own initial state.
struct UpDownParams {
  Param att_lstm_W_mean;  // lstm.weight_mean: the mean feature's part of the attention LSTM's gates
  // lstm2.weight_ctx (in: the context z_t), lstm2.weight_in (x: the attention LSTM's h1_t), lstm2.weight_hh,
  // lstm2.bias
  LstmParams lang_lstm;
  AffineParams init_h2, init_c2;  // init_h2.weight, init_h2.bias; init_c2.weight, init_c2.bias
};
struct DecoderParams {
  Param embed;                  // embed.weight: the word vectors E
  AffineParams init_h, init_c;  // init_h.weight, init_h.bias; init_c.weight, init_c.bias: tanh(mean feature W + b)
  AffineParams gate;            // gate.weight, gate.bias: beta = sigmoid(q W + b)
  // lstm.weight_emb (in: the word vector), lstm.weight_ctx (x: the context for bahdanau, h~_{t-1} for luong, h2_{t-1}
  // for updown), lstm.weight_hh, lstm.bias. updown: the attention LSTM.
  LstmParams lstm;
  OutputParams out;
  Param reinforce_baseline;  // hard attention: attention.reinforce_baseline (a buffer, not trained)
  CombineParams combine;     // luong
  UpDownParams updown;       // updown
};

class Decoder {
 public:
  explicit Decoder(const DecoderConfig& cfg);
  // params() hands out pointers into the decoder itself, so it stays where it was made.
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  const DecoderConfig& config() const { return cfg_; }
  // hard attention: the training schedule's probability of a soft step
  void set_hard_soft_prob(float p) { cfg_.hard_soft_prob = p; }
  void init(Rng& rng);
  // The parameters, to read or change (so the products' bf16 copies of the weights are made again after this).
  std::vector<Param*> params();
  // The arithmetic of the decoder's products (seq/matmul.hpp): float32 (the default, and the gradient checks'), or
  // bfloat16 with float32 sums where the CPU computes it natively. Softmaxes, the LSTM's cells, the loss and the
  // weights themselves stay float32. Training's --precision; the search's (a model file records the choice).
  void set_precision(ProductPrecision p) { products_.set_precision(p); }
  ProductPrecision precision() const { return products_.precision(); }
  // The weights were changed by other means than params() (read in place, edited): make the bf16 copies again.
  // forward() does it too, once per training step, and backward() at its end, since the optimizer updates next.
  void weights_changed() { products_.invalidate(); }

  // F: G*L x D features, one block of L rows per grid; row b of the batch reads grid batch.grid[b] (or grid b).
  // training turns dropout on (drawn from rng, or from each row's stream when batch.row_seed is set).
  DecoderLoss forward(const Mat& F, const CaptionBatch& batch, float penalty_weight, bool training, Rng* rng,
                      DecoderCache& cache);
  // Adds parameter gradients and writes dF (G*L x D, summed over the rows reading each grid) for the encoder; dF
  // null when the encoder is frozen
  // (features from a cache), which skips that work.
  void backward(DecoderCache& cache, Mat* dF);

  // Step-by-step inference (no dropout).
  struct State {
    Mat h, c;
    Mat coverage;               // B x L, attention received so far
    const Mat* F = nullptr;     // G*L x D: the caller's grids, read in place for the whole search (must outlive it)
    RowGrids rows;              // the grid each row reads (beams reorder rows, not grids)
    Mat feed;                   // luong: h~ of the last step (input feeding)
    Mat h2, c2, mean_gates;     // updown: the language LSTM's state; the mean feature's part of the first LSTM's gates
    std::vector<int> location;  // hard attention: the location each row looked at in the last step
    Rng rng{12345};             // hard attention sampled at test time
    // The word's part of the (first) LSTM's gates, E[w] W_emb, for each word w a row has taken in this search:
    // computed once per word (a search's rows keep taking the same few hundred words), not once per row and step.
    std::vector<int> word_gates_row;  // V entries: the word's row in word_gates, or -1
    Mat word_gates;                   // rows filled: word_gates_filled (capacity grows by doubling)
    int word_gates_filled = 0;
  };
  // F: N*L x D, one grid per image, read in place until the search ends; row b starts on grid b / copies (each
  // image's grid read by `copies` consecutive rows).
  void begin(const Mat& F, int N, State& st, int copies = 1);
  // tokens: previous word per row. logprobs: B x V. alpha: B x L.
  void step(const std::vector<int>& tokens, State& st, Mat& logprobs, Mat& alpha);
  void select_rows(State& st, const std::vector<int>& rows);

 private:
  // gates (B x 4H) = E[tokens[b]] W_emb for each row b, from st's per-word rows (computing the words new to it).
  void word_gates(const std::vector<int>& tokens, State& st, Mat& gates);
  // The (first) LSTM's inference step from st.h and st.c: gates from the words (word_gates), x (the context,
  // Luong's h~ or the language LSTM's h2) and h, plus `extra` when given (Up-Down: the mean feature's part); c and h
  // of the next step.
  void first_lstm_step(const std::vector<int>& tokens, const Mat& x, const Mat* extra, State& st, Mat& gates, Mat& c,
                       Mat& h);
  // An initial LSTM state from the mean features: tanh(mean W + b).
  Mat init_state(const Mat& mean, AffineParams& init);
  // z = alpha F per row, from F16 (F in bf16) where given
  void context(const Mat& F, const Bf16Rows* F16, const RowGrids& rows, const Mat& alpha, Mat& z) const;
  // Weights of the glimpse at location s (one-hot, or a normalized Gaussian window of hard_window cells).
  void glimpse_weights(int s, float* w) const;
  // Where a training forward's random numbers come from: each row's own stream (CaptionBatch::row_seed), else the
  // one generator given to forward (rows in order). None: no dropout, hard attention takes the argmax.
  struct Draws {
    Rng* shared = nullptr;
    std::vector<RowRng> rows;
    bool any() const { return shared || !rows.empty(); }
    double uniform(int b) { return rows.empty() ? shared->uniform() : rows[b].uniform(); }
  };
  void dropout_mask(float* mask, int rows, int cols, Draws& draws) const;  // rows x cols, row-major
  // One step of attention with query q (h_{t-1} or h_t by ordering): alpha, glimpse, z, beta, zhat in the cache.
  void attend_step(int t, const Mat& q, Mat& cov, Draws& draws, DecoderCache& C, double& entropy, int64_t& hard_steps);
  // Gradient of one step's attention: dzhat -> adds to dq (the query), dF, parameter gradients.
  void attend_backward(int t, const Mat& q, const Mat& dzhat, const Mat& dS, Mat& dcov_later, DecoderCache& C, Mat& dq,
                       Mat* dF);
  void step_attend(const Mat& q, State& st, Mat& alpha, Mat& z);
  DecoderConfig cfg_;
  DecoderParams params_;
  Products products_;
  std::unique_ptr<AttentionScore> score_;
};

}  // namespace sat
