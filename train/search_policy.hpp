// How a model searches for captions: the options a front end asks for, the settings they resolve to against a model
// (checked in one place), and what a search returns for each image: every caption it considered and the one it keeps.
// The search itself is CaptionModel::search (train/model.hpp), the one entry point from grids to captions.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "seq/search.hpp"
#include "train/consensus.hpp"

namespace sat {

struct CaptionModel;
struct Vocab;

constexpr int kMaxBeam = 100;
constexpr double kMaxConsensusWeight = 1000;
// The most memory photos whose captions may join a search's candidates (ConsensusSettings::memory_candidates).
constexpr int kMaxMemoryCandidates = 1000;
// The largest weight of the detector's evidence in reranking (ConsensusSettings::object_evidence).
constexpr double kMaxObjectEvidence = 100;
// The largest weight of a caption's relevance in reranking (ConsensusSettings::relevance_weight).
constexpr double kMaxRelevanceWeight = 100;

// What a front end (the CLI's flags, the library's CaptionOptions, the server's query) asks of a search. Every unset
// field takes the model's stored setting (chosen on dev data: sat model set, sat model memory).
struct SearchOptions {
  std::optional<int> beam;                 // 1: greedy
  std::optional<double> length_norm;       // beam search ranks captions by log p / words^length_norm
  std::optional<int> no_repeat_ngram;      // never repeat an n-word phrase (0: off)
  std::optional<double> consensus_weight;  // consensus reranking by the caption memory (0: off)
  std::optional<int> neighbours;           // how many nearest memory photos' captions a candidate is compared with
  std::optional<int> memory_candidates;    // the captions of the M nearest memory photos join the candidates
  std::optional<double> object_evidence;   // the detector's evidence in reranking (a model with object channels)
  std::optional<double> evidence_threshold;  // and the peak above which naming an object gains
  std::optional<double> neighbour_evidence;  // the nearest memory photos' captions' share in that evidence (0..1)
  std::optional<double> beam_evidence;     // the same evidence steering the beam (a model with object channels)
  std::optional<double> relevance_weight;  // the caption's relevance by the memory's CCA (its word side)
  std::optional<int> beam_groups;          // diverse beam search (1: plain beam search)
  std::optional<double> diversity;         // and its penalty
  std::string include;                     // a word every caption must say (constrained beam search); "": none
  int candidates = 0;  // how many of the considered captions the front end shows (0: the kept one alone)
};

// How front ends spell the options in what they print: errors name an option as the user wrote it.
enum class OptionSpelling {
  library,      // beam, length_norm, no_repeat_ngram, ... (CaptionOptions; the server's query parameters)
  command_line  // --beam, --length-norm, --no-repeat, ...
};

// A search as it runs: every setting resolved against a model and checked (resolve_search).
struct SearchSettings {
  int beam = 1;
  double length_norm = 1.0;
  int no_repeat_ngram = 0;
  ConsensusSettings consensus;  // weight 0 (or no memory): the beam's best caption is kept
  BeamDiversity diversity;
  int include = -1;    // the vocabulary id every caption says; -1: none
  int candidates = 0;  // as SearchOptions::candidates: > 0 asks the search for every candidate it considered
};

// The settings `options` ask of `model`, or an Error saying what is wrong with them: a value out of range, a setting
// the model cannot use (reranking without a caption memory, more neighbours than it holds, the detector's evidence
// without object channels, relevance without a memory projection's word side, beam groups that do not
// divide the beam), a word to include that is not one word or that the model cannot say. Errors about the model
// name `model_name` (its file) and each option as `spelling` spells it. The one place search options are checked.
SearchSettings resolve_search(const CaptionModel& model, const SearchOptions& options, const std::string& model_name,
                              OptionSpelling spelling = OptionSpelling::library);
// The model's stored settings, with the beam replaced when beam > 0 (validation during training: greedy).
SearchSettings stored_search(const CaptionModel& model, int beam = 0);

// A caption a search considered for one image.
struct Candidate {
  Hypothesis hypothesis;
  double agreement = 0;   // consensus reranking: CIDEr-D against the nearest memory photos' captions (else 0)
  double evidence = 0;    // the detector's evidence for the objects it names (object_evidence; 0 when not used)
  double relevance = 0;   // the cosine of its words with the photo in the memory's CCA space (0 when not used)
  // score + weight x agreement + object weight x evidence + relevance weight x relevance (the score when nothing
  // reranks)
  double total = 0;
  int memory_photo = -1;  // a caption of this memory photo (ConsensusSettings::memory_candidates); -1: the search's
};

// Every caption a search considered for one image, best score first, and the one it keeps. Greedy search has one
// candidate; beam search every caption it finished (when SearchSettings::candidates > 0 or reranking needs them;
// else only the one it keeps); constrained search the captions that say the word. With reranking each candidate
// carries its agreement with the nearest memory photos' captions (and with the detector's evidence weighed, its
// evidence; with relevance weighed, its relevance) and total = score + weight x agreement + object weight x evidence
// + relevance weight x relevance decides.
struct CandidateList {
  std::vector<Candidate> candidates;
  int chosen = 0;
  bool reranked = false;  // the totals decide: the caption memory, the detector's evidence, relevance or several
  const Hypothesis& kept() const { return candidates[chosen].hypothesis; }
  // What a listing of the first n shows: their indices and, after them, the kept one's wherever it ranks.
  std::vector<int> shown(int n) const {
    std::vector<int> out;
    for (int k = 0; k < (int)candidates.size(); ++k)
      if (k < n || k == chosen) out.push_back(k);
    return out;
  }
};

// The objects' evidence steering the beam (ConsensusSettings::beam_evidence): evidence[i] is image i's per object
// group (object_group_peaks, or mixed_object_evidence); each group's bonus is weight x (evidence - threshold), and a
// vocabulary word's group the one it names by itself (object_group_of_word).
BeamSteering evidence_steering(const Vocab& vocab, const std::vector<std::vector<double>>& evidence, double weight,
                               double threshold);
// The detector's evidence for each candidate (object_evidence: peaks per object group, object_group_peaks).
void weigh_object_evidence(CandidateList& list, const std::vector<double>& peaks, double threshold,
                           const Vocab& vocab);
// Each candidate's relevance to a photo whose projected key is `key` (caption_relevances over the memory's projection).
void weigh_relevance(CandidateList& list, const CaptionMemory& memory, const float* key, const Vocab& vocab);
// Each candidate's total, score + weight x agreement + object_evidence x evidence + relevance_weight x relevance, and
// the list's choice: the first of the best totals.
void choose_by_totals(CandidateList& list, const ConsensusSettings& settings);

}  // namespace sat
