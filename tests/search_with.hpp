// The searches the tests run, as CaptionModel::search takes them: the model's stored settings with some replaced.
#pragma once
#include <optional>

#include "train/model.hpp"

namespace sat {

// beam, length norm and no-repeat always; the consensus weight, memory candidates and diversity when given;
// candidates > 0: every candidate the search considered, not only the kept one.
inline SearchSettings search_with(const CaptionModel& model, int beam, double length_norm, int no_repeat,
                                  std::optional<double> consensus_weight = {},
                                  std::optional<int> memory_candidates = {},
                                  std::optional<BeamDiversity> diversity = {}, int candidates = 0) {
  SearchOptions o;
  o.beam = beam;
  o.length_norm = length_norm;
  o.no_repeat_ngram = no_repeat;
  o.consensus_weight = consensus_weight;
  o.memory_candidates = memory_candidates;
  if (diversity) o.beam_groups = diversity->groups, o.diversity = diversity->penalty;
  o.candidates = candidates;
  return resolve_search(model, o, "the test model");
}

}  // namespace sat
