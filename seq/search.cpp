#include "seq/search.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sat {

namespace {
constexpr int kPad = 0, kStart = 1, kEnd = 2, kUnk = 3;
// Words a caption never shows: padding, <start>, and <unk> (a rare word the model cannot name; the search takes
// the best real word instead, as captioners usually do). Both searches give them log-probability -inf.
constexpr int kNeverEmitted[] = {kPad, kStart, kUnk};
constexpr float kBanned = -std::numeric_limits<float>::infinity();

// Bans the words no caption shows (and <end> at the first step: never an empty caption) in logp's rows.
void ban_words(Mat& logp, int t) {
  for (int w : kNeverEmitted) logp.col(w).setConstant(kBanned);
  if (t == 0) logp.col(kEnd).setConstant(kBanned);
}

// Bans, in logp's row r, every word that would complete an n-word phrase `tokens` already holds (n = 1: any word
// already said). A no-op for n <= 0.
void ban_repeats(Mat& logp, int r, const std::vector<int>& tokens, int n) {
  if (n <= 0) return;
  const size_t k = (size_t)n - 1, len = tokens.size();
  if (len < k) return;
  for (size_t i = 0; i + k < len; ++i)
    if (std::equal(tokens.begin() + i, tokens.begin() + i + k, tokens.end() - k)) logp(r, tokens[i + k]) = kBanned;
}

Hypothesis finish(Hypothesis h, bool with_end, double length_norm = 1.0) {
  int emitted = (int)h.tokens.size() + (with_end ? 1 : 0);
  h.score = h.logprob / std::pow((double)std::max(1, emitted), length_norm);
  return h;
}

// One caption per image, word by word: pick(log-probabilities, live row r, the hypothesis' own row) chooses row r's
// next word.
template <typename Dec, typename Pick>
std::vector<Hypothesis> one_path_search(Dec& dec, const Mat& F, int N, int max_len, Pick pick, int copies = 1,
                                        int no_repeat_ngram = 0) {
  typename Dec::State st;
  dec.begin(F, N, st, copies);
  N *= copies;
  std::vector<Hypothesis> out(N);
  std::vector<int> rows(N), tokens(N, kStart);
  for (int i = 0; i < N; ++i) rows[i] = i;
  Mat logp, alpha;
  for (int t = 0; t < max_len && !rows.empty(); ++t) {
    dec.step(tokens, st, logp, alpha);
    ban_words(logp, t);
    std::vector<int> keep, next;
    for (int r = 0; r < (int)rows.size(); ++r) {
      Hypothesis& h = out[rows[r]];
      ban_repeats(logp, r, h.tokens, no_repeat_ngram);
      const int best = pick(logp, r, rows[r]);
      h.logprob += logp(r, best);
      h.alphas.emplace_back(alpha.row(r).data(), alpha.row(r).data() + alpha.cols());
      if (dec.config().hard()) h.locations.push_back(st.location[r]);
      if (best == kEnd) {
        h = finish(h, true);
        continue;
      }
      h.tokens.push_back(best);
      if (t + 1 == max_len) {
        h = finish(h, false);
        continue;
      }
      keep.push_back(r);
      next.push_back(rows[r]);
      tokens[keep.size() - 1] = best;
    }
    if (keep.size() != rows.size()) dec.select_rows(st, keep);
    rows = next;
    tokens.resize(rows.size());
  }
  return out;
}
// Both beam searches' step: the decoder's next log-probabilities for every live row, with the words no caption shows
// and each row's repeats banned. live[r].h.tokens is row r's caption so far.
template <typename Dec, typename Live>
void step_and_ban(Dec& dec, const std::vector<int>& tokens, typename Dec::State& st, int t,
                  const std::vector<Live>& live, int no_repeat_ngram, Mat& logp, Mat& alpha) {
  dec.step(tokens, st, logp, alpha);
  ban_words(logp, t);
  for (size_t r = 0; r < live.size(); ++r) ban_repeats(logp, (int)r, live[r].h.tokens, no_repeat_ngram);
}

// Row `row`'s hypothesis grown by one step: its new log-probability `lp`, this step's attention map (and hard
// attention's glimpse); the word is the caller's to add.
template <typename Dec>
Hypothesis extended(const Dec& dec, const typename Dec::State& st, const Mat& alpha, const Hypothesis& from, int row,
                    double lp) {
  Hypothesis h = from;
  h.logprob = lp;
  h.alphas.emplace_back(alpha.row(row).data(), alpha.row(row).data() + alpha.cols());
  if (dec.config().hard()) h.locations.push_back(st.location[row]);
  return h;
}
}  // namespace

void check_steering(const BeamSteering& steering, int N, int vocab_size) {
  if (!steering.active()) return;
  if ((int)steering.word_group.size() != vocab_size)
    throw Error("beam steering: " + std::to_string(steering.word_group.size()) + " word groups for a vocabulary of " +
                std::to_string(vocab_size));
  const int groups = (int)steering.bonus.cols();
  if (steering.bonus.rows() != N || groups > kMaxSteeringGroups)
    throw Error("beam steering: bonuses of " + std::to_string(steering.bonus.rows()) + " x " + std::to_string(groups) +
                " for " + std::to_string(N) + " images (at most " + std::to_string(kMaxSteeringGroups) + " groups)");
  for (int g : steering.word_group)
    if (g < -1 || g >= groups) throw Error("beam steering: word group " + std::to_string(g) + " out of range");
  if (!steering.bonus.allFinite()) throw Error("beam steering: a bonus is not finite");
}

void check_diversity(const BeamDiversity& diversity, int beam) {
  if (diversity.groups < 1 || diversity.groups > beam || beam % diversity.groups != 0)
    throw Error("beam groups must divide the beam size (" + std::to_string(beam) + "); got " +
                std::to_string(diversity.groups));
  if (!(diversity.penalty >= 0 && diversity.penalty <= kMaxDiversityPenalty))
    throw Error("the diversity penalty must be in [0, " + std::to_string((int)kMaxDiversityPenalty) + "]");
}

template <typename Dec>
static std::vector<Hypothesis> greedy_search_over(Dec& dec, const Mat& F, int N, int max_len, int no_repeat_ngram) {
  if (no_repeat_ngram < 0 || no_repeat_ngram > kMaxNoRepeat) throw Error("no_repeat_ngram must be in [0, 9]");
  return one_path_search(
      dec, F, N, max_len,
      [](const Mat& logp, int r, int) {
        int best;
        logp.row(r).maxCoeff(&best);
        return best;
      },
      1, no_repeat_ngram);
}

// The word at which u in [0, 1) falls in row r's distribution, by inverse CDF over the words left after the ban
// (their probabilities renormalized).
static int draw_word(const Mat& logp, int r, double u) {
  double total = 0;
  for (int w = 0; w < logp.cols(); ++w)
    if (logp(r, w) != kBanned) total += std::exp((double)logp(r, w));
  u *= total;
  double acc = 0;
  int last = -1;
  for (int w = 0; w < logp.cols(); ++w) {
    if (logp(r, w) == kBanned) continue;
    acc += std::exp((double)logp(r, w));
    last = w;
    if (u < acc) return w;
  }
  return last;  // rounding left u above the sum
}

std::vector<Hypothesis> sample_search(Decoder& dec, const Mat& F, int N, int max_len, Rng& rng, int copies) {
  return one_path_search(
      dec, F, N, max_len, [&rng](const Mat& logp, int r, int) { return draw_word(logp, r, rng.uniform()); }, copies);
}

std::vector<Hypothesis> sample_search(Decoder& dec, const Mat& F, int N, int max_len,
                                      const std::vector<uint64_t>& row_seeds, int copies) {
  if ((int64_t)row_seeds.size() != (int64_t)N * copies)
    throw Error("sample_search: " + std::to_string(row_seeds.size()) + " row seeds for " +
                std::to_string((int64_t)N * copies) + " captions");
  std::vector<RowRng> streams(row_seeds.begin(), row_seeds.end());
  return one_path_search(
      dec, F, N, max_len,
      [&streams](const Mat& logp, int r, int row) { return draw_word(logp, r, streams[row].uniform()); }, copies);
}

template <typename Dec>
static std::vector<std::vector<Hypothesis>> beam_search_over(Dec& dec, const Mat& F, int N, int beam, int max_len,
                                                             double length_norm, int no_repeat_ngram,
                                                             const BeamDiversity& diversity,
                                                             const BeamSteering& steering = {}) {
  if (beam < 1) throw Error("beam size must be at least 1");
  if (no_repeat_ngram < 0 || no_repeat_ngram > kMaxNoRepeat) throw Error("no_repeat_ngram must be in [0, 9]");
  if (!(length_norm >= 0 && length_norm <= 2)) throw Error("length normalization must be in [0, 2]");
  check_diversity(diversity, beam);
  const int V = dec.config().vocab_size;
  check_steering(steering, N, V);
  typename Dec::State st;
  dec.begin(F, N, st);
  const int G = diversity.groups, group_beam = beam / G;
  // Live hypotheses, grouped by image, then by group; row r of the decoder state is live[r]. At the first step one
  // row per image (group -1) is every group's start.
  struct Live {
    int image;
    int group;
    Hypothesis h;
    double steer = 0;    // the steering bonuses its words have gained so far
    uint32_t named = 0;  // the steering groups its words have named
  };
  std::vector<Live> live;
  for (int i = 0; i < N; ++i) live.push_back({i, G > 1 ? -1 : 0, Hypothesis{}});
  std::vector<std::vector<Hypothesis>> finished(N);
  std::vector<std::vector<int>> finished_in_group(N, std::vector<int>(G, 0));
  std::vector<int> tokens(N, kStart);
  std::vector<int> chosen_count(G > 1 ? V : 0, 0);  // this step, this image: rows of earlier groups that chose word w
  std::vector<int> chosen_words;
  Mat logp, alpha;
  struct Cand {
    double rank, lp;  // rank: lp plus the steering, less the diversity penalty (lp with one group and no steering)
    double steer;     // the row's steering with this word
    int row, word;
  };
  std::vector<Cand> cands;
  for (int t = 0; t < max_len && !live.empty(); ++t) {
    step_and_ban(dec, tokens, st, t, live, no_repeat_ngram, logp, alpha);
    std::vector<Live> next;
    std::vector<int> rows;
    std::vector<int> next_tokens;
    size_t r0 = 0;
    while (r0 < live.size()) {
      const int img = live[r0].image;
      size_t r1 = r0;
      while (r1 < live.size() && live[r1].image == img) ++r1;
      for (int g = 0; g < G; ++g) {
        if (finished_in_group[img][g] >= group_beam) continue;
        cands.clear();
        for (size_t r = r0; r < r1; ++r) {
          if (live[r].group != g && live[r].group != -1) continue;
          for (int w = 0; w < V; ++w) {
            if (logp((int)r, w) == kBanned) continue;
            const double lp = live[r].h.logprob + logp((int)r, w);
            double steer = live[r].steer;
            if (steering.active()) {
              const int sg = steering.word_group[w];
              if (sg >= 0 && !(live[r].named >> sg & 1u)) steer += steering.bonus(img, sg);
            }
            const double rank = (g > 0 ? lp - diversity.penalty * chosen_count[w] : lp) + steer;
            cands.push_back({rank, lp, steer, (int)r, w});
          }
        }
        size_t top = std::min(cands.size(), (size_t)2 * group_beam);
        std::partial_sort(cands.begin(), cands.begin() + top, cands.end(), [](const Cand& a, const Cand& b) {
          if (a.rank != b.rank) return a.rank > b.rank;
          if (a.row != b.row) return a.row < b.row;
          return a.word < b.word;
        });
        const size_t first_of_group = next.size();
        int kept = 0;
        for (size_t k = 0; k < top && kept < group_beam; ++k) {
          const Cand& c = cands[k];
          if (G > 1) {
            if (chosen_count[c.word]++ == 0) chosen_words.push_back(c.word);
          }
          Hypothesis h = extended(dec, st, alpha, live[c.row].h, c.row, c.lp);
          if (c.word == kEnd) {
            if (finished_in_group[img][g] < group_beam) {
              finished[img].push_back(finish(std::move(h), true, length_norm));
              ++finished_in_group[img][g];
            }
            continue;
          }
          h.tokens.push_back(c.word);
          if (t + 1 == max_len) {  // out of words: it finishes in the row it would have kept
            if (finished_in_group[img][g] < group_beam) {
              finished[img].push_back(finish(std::move(h), false, length_norm));
              ++finished_in_group[img][g];
            }
            ++kept;
            continue;
          }
          uint32_t named = live[c.row].named;
          if (steering.active() && steering.word_group[c.word] >= 0) named |= 1u << steering.word_group[c.word];
          next.push_back({img, g, std::move(h), c.steer, named});
          rows.push_back(c.row);
          next_tokens.push_back(c.word);
          ++kept;
        }
        if (finished_in_group[img][g] >= group_beam) {  // this group is done: drop its live rows
          next.resize(first_of_group);
          rows.resize(first_of_group);
          next_tokens.resize(first_of_group);
        }
      }
      for (int w : chosen_words) chosen_count[w] = 0;
      chosen_words.clear();
      r0 = r1;
    }
    dec.select_rows(st, rows);
    live = std::move(next);
    tokens = std::move(next_tokens);
  }
  for (auto& l : live) finished[l.image].push_back(finish(std::move(l.h), false, length_norm));
  for (auto& f : finished)  // best first; ties keep the order they finished in
    std::stable_sort(f.begin(), f.end(), [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
  return finished;
}

// Constrained beam search with one word (grid beam search with one constraint, Hokamp & Liu 2017; Anderson et al.
// 2017 constrain captions so): each image keeps two beams of `beam` rows, those that have not said its word yet and
// those that have. A row of the first goes on with any word but that one or <end>, or says it and joins the second;
// rows of the second go on with any word. Only the second finishes captions, so every caption found says the word.
template <typename Dec>
static std::vector<std::vector<Hypothesis>> beam_search_including_over(Dec& dec, const Mat& F, int N, int beam,
                                                                       int max_len, double length_norm,
                                                                       int no_repeat_ngram,
                                                                       const std::vector<int>& words) {
  if (beam < 1) throw Error("beam size must be at least 1");
  if (no_repeat_ngram < 0 || no_repeat_ngram > kMaxNoRepeat) throw Error("no_repeat_ngram must be in [0, 9]");
  if (!(length_norm >= 0 && length_norm <= 2)) throw Error("length normalization must be in [0, 2]");
  if ((int)words.size() != N)
    throw Error("constrained search: " + std::to_string(words.size()) + " words for " + std::to_string(N) + " images");
  const int V = dec.config().vocab_size;
  for (int w : words)
    if (w <= kUnk || w >= V)
      throw Error("constrained search: word id " + std::to_string(w) + " is not a word a caption can say");
  typename Dec::State st;
  dec.begin(F, N, st);
  struct Live {
    int image;
    bool said;
    Hypothesis h;
  };
  std::vector<Live> live;
  for (int i = 0; i < N; ++i) live.push_back({i, false, Hypothesis{}});
  std::vector<std::vector<Hypothesis>> finished(N);
  std::vector<int> tokens(N, kStart);
  Mat logp, alpha;
  struct Cand {
    double lp;
    int row, word;
  };
  std::vector<Cand> cands;
  for (int t = 0; t < max_len && !live.empty(); ++t) {
    step_and_ban(dec, tokens, st, t, live, no_repeat_ngram, logp, alpha);
    std::vector<Live> next;
    std::vector<int> rows, next_tokens;
    size_t r0 = 0;
    while (r0 < live.size()) {
      const int img = live[r0].image, must = words[img];
      size_t r1 = r0;
      while (r1 < live.size() && live[r1].image == img) ++r1;
      const size_t first_of_image = next.size();
      for (const bool said : {true, false}) {  // the finishing beam first: once it is full, the image is done
        if (!said && (int)finished[img].size() >= beam) break;
        cands.clear();
        for (size_t r = r0; r < r1; ++r) {
          const double base = live[r].h.logprob;
          const int row = (int)r;
          if (said && !live[r].said) {  // says the word now
            if (logp(row, must) != kBanned) cands.push_back({base + logp(row, must), row, must});
            continue;
          }
          if (said != live[r].said) continue;
          for (int w = 0; w < V; ++w)
            if (logp(row, w) != kBanned && (said || (w != must && w != kEnd)))
              cands.push_back({base + logp(row, w), row, w});
        }
        const size_t top = std::min(cands.size(), (size_t)2 * beam);
        std::partial_sort(cands.begin(), cands.begin() + top, cands.end(), [](const Cand& a, const Cand& b) {
          if (a.lp != b.lp) return a.lp > b.lp;
          if (a.row != b.row) return a.row < b.row;
          return a.word < b.word;
        });
        int kept = 0;
        for (size_t k = 0; k < top && kept < beam; ++k) {
          const Cand& c = cands[k];
          Hypothesis h = extended(dec, st, alpha, live[c.row].h, c.row, c.lp);
          if (c.word == kEnd) {
            if ((int)finished[img].size() < beam) finished[img].push_back(finish(std::move(h), true, length_norm));
            continue;
          }
          h.tokens.push_back(c.word);
          ++kept;
          if (t + 1 == max_len) {  // out of words: a row that said the word finishes, the others end here
            if (said && (int)finished[img].size() < beam)
              finished[img].push_back(finish(std::move(h), false, length_norm));
            continue;
          }
          next.push_back({img, said, std::move(h)});
          rows.push_back(c.row);
          next_tokens.push_back(c.word);
        }
      }
      if ((int)finished[img].size() >= beam) {  // this image is done: drop its live rows
        next.resize(first_of_image), rows.resize(first_of_image), next_tokens.resize(first_of_image);
      }
      r0 = r1;
    }
    dec.select_rows(st, rows);
    live = std::move(next);
    tokens = std::move(next_tokens);
  }
  for (auto& f : finished)  // best first; ties keep the order they finished in
    std::stable_sort(f.begin(), f.end(), [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
  return finished;
}

// Teacher forcing through the inference path: row r emits captions[r], then <end>; each word's log-probability is
// taken after the searches' bans, so a caption the search could never emit (a repeated phrase under no_repeat_ngram,
// say) scores -inf.
template <typename Dec>
static std::vector<Hypothesis> score_captions_over(Dec& dec, const Mat& F,
                                                   const std::vector<std::vector<int>>& captions, int max_len,
                                                   double length_norm, int no_repeat_ngram) {
  if (no_repeat_ngram < 0 || no_repeat_ngram > kMaxNoRepeat) throw Error("no_repeat_ngram must be in [0, 9]");
  if (!(length_norm >= 0 && length_norm <= 2)) throw Error("length normalization must be in [0, 2]");
  if (F.rows() != dec.config().locations()) throw Error("score_captions: one image's grid expected");
  if (captions.empty()) return {};
  for (const auto& c : captions) {
    if (c.empty() || (int)c.size() >= max_len)
      throw Error("score_captions: a caption must have 1 to " + std::to_string(max_len - 1) + " words");
    for (int w : c)
      if (w < 0 || w >= dec.config().vocab_size) throw Error("score_captions: a word id outside the vocabulary");
  }
  std::vector<size_t> emitted(captions.size(), 0);  // words row r has emitted so far
  std::vector<Hypothesis> out = one_path_search(
      dec, F, 1, max_len,
      [&](const Mat&, int, int row) {
        const auto& c = captions[row];
        return emitted[row] < c.size() ? c[emitted[row]++] : kEnd;
      },
      (int)captions.size(), no_repeat_ngram);
  for (auto& h : out) h = finish(std::move(h), true, length_norm);  // every caption ended with <end>
  return out;
}

static std::vector<Hypothesis> best_of_each(std::vector<std::vector<Hypothesis>> lists) {
  std::vector<Hypothesis> out;
  out.reserve(lists.size());
  for (auto& f : lists) out.push_back(std::move(f.front()));
  return out;
}

std::vector<Hypothesis> greedy_search(Decoder& dec, const Mat& F, int N, int max_len, int no_repeat_ngram) {
  return greedy_search_over(dec, F, N, max_len, no_repeat_ngram);
}
std::vector<Hypothesis> greedy_search(DecoderEnsemble& dec, const Mat& F, int N, int max_len, int no_repeat_ngram) {
  return greedy_search_over(dec, F, N, max_len, no_repeat_ngram);
}
std::vector<Hypothesis> beam_search(Decoder& dec, const Mat& F, int N, int beam, int max_len, double length_norm,
                                    int no_repeat_ngram, const BeamDiversity& diversity) {
  return best_of_each(beam_search_over(dec, F, N, beam, max_len, length_norm, no_repeat_ngram, diversity));
}
std::vector<Hypothesis> beam_search(DecoderEnsemble& dec, const Mat& F, int N, int beam, int max_len,
                                    double length_norm, int no_repeat_ngram, const BeamDiversity& diversity) {
  return best_of_each(beam_search_over(dec, F, N, beam, max_len, length_norm, no_repeat_ngram, diversity));
}
std::vector<std::vector<Hypothesis>> beam_search_nbest(Decoder& dec, const Mat& F, int N, int beam, int max_len,
                                                       double length_norm, int no_repeat_ngram,
                                                       const BeamDiversity& diversity, const BeamSteering& steering) {
  return beam_search_over(dec, F, N, beam, max_len, length_norm, no_repeat_ngram, diversity, steering);
}
std::vector<std::vector<Hypothesis>> beam_search_nbest(DecoderEnsemble& dec, const Mat& F, int N, int beam, int max_len,
                                                       double length_norm, int no_repeat_ngram,
                                                       const BeamDiversity& diversity, const BeamSteering& steering) {
  return beam_search_over(dec, F, N, beam, max_len, length_norm, no_repeat_ngram, diversity, steering);
}

std::vector<std::vector<Hypothesis>> beam_search_including(Decoder& dec, const Mat& F, int N, int beam, int max_len,
                                                           double length_norm, int no_repeat_ngram,
                                                           const std::vector<int>& words) {
  return beam_search_including_over(dec, F, N, beam, max_len, length_norm, no_repeat_ngram, words);
}
std::vector<std::vector<Hypothesis>> beam_search_including(DecoderEnsemble& dec, const Mat& F, int N, int beam,
                                                           int max_len, double length_norm, int no_repeat_ngram,
                                                           const std::vector<int>& words) {
  return beam_search_including_over(dec, F, N, beam, max_len, length_norm, no_repeat_ngram, words);
}

std::vector<Hypothesis> score_captions(Decoder& dec, const Mat& F, const std::vector<std::vector<int>>& captions,
                                       int max_len, double length_norm, int no_repeat_ngram) {
  return score_captions_over(dec, F, captions, max_len, length_norm, no_repeat_ngram);
}
std::vector<Hypothesis> score_captions(DecoderEnsemble& dec, const Mat& F,
                                       const std::vector<std::vector<int>>& captions, int max_len, double length_norm,
                                       int no_repeat_ngram) {
  return score_captions_over(dec, F, captions, max_len, length_norm, no_repeat_ngram);
}

}  // namespace sat
