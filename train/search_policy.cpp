// Search options resolved against a model, and CaptionModel::search: the searches of seq/search.hpp over the model's
// decoder (or its ensemble's), with consensus reranking by its caption memory.
#include "train/search_policy.hpp"

#include <algorithm>
#include <set>

#include "datasets/vocab.hpp"
#include "train/model.hpp"
#include "train/object_mentions.hpp"
#include "vision/detector.hpp"

namespace sat {

namespace {

// The options' names in errors, as each kind of front end spells them.
struct OptionNames {
  const char *beam, *length_norm, *no_repeat_ngram, *consensus_weight, *neighbours, *memory_candidates,
      *object_evidence, *evidence_threshold, *neighbour_evidence, *beam_evidence, *relevance_weight, *beam_groups,
      *diversity, *include, *candidates;
};
constexpr OptionNames kLibraryNames{"beam", "length_norm", "no_repeat_ngram", "consensus_weight", "neighbours",
                                    "memory_candidates", "object_evidence", "evidence_threshold",
                                    "neighbour_evidence", "beam_evidence", "relevance_weight", "beam_groups",
                                    "diversity", "include", "candidates"};
constexpr OptionNames kFlagNames{"--beam", "--length-norm", "--no-repeat", "--consensus-weight", "--neighbours",
                                 "--memory-candidates", "--object-evidence", "--evidence-threshold",
                                 "--neighbour-evidence", "--beam-evidence", "--relevance-weight", "--beam-groups",
                                 "--diversity", "--include", "--candidates"};

std::string in_range(const char* name, int lo, int hi) {
  return std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// The vocabulary id of `word` as a word constrained search can require, or an Error naming the model.
int word_to_include(const CaptionModel& model, const std::string& word, const std::string& model_name,
                    const char* name) {
  const std::vector<std::string> words = tokenize_caption(word);
  if (words.size() != 1) throw Error(std::string(name) + " takes one word, got '" + word + "'");
  const int id = model.vocab.contains(words[0]) ? model.vocab.id(words[0]) : -1;
  if (id <= Vocab::kUnk)  // <pad> <start> <end> <unk> come first: no caption says them
    fail(model_name, "does not know the word '" + words[0] + "' (" + name + "): its vocabulary has " +
                         std::to_string(model.vocab.size() - Vocab::kUnk - 1) + " words");
  return id;
}

// A setting that reads the caption memory: the model must have one, holding at least `count` photos.
void require_memory(const CaptionModel& model, const std::string& model_name, const char* name, int count) {
  if (!model.memory)
    fail(model_name, std::string("has no caption memory for ") + name + " (sat model memory builds one)");
  if (count > model.memory_photos())
    fail(model_name, "its caption memory holds " + std::to_string(model.memory_photos()) + " photos: " + name + " " +
                         std::to_string(count) + " is more");
}

}  // namespace

SearchSettings resolve_search(const CaptionModel& model, const SearchOptions& options, const std::string& model_name,
                              OptionSpelling spelling) {
  const OptionNames& name = spelling == OptionSpelling::library ? kLibraryNames : kFlagNames;
  SearchSettings s;
  s.beam = options.beam.value_or(model.beam);
  s.length_norm = options.length_norm.value_or(model.length_norm);
  s.no_repeat_ngram = options.no_repeat_ngram.value_or(model.no_repeat_ngram);
  s.consensus = model.consensus;
  s.consensus.weight = options.consensus_weight.value_or(model.consensus.weight);
  s.consensus.neighbours = options.neighbours.value_or(model.consensus.neighbours);
  s.consensus.memory_candidates = options.memory_candidates.value_or(model.consensus.memory_candidates);
  s.consensus.object_evidence = options.object_evidence.value_or(model.consensus.object_evidence);
  s.consensus.evidence_threshold = options.evidence_threshold.value_or(model.consensus.evidence_threshold);
  s.consensus.neighbour_evidence = options.neighbour_evidence.value_or(model.consensus.neighbour_evidence);
  s.consensus.beam_evidence = options.beam_evidence.value_or(model.consensus.beam_evidence);
  s.consensus.relevance_weight = options.relevance_weight.value_or(model.consensus.relevance_weight);
  s.diversity = BeamDiversity{options.beam_groups.value_or(model.beam_diversity.groups),
                              options.diversity.value_or(model.beam_diversity.penalty)};
  s.candidates = options.candidates;

  if (s.beam < 1 || s.beam > kMaxBeam) throw Error(in_range(name.beam, 1, kMaxBeam));
  if (!(s.length_norm >= 0 && s.length_norm <= 2)) throw Error(in_range(name.length_norm, 0, 2));
  if (s.no_repeat_ngram < 0 || s.no_repeat_ngram > kMaxNoRepeat)
    throw Error(in_range(name.no_repeat_ngram, 0, kMaxNoRepeat));
  if (!(s.consensus.weight >= 0 && s.consensus.weight <= kMaxConsensusWeight))
    throw Error(in_range(name.consensus_weight, 0, (int)kMaxConsensusWeight));
  if (s.consensus.weight > 0) require_memory(model, model_name, name.consensus_weight, 0);
  if (options.neighbours) {
    if (*options.neighbours < 1) throw Error(std::string(name.neighbours) + " must be 1 or more");
    require_memory(model, model_name, name.neighbours, *options.neighbours);
  }
  if (s.consensus.memory_candidates < 0 || s.consensus.memory_candidates > kMaxMemoryCandidates)
    throw Error(in_range(name.memory_candidates, 0, kMaxMemoryCandidates));
  if (s.consensus.memory_candidates > 0)
    require_memory(model, model_name, name.memory_candidates, s.consensus.memory_candidates);
  if (!(s.consensus.object_evidence >= 0 && s.consensus.object_evidence <= kMaxObjectEvidence))
    throw Error(in_range(name.object_evidence, 0, (int)kMaxObjectEvidence));
  if (!(s.consensus.evidence_threshold >= 0 && s.consensus.evidence_threshold <= 1))
    throw Error(in_range(name.evidence_threshold, 0, 1));
  if (s.consensus.object_evidence > 0 && model.encoder_config.object_channels == 0)
    fail(model_name, std::string("has no object channels for ") + name.object_evidence +
                         " (its encoder reads no detector: sat train --objects)");
  if (!(s.consensus.beam_evidence >= 0 && s.consensus.beam_evidence <= kMaxObjectEvidence))
    throw Error(in_range(name.beam_evidence, 0, (int)kMaxObjectEvidence));
  if (s.consensus.beam_evidence > 0 && model.encoder_config.object_channels == 0)
    fail(model_name, std::string("has no object channels for ") + name.beam_evidence +
                         " (its encoder reads no detector: sat train --objects)");
  if (!(s.consensus.neighbour_evidence >= 0 && s.consensus.neighbour_evidence <= 1))
    throw Error(in_range(name.neighbour_evidence, 0, 1));
  if (s.consensus.neighbour_evidence > 0 && (s.consensus.object_evidence > 0 || s.consensus.beam_evidence > 0))
    require_memory(model, model_name, name.neighbour_evidence, 0);
  if (!(s.consensus.relevance_weight >= 0 && s.consensus.relevance_weight <= kMaxRelevanceWeight))
    throw Error(in_range(name.relevance_weight, 0, (int)kMaxRelevanceWeight));
  if (s.consensus.relevance_weight > 0) {
    require_memory(model, model_name, name.relevance_weight, 0);
    if (!model.memory->weighs_relevance())
      fail(model_name, std::string("has no word side in its caption memory's key projection for ") +
                           name.relevance_weight + " (sat model memory --cca builds one)");
  }
  if (s.candidates < 0 || s.candidates > kMaxBeam) throw Error(in_range(name.candidates, 0, kMaxBeam));
  if (s.beam > 1) check_diversity(s.diversity, s.beam);
  if (!options.include.empty()) s.include = word_to_include(model, options.include, model_name, name.include);
  return s;
}

SearchSettings stored_search(const CaptionModel& model, int beam) {
  SearchOptions options;
  if (beam > 0) options.beam = beam;
  return resolve_search(model, options, "the model");
}

namespace {

// fn(decoder) over the model's decoder, or over the mean distribution of its ensemble's decoders.
template <typename Fn>
auto over_decoders(CaptionModel& model, Fn fn) {
  if (model.more_members.empty()) return fn(*model.decoder);
  DecoderEnsemble all(model.member_decoders());
  return fn(all);
}

// A search's captions for one image as candidates (total = score until reranking), best first as found.
CandidateList candidate_list(std::vector<Hypothesis> found, bool reranked) {
  CandidateList list;
  list.reranked = reranked;
  for (auto& h : found) {
    Candidate c;
    c.total = h.score;
    c.hypothesis = std::move(h);
    list.candidates.push_back(std::move(c));
  }
  return list;
}

// Consensus reranking of one image's candidates against the captions of its nearest memory photos: each candidate's
// agreement.
void set_agreements(CandidateList& list, const CaptionMemory& memory, const std::vector<int>& photos,
                    const Vocab& vocab) {
  std::vector<Tokens> words;
  std::vector<int> leave_out;
  for (auto& c : list.candidates) {
    words.push_back(vocab.decode(c.hypothesis.tokens));
    leave_out.push_back(c.memory_photo);
  }
  const std::vector<double> agree = memory.agreements(words, photos, leave_out);
  for (size_t k = 0; k < list.candidates.size(); ++k) list.candidates[k].agreement = agree[k];
}

}  // namespace

void weigh_object_evidence(CandidateList& list, const std::vector<double>& peaks, double threshold,
                           const Vocab& vocab) {
  for (auto& c : list.candidates) c.evidence = object_evidence(vocab.decode(c.hypothesis.tokens), peaks, threshold);
}

BeamSteering evidence_steering(const Vocab& vocab, const std::vector<std::vector<double>>& evidence, double weight,
                               double threshold) {
  BeamSteering steering;
  steering.word_group.resize(vocab.words.size());
  for (size_t w = 0; w < vocab.words.size(); ++w) steering.word_group[w] = object_group_of_word(vocab.words[w]);
  const int64_t groups = (int64_t)object_groups().size();
  steering.bonus.resize((int64_t)evidence.size(), groups);
  for (size_t i = 0; i < evidence.size(); ++i) {
    if ((int64_t)evidence[i].size() != groups) throw Error("beam steering: one evidence per object group expected");
    for (int64_t g = 0; g < groups; ++g) steering.bonus((int64_t)i, g) = (float)(weight * (evidence[i][g] - threshold));
  }
  return steering;
}

void weigh_relevance(CandidateList& list, const CaptionMemory& memory, const float* key, const Vocab& vocab) {
  std::vector<Tokens> words;
  for (auto& c : list.candidates) words.push_back(vocab.decode(c.hypothesis.tokens));
  const std::vector<double> relevance = caption_relevances(memory.projection, key, words);
  for (size_t k = 0; k < list.candidates.size(); ++k) list.candidates[k].relevance = relevance[k];
}

void choose_by_totals(CandidateList& list, const ConsensusSettings& s) {
  std::vector<double> scores, agree;
  for (auto& c : list.candidates) {
    scores.push_back(c.hypothesis.score);
    agree.push_back(c.agreement);
  }
  std::vector<double> totals = consensus_totals(scores, agree, s.weight);  // agreements 0 without the memory
  for (size_t k = 0; k < list.candidates.size(); ++k) {
    totals[k] += s.object_evidence * list.candidates[k].evidence + s.relevance_weight * list.candidates[k].relevance;
    list.candidates[k].total = totals[k];
  }
  list.chosen = best_total(totals);
}

namespace {

// Whether a search of these settings reranks its candidates: by the caption memory, the detector's evidence, the
// captions' relevance, or several.
bool by_memory(const CaptionModel& model, const SearchSettings& s) {
  return model.memory && s.consensus.weight > 0;
}
bool by_evidence(const SearchSettings& s) {
  return s.consensus.object_evidence > 0;
}
// Whether the objects' evidence steers the beam (plain beam search: constrained search is not steered).
bool steers(const SearchSettings& s) {
  return s.beam > 1 && s.include < 0 && s.consensus.beam_evidence > 0;
}
bool by_relevance(const CaptionModel& model, const SearchSettings& s) {
  return model.memory && s.consensus.relevance_weight > 0;
}
// Whether the objects' evidence reads the nearest memory photos' captions too.
bool by_neighbour_evidence(const CaptionModel& model, const SearchSettings& s) {
  return model.memory && (by_evidence(s) || steers(s)) && s.consensus.neighbour_evidence > 0;
}
bool reranks(const CaptionModel& model, const SearchSettings& s) {
  return by_memory(model, s) || by_evidence(s) || by_relevance(model, s);
}
// Whether the search needs each photo's nearest memory photos: for their captions' agreement or their objects.
bool needs_neighbours(const CaptionModel& model, const SearchSettings& s) {
  return by_memory(model, s) || by_neighbour_evidence(model, s);
}
// Whether the search needs each photo's memory key: for its nearest memory photos or its captions' relevance.
bool needs_keys(const CaptionModel& model, const SearchSettings& s) {
  return needs_neighbours(model, s) || by_relevance(model, s);
}

// Each object group's evidence in one image (grid: its L x D rows; photos: its nearest memory photos, read when the
// evidence mixes in their captions): the detector's peak, or its mix with the captions' share.
std::vector<double> group_evidence(const CaptionModel& model, const Mat& grid, const std::vector<int>& photos,
                                   const SearchSettings& s) {
  const EncoderConfig& e = model.encoder_config;
  std::vector<double> peaks = object_group_peaks(grid, e.grid_channels(), e.object_scale, coco_class_names());
  if (by_neighbour_evidence(model, s))
    peaks = mixed_object_evidence(peaks, model.memory->object_shares(photos), s.consensus.neighbour_evidence);
  return peaks;
}

// Reranks one image's candidates as the settings say, with the memory's nearest photos `photos` (empty unless
// needs_neighbours), its memory key `key` (nullptr unless needs_keys) and each object group's evidence `evidence`
// (group_evidence; read when by_evidence).
void rerank(CaptionModel& model, CandidateList& list, const std::vector<int>& photos, const float* key,
            const std::vector<double>& evidence, const SearchSettings& s) {
  if (by_memory(model, s)) set_agreements(list, *model.memory, photos, model.vocab);
  if (by_relevance(model, s)) weigh_relevance(list, *model.memory, key, model.vocab);
  if (by_evidence(s)) weigh_object_evidence(list, evidence, s.consensus.evidence_threshold, model.vocab);
  choose_by_totals(list, s.consensus);
}

// The captions of the `count` nearest memory photos (`photos`, nearest first) that the model can say in fewer than
// max_len words and that are not among the list's yet, scored on the image's grid as the search scores its own and
// added to the list, which is then sorted by score again (best first, as the beam's own list).
void add_memory_candidates(CaptionModel& model, CandidateList& list, const Mat& grid, const std::vector<int>& photos,
                           int count, const SearchSettings& s) {
  std::set<std::vector<int>> seen;
  for (auto& c : list.candidates) seen.insert(c.hypothesis.tokens);
  std::vector<std::vector<int>> captions;
  std::vector<int> from;
  for (int m = 0; m < std::min<int>(count, (int)photos.size()); ++m)
    for (const Tokens& words : model.memory->caption_words(photos[m])) {
      if (words.empty() || (int)words.size() >= model.max_len) continue;
      std::vector<int> ids;
      for (auto& w : words)
        if (model.vocab.contains(w)) ids.push_back(model.vocab.id(w));
      if (ids.size() != words.size() || !seen.insert(ids).second) continue;  // a word it cannot say; a repeat
      captions.push_back(std::move(ids));
      from.push_back(photos[m]);
    }
  std::vector<Hypothesis> scored = over_decoders(model, [&](auto& dec) {
    return score_captions(dec, grid, captions, model.max_len, s.length_norm, s.no_repeat_ngram);
  });
  for (size_t k = 0; k < scored.size(); ++k) {
    Candidate c;
    c.hypothesis = std::move(scored[k]);
    c.memory_photo = from[k];
    list.candidates.push_back(std::move(c));
  }
  std::stable_sort(list.candidates.begin(), list.candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.hypothesis.score > b.hypothesis.score; });
}

// Greedy or beam search keeping one caption per image: nothing reranks, and no front end asked for the others.
std::vector<CandidateList> search_kept_only(CaptionModel& model, const Mat& F, int n, const SearchSettings& s) {
  std::vector<Hypothesis> found = over_decoders(model, [&](auto& dec) {
    return s.beam <= 1 ? greedy_search(dec, F, n, model.max_len, s.no_repeat_ngram)
                       : beam_search(dec, F, n, s.beam, model.max_len, s.length_norm, s.no_repeat_ngram, s.diversity);
  });
  std::vector<CandidateList> out;
  out.reserve(n);
  for (auto& h : found) out.push_back(candidate_list({std::move(h)}, false));
  return out;
}

// Every caption the beam finished for each image (greedy: its one), reranked by the caption memory when the settings
// ask for it, with the nearest memory photos' captions among the candidates when they ask for those too.
// F: the encoder's grids (the memory keys and the detector's evidence read them); G: the decoder's (decoder_grid).
std::vector<CandidateList> search_every_candidate(CaptionModel& model, const Mat& F, const Mat& G, int n,
                                                  const SearchSettings& s) {
  const bool reranked = s.beam > 1 && reranks(model, s), memory = reranked && by_memory(model, s),
             neighbours = (reranked || steers(s)) && needs_neighbours(model, s);
  const Mat keys = neighbours || (reranked && needs_keys(model, s)) ? model.memory->key_vectors(F, n) : Mat();
  std::vector<std::vector<int>> photos(n);  // each image's nearest memory photos, found before the search steers
  if (neighbours)
    for (int i = 0; i < n; ++i) photos[i] = model.memory->nearest(keys.row(i).data(), s.consensus.neighbours);
  const int64_t L = n > 0 ? F.rows() / n : 0;
  std::vector<std::vector<double>> evidence(n);  // each image's, once for the steering and the reranking
  if (steers(s) || (reranked && by_evidence(s)))
    for (int i = 0; i < n; ++i) evidence[i] = group_evidence(model, F.middleRows(i * L, L), photos[i], s);
  const BeamSteering steering =
      steers(s) ? evidence_steering(model.vocab, evidence, s.consensus.beam_evidence, s.consensus.evidence_threshold)
                : BeamSteering{};
  std::vector<std::vector<Hypothesis>> found;
  if (s.beam <= 1) {
    std::vector<Hypothesis> greedy =
        over_decoders(model, [&](auto& dec) { return greedy_search(dec, G, n, model.max_len, s.no_repeat_ngram); });
    for (auto& h : greedy) found.push_back({std::move(h)});
  } else {
    found = over_decoders(model, [&](auto& dec) {
      return beam_search_nbest(dec, G, n, s.beam, model.max_len, s.length_norm, s.no_repeat_ngram, s.diversity,
                               steering);
    });
  }
  std::vector<CandidateList> out(n);
  for (int i = 0; i < n; ++i) {
    CandidateList& list = out[i];
    list = candidate_list(std::move(found[i]), reranked);
    if (!reranked) continue;
    if (memory && s.consensus.memory_candidates > 0)
      add_memory_candidates(model, list, G.middleRows(i * L, L), photos[i], s.consensus.memory_candidates, s);
    rerank(model, list, photos[i], keys.size() ? keys.row(i).data() : nullptr, evidence[i], s);
  }
  return out;
}

// Constrained beam search: the captions that say s.include, the kept one chosen as among a beam's.
std::vector<CandidateList> search_including(CaptionModel& model, const Mat& F, const Mat& G, int n,
                                            const SearchSettings& s) {
  const std::vector<int> words(n, s.include);
  std::vector<std::vector<Hypothesis>> found = over_decoders(model, [&](auto& dec) {
    return beam_search_including(dec, G, n, s.beam, model.max_len, s.length_norm, s.no_repeat_ngram, words);
  });
  const bool reranked = reranks(model, s), neighbours = needs_neighbours(model, s);
  const Mat keys = needs_keys(model, s) ? model.memory->key_vectors(F, n) : Mat();
  const int64_t L = n > 0 ? F.rows() / n : 0;
  std::vector<CandidateList> out(n);
  for (int i = 0; i < n; ++i) {
    if (found[i].empty())
      throw Error("no caption says '" + model.vocab.words[s.include] + "' within " + std::to_string(model.max_len) +
                  " words");
    CandidateList& list = out[i];
    list = candidate_list(std::move(found[i]), reranked);
    if (!reranked) continue;
    const float* key = keys.size() ? keys.row(i).data() : nullptr;
    const std::vector<int> photos = neighbours ? model.memory->nearest(key, s.consensus.neighbours) : std::vector<int>();
    const std::vector<double> evidence =
        by_evidence(s) ? group_evidence(model, F.middleRows(i * L, L), photos, s) : std::vector<double>();
    rerank(model, list, photos, key, evidence, s);
  }
  return out;
}

}  // namespace

std::vector<CandidateList> CaptionModel::search(const Mat& F, int n, const SearchSettings& settings) {
  Mat joined;  // the decoder's grids, when it reads more than the encoder's
  const Mat& G = neighbour_words.on() ? (joined = decoder_grid(F, n)) : F;
  if (settings.include >= 0) return search_including(*this, F, G, n, settings);
  const bool reranked = settings.beam > 1 && reranks(*this, settings);
  if (!reranked && !steers(settings) && settings.candidates == 0) return search_kept_only(*this, G, n, settings);
  return search_every_candidate(*this, F, G, n, settings);
}

std::vector<Hypothesis> CaptionModel::search_kept(const Mat& F, int n, const SearchSettings& settings) {
  std::vector<CandidateList> lists = search(F, n, settings);
  std::vector<Hypothesis> out;
  out.reserve(lists.size());
  for (auto& list : lists) out.push_back(std::move(list.candidates[list.chosen].hypothesis));
  return out;
}

}  // namespace sat
