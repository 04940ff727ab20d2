// sat bench search / metrics: the benches of what sat eval does. Caption search (the decoder's inference step and
// beam search) and corpus scoring (PTB tokenization, BLEU, ROUGE-L, CIDEr-D, METEOR).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <omp.h>

#include "seq/decoder.hpp"
#include "seq/search.hpp"
#include "tools/bench/bench_products.hpp"
#include "tools/bench/cmd_bench.hpp"
#include "tools/cli/commands.hpp"
#include "train/evaluate.hpp"
#include "train/model.hpp"
#include "train/meteor.hpp"
#include "train/object_mentions.hpp"
#include "train/ptb_tokenizer.hpp"
#include "train/trainer.hpp"

namespace sat {

namespace {

struct SearchBenchArgs {
  std::string model, batches = "1,10";
  int beam = 0;
  double seconds = 3;
  bool json = false;
  std::string precision;  // empty: the model's
};

// Seconds per run of one measurement repeated: the mean and the best.
struct Timing {
  double mean = 0, best = 0;
};

// The decoder's step alone at the beam's row count (n images x beam rows), per step: runs of 16 steps for half of
// `seconds` (at least 3 runs, after a warm-up run).
Timing time_search_step(Decoder& dec, const Mat& F, int n, int beam, double seconds) {
  const DecoderConfig& c = dec.config();
  const int steps = 16;
  auto time_steps = [&] {
    Decoder::State st;
    dec.begin(F, n, st, beam);
    // Every row a random word at every step: the decoder computes the words' part of the gates once per word
    // (Decoder::State::word_gates), and random words over the whole vocabulary are nearly all new to it, so
    // the step is timed with all of its arithmetic (a real search's rows repeat words: its time is below).
    Rng draws(7);
    std::vector<std::vector<int>> tokens(steps, std::vector<int>(n * beam));
    for (auto& row : tokens)
      for (int& w : row) w = (int)(draws.uniform() * c.vocab_size) % c.vocab_size;
    Mat logp, alpha;
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < steps; ++t) dec.step(tokens[t], st, logp, alpha);
    return seconds_since(t0) / steps;
  };
  time_steps();
  double step_best = 1e30, step_total = 0;
  int step_runs = 0;
  for (auto t0 = std::chrono::steady_clock::now(); seconds_since(t0) < seconds / 2 || step_runs < 3; ++step_runs) {
    const double s = time_steps();
    step_best = std::min(step_best, s), step_total += s;
  }
  return {step_total / step_runs, step_best};
}

struct SearchTimes {
  Timing time;
  double words = 0;  // the mean length of the best captions found
};

// Whole searches: beam search's candidate lists as the model's settings make them (no reranking), for half of
// `seconds` (at least 3 searches, after one whose captions give the words).
SearchTimes time_beam_search(Decoder& dec, const CaptionModel& model, const Mat& F, int n, int beam, double seconds) {
  std::vector<std::vector<Hypothesis>> found =
      beam_search_nbest(dec, F, n, beam, model.max_len, model.length_norm, model.no_repeat_ngram);
  double words = 0;
  for (auto& f : found) words += (double)f.front().tokens.size() / n;
  double search_best = 1e30, search_total = 0;
  int searches = 0;
  for (auto t0 = std::chrono::steady_clock::now(); seconds_since(t0) < seconds / 2 || searches < 3; ++searches) {
    auto t1 = std::chrono::steady_clock::now();
    beam_search_nbest(dec, F, n, beam, model.max_len, model.length_norm, model.no_repeat_ngram);
    const double s = seconds_since(t1);
    search_best = std::min(search_best, s), search_total += s;
  }
  return {{search_total / searches, search_best}, words};
}

// One batch's line: JSON or text.
void print_search_times(bool json, int n, int beam, const DecoderConfig& c, const Timing& step,
                        const SearchTimes& search) {
  const int L = c.locations();
  const double flops = 2.0 * n * beam * decoder_row_step_macs(c);  // 0 but for additive, Bahdanau
  if (json) {
    std::printf(
        "{\"images\": %d, \"beam\": %d, \"rows\": %d, \"step_ms\": %.4f, \"step_best_ms\": %.4f, "
        "\"step_gflops\": %.2f, \"search_ms\": %.3f, \"search_best_ms\": %.3f, \"images_per_s\": %.2f, "
        "\"words\": %.2f, \"flops_per_step\": %.0f, \"L\": %d, \"D\": %d, \"E\": %d, \"H\": %d, \"A\": %d, "
        "\"V\": %d, \"attention\": \"%s\", \"score\": \"%s\", \"order\": \"%s\"}\n",
        n, beam, n * beam, step.mean * 1e3, step.best * 1e3, flops / step.mean / 1e9, search.time.mean * 1e3,
        search.time.best * 1e3, n / search.time.mean, search.words, flops, L, c.feature_dim, c.embed_dim, c.hidden_dim,
        c.attn_dim, c.vocab_size, c.attention.c_str(), c.score.c_str(), c.order.c_str());
  } else {
    std::printf("  %d image%s (%d rows): decoder step %.3f ms (best %.3f)", n, n == 1 ? "" : "s", n * beam,
                step.mean * 1e3, step.best * 1e3);
    if (flops > 0) std::printf(", %.2f GFLOP -> %.1f GFLOPS", flops / 1e9, flops / step.mean / 1e9);
    std::printf("; beam search %.1f ms (best %.1f) -> %.1f images/s, captions of %.1f words\n", search.time.mean * 1e3,
                search.time.best * 1e3, n / search.time.mean, search.words);
  }
}

void bench_search(const SearchBenchArgs& sa) {
  const std::vector<int> batches = parse_batches(sa.batches, "--batches");
  const std::string path = sa.model.empty() ? default_model_path() : sa.model;
  std::unique_ptr<CaptionModel> model = CaptionModel::load(path);
  if (!sa.precision.empty()) {  // else the model's (the arithmetic it trained in)
    model->decoder_precision = parse_product_precision(sa.precision, "bench search: --precision");
    model->apply_decoder_precision(/*as_asked=*/true);
  }
  Decoder& dec = *model->decoder;
  const DecoderConfig& c = dec.config();
  const int beam = sa.beam > 0 ? sa.beam : std::max(2, model->beam), L = c.locations();
  if (!sa.json)
    std::printf(
        "caption search with %s's decoder (%s attention, %s score): L=%d D=%d E=%d H=%d A=%d V=%d, beam %d, "
        "max %d words, %d threads, products in %s\n",
        path.c_str(), c.attention.c_str(), c.score.c_str(), L, c.feature_dim, c.embed_dim, c.hidden_dim, c.attn_dim,
        c.vocab_size, beam, model->max_len, omp_get_max_threads(), product_precision_name(dec.precision()));
  for (const int n : batches) {
    Rng rng(5);
    Mat F((int64_t)n * L, c.feature_dim);  // non-negative, as the grids after the last ReLU
    for (int64_t i = 0; i < F.size(); ++i) F.data()[i] = (float)std::abs(rng.normal());
    const Timing step = time_search_step(dec, F, n, beam, sa.seconds);
    const SearchTimes search = time_beam_search(dec, *model, F, n, beam, sa.seconds);
    print_search_times(sa.json, n, beam, c, step, search);
    std::fflush(stdout);
  }
}

struct MetricsBenchArgs {
  int images = 5000, refs = 5, words = 1000;
  std::string captions;
};

// What the metrics bench scores: each image's hypothesis and references.
struct ScoredCorpus {
  std::vector<std::string> hypotheses;
  std::vector<std::vector<std::string>> references;
};

// Random captions (Zipf-like words), or with --captions real ones: each image's references are its captions, its
// hypothesis the first caption of the next image.
ScoredCorpus corpus_to_score(const MetricsBenchArgs& m) {
  Rng rng(7);
  auto sentence = [&] {
    std::string s;
    int len = (int)rng.integer(8, 14);
    for (int k = 0; k < len; ++k) {
      // Zipf-like word choice so n-grams repeat as in real captions
      int w = (int)(std::pow(rng.uniform(), 3.0) * m.words);
      s += (k ? " " : "") + std::string("w") + std::to_string(w);
    }
    return s + ".";
  };
  ScoredCorpus corpus;
  std::vector<std::string>& hyps = corpus.hypotheses;
  std::vector<std::vector<std::string>>& refs = corpus.references;
  refs.resize(m.images);
  if (!m.captions.empty()) {
    CaptionSet set = load_caption_set(m.captions, "", "");
    if ((int)set.images.size() < m.images + 1) throw Error(m.captions + ": fewer images than --images");
    for (int i = 0; i < m.images; ++i) {
      for (int ci : set.images[i].caption_indices)
        if ((int)refs[i].size() < m.refs) refs[i].push_back(set.captions[ci].raw);
      hyps.push_back(set.captions[set.images[i + 1].caption_indices[0]].raw);
    }
  } else {
    for (int i = 0; i < m.images; ++i) {
      hyps.push_back(sentence());
      for (int r = 0; r < m.refs; ++r) refs[i].push_back(sentence());
    }
  }
  return corpus;
}

// A caption memory's CIDEr-D table (consensus reranking builds it at every model load, on a thread of its own): from
// the references as words joined by spaces, as the memory keeps them; best of 5.
void time_cider_d_tables(const std::vector<std::vector<Tokens>>& r, int images) {
  std::vector<std::vector<std::string>> joined(r.size());
  for (size_t i = 0; i < r.size(); ++i)
    for (auto& t : r[i]) joined[i].push_back(join_words(t));
  double table = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    CiderDScorer built(CiderDScorer::SpaceJoined{joined}, 6.0, CiderDScorer::ReferenceVectors::on_demand);
    table = std::min(table, seconds_since(t0));
  }
  double from_tokens = 1e9;  // the same from Tokens already split (the memory split its captions first before)
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    CiderDScorer built(r, 6.0, CiderDScorer::ReferenceVectors::on_demand);
    from_tokens = std::min(from_tokens, seconds_since(t0));
  }
  std::printf(
      "  caption memory's CIDEr-D table (document frequencies of %d images' references): %.1f ms from "
      "space-joined captions, %.1f ms from split words (1 thread, best of 5)\n",
      images, 1000 * table, 1000 * from_tokens);
}

void bench_metrics(const MetricsBenchArgs& m) {
  const ScoredCorpus corpus = corpus_to_score(m);
  const std::vector<std::string>& hyps = corpus.hypotheses;
  const std::vector<std::vector<std::string>>& refs = corpus.references;
  std::string why;
  auto t0 = std::chrono::steady_clock::now();
  bool have_meteor = meteor_available(&why);  // loads WordNet once per process
  double load = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  CaptionScores sc = score_captions(hyps, refs);
  double total = seconds_since(t0);
  // The same corpus again, metric by metric.
  std::vector<Tokens> h(hyps.size());
  std::vector<std::vector<Tokens>> r(hyps.size());
  t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < hyps.size(); ++i) {
    h[i] = ptb_tokenize(hyps[i]);
    for (auto& x : refs[i]) r[i].push_back(ptb_tokenize(x));
  }
  double tok = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  corpus_bleu(h, r);
  double bleu = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  corpus_rouge_l(h, r);
  double rouge = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  corpus_cider_d(h, r);
  double cider = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  if (have_meteor) corpus_meteor(h, r);
  double meteor = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  object_table_of_tokens(h, r);
  double objects = seconds_since(t0);
  std::printf("scored %d images x %d references, all metrics: %.3f s (CIDEr %.3f)\n", m.images, m.refs, total,
              sc.cider_d);
  std::printf(
      "  tokenize %.3f s (1 thread)  BLEU %.3f s  ROUGE-L %.3f s  CIDEr-D %.3f s  METEOR %.3f s%s  objects %.3f s; "
      "WordNet load %.3f s (once)\n",
      tok, bleu, rouge, cider, meteor, have_meteor ? "" : (" (unavailable: " + why + ")").c_str(), objects, load);
  time_cider_d_tables(r, m.images);
}

}  // namespace

void add_bench_search(CLI::App& bench) {
  auto sa = std::make_shared<SearchBenchArgs>();
  auto* search = bench.add_subcommand(
      "search",
      "Time caption search (the decoder's inference step and beam search) with a model's decoder on random "
      "grids of its shape");
  search->add_option("--model", sa->model, "Model file (default: the default model)");
  search->add_option("--batches", sa->batches, "Comma-separated numbers of images searched together")
      ->capture_default_str();
  search->add_option("--beam", sa->beam, "Beam size (default: the model's)")->check(CLI::Range(2, 100));
  search->add_option("--seconds", sa->seconds, "Time spent per measurement (after one warm-up)")->capture_default_str();
  search->add_option("--precision", sa->precision,
                     "The decoder's products: f32, bf16 or auto (default: the model's, the arithmetic it trained in)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  search->add_flag("--json", sa->json, "One JSON line per batch");
  search->callback([sa] { bench_search(*sa); });
}

void add_bench_metrics(CLI::App& bench) {
  auto m = std::make_shared<MetricsBenchArgs>();
  auto* met = bench.add_subcommand("metrics", "Time corpus scoring (PTB tokenization, BLEU, ROUGE-L, CIDEr-D)");
  met->add_option("--images", m->images, "Images")->capture_default_str();
  met->add_option("--refs", m->refs, "References per image")->capture_default_str();
  met->add_option("--words", m->words, "Vocabulary of the random captions")->capture_default_str();
  met->add_option("--captions", m->captions,
                  "Real captions instead (COCO JSON, captions.csv or data dir): each image's references are its "
                  "captions, its hypothesis is a caption of the next image");
  met->callback([m] { bench_metrics(*m); });
}

}  // namespace sat
