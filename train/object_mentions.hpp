// Object naming as a metric: for a few object groups, how often a caption names the object its photo's references
// agree on (recall), and how often it names one no reference mentions (false mentions). BLEU and CIDEr-D barely move
// when a caption drops the one rare noun that matters ("a man rides a horse" against "a man rides"); this table does.
// The groups and their word lists are in object_mentions.cpp and docs/metrics.md.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "seq/tensor.hpp"
#include "train/metrics.hpp"

namespace sat {

// A group's words are matched as whole tokens after ptb_tokenize (lower case, punctuation split off); its phrases are
// two consecutive tokens, matched first, and their tokens then match nothing else ("dirt bike" is a motorcycle, not a
// bicycle).
struct ObjectGroup {
  std::string name;
  std::vector<std::string> words;
  std::vector<std::pair<std::string, std::string>> phrases;
  bool rare = true;  // pooled in the summary of the rarer objects (every group but person and dog)
  std::vector<std::string> coco_classes;  // the COCO detector's classes that show it (object_group_peaks)
};
const std::vector<ObjectGroup>& object_groups();

// The group of object_groups() a single token names by itself (its index), or -1: none (a word that names a group
// only in a phrase, like "dirt" of "dirt bike", is -1; "bike" is the bicycle's).
int object_group_of_word(const std::string& token);

// For each group of object_groups(), whether the tokens name it.
std::vector<bool> objects_named(const Tokens& tokens);

// The detector's evidence for each group of object_groups() in one photo: the highest peak of class heat (0..1)
// among the group's COCO classes. `grid` is the photo's L x D grid as the decoder reads it: its own `grid_channels`
// channels, then the object channels (EncoderConfig::object_channels), the classes in `classes` order times `scale`,
// each either a class's map max-pooled onto the grid or its peak repeated at every location (then the maps, for
// "both"): either way a class's largest value over the grid is its peak.
std::vector<double> object_group_peaks(const Mat& grid, int grid_channels, float scale,
                                       const std::vector<std::string>& classes);
// A caption's object evidence: over the groups its words name, the sum of (peak - threshold). Naming what the
// detector saw above the threshold adds, naming what it saw less (or not at all) subtracts.
double object_evidence(const Tokens& words, const std::vector<double>& peaks, double threshold);
// Each group's evidence from two estimates of its presence: (1 - weight) x the detector's peak + weight x the share
// of the nearest memory photos' captions that name it (CaptionMemory::object_shares); weight in [0, 1].
std::vector<double> mixed_object_evidence(const std::vector<double>& peaks, const std::vector<double>& shares,
                                          double weight);

// A photo is the group's when at least min(3, its reference count) references name it; it is unnamed when none does
// (photos where one or two references name it are in neither count).
struct ObjectRow {
  std::string name;
  int photos = 0;          // photos the references agree show it
  int named = 0;           // of those, photos whose caption names it
  int false_mentions = 0;  // captions naming it on photos no reference names it in
  int unnamed_photos = 0;  // photos no reference names it in
  double recall() const { return photos > 0 ? (double)named / photos : 0.0; }
};

struct ObjectTable {
  std::vector<ObjectRow> rows;  // object_groups() in order; empty: not computed (scores recorded before the table)
  ObjectRow rare;               // the rarer groups pooled: counts summed over them, so a photo counts once per group
  nlohmann::json to_json() const;
  static ObjectTable from_json(const nlohmann::json& j);  // what to_json wrote
  std::string text() const;                               // fixed-width columns, one group per line, then the pool
};

// Captions and references as text, tokenized as the caption metrics tokenize them; one caption per photo.
ObjectTable object_table(const std::vector<std::string>& captions,
                         const std::vector<std::vector<std::string>>& references);
// The same from tokens already made by ptb_tokenize.
ObjectTable object_table_of_tokens(const std::vector<Tokens>& captions,
                                   const std::vector<std::vector<Tokens>>& references);

}  // namespace sat
