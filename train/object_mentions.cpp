#include "train/object_mentions.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "datasets/io.hpp"
#include "train/ptb_tokenizer.hpp"

namespace sat {

namespace {

using Phrase = std::pair<std::string, std::string>;

// Words chosen from the Flickr8k references: the object's nouns and plurals, and words that entail the object
// (skier, surfer, kayaking, horseback). Left out on purpose: football, basketball, baseball, volleyball and softball
// (as often the sport or a player as the ball; "soccer ball" and "tennis ball" count through "ball"), "surf" (the
// waves), skate and skater (ice and roller skates), scooter (mostly kick scooters), tricycle and unicycle, truck.
// Person words name people as such; activity nouns (rider, climber, swimmer, skier) are not person words.
std::vector<ObjectGroup> make_groups() {
  return {
      {"person",
       {"person", "persons",   "people",    "man",      "men",    "woman",   "women",    "boy",      "boys",
        "girl",   "girls",     "child",     "children", "kid",    "kids",    "guy",      "guys",     "lady",
        "ladies", "gentleman", "gentlemen", "baby",     "babies", "toddler", "toddlers", "teenager", "teenagers",
        "teen",   "teens",     "adult",     "adults",   "player", "players", "crowd",    "someone"},
       {},
       false},
      {"dog",
       {"dog",        "dogs",      "puppy",      "puppies", "pup",      "pups",      "doggy",      "greyhound",
        "greyhounds", "poodle",    "poodles",    "terrier", "terriers", "retriever", "retrievers", "collie",
        "collies",    "dachshund", "dachshunds", "beagle",  "beagles",  "labrador",  "labradors"},
       {{"german", "shepherd"}, {"german", "shepherds"}},
       false},
      {"bicycle",
       {"bicycle", "bicycles", "bike", "bikes", "biker", "bikers", "biking", "bicyclist", "bicyclists", "bicycler",
        "bicyclers", "cyclist", "cyclists", "cycling", "bicycling", "bmx"},
       {}},
      {"ball", {"ball", "balls"}, {}},
      {"horse", {"horse", "horses", "pony", "ponies", "horseback", "foal", "foals"}, {}},
      {"boat",
       {"boat",       "boats",     "rowboat",    "rowboats", "sailboat", "sailboats", "motorboat",
        "motorboats", "speedboat", "speedboats", "tugboat",  "tugboats", "canoe",     "canoes",
        "canoeing",   "kayak",     "kayaks",     "kayaker",  "kayakers", "kayaking",  "raft",
        "rafts",      "rafting",   "ship",       "ships",    "yacht",    "yachts"},
       {{"jet", "ski"}, {"jet", "skis"}}},
      {"car", {"car", "cars", "racecar", "racecars", "jeep", "jeeps", "taxi", "taxis"}, {}},
      {"skateboard", {"skateboard", "skateboards", "skateboarder", "skateboarders", "skateboarding"}, {}},
      {"surfboard",
       {"surfboard", "surfboards", "surfboarder", "surfboarders", "surfboarding", "surfer", "surfers", "surfing",
        "surfs"},
       {}},
      {"frisbee", {"frisbee", "frisbees"}, {}},
      {"motorcycle",
       {"motorcycle", "motorcycles", "motorcyclist", "motorcyclists", "motorcycling", "motorbike",  "motorbikes",
        "motorbiker", "motorbikers", "dirtbike",     "dirtbikes",     "dirtbiker",    "dirtbikers", "dirt-bike",
        "dirt-bikes", "motocross",   "motorcross",   "motor-cross",   "moped",        "mopeds"},
       {{"dirt", "bike"},
        {"dirt", "bikes"},
        {"dirt", "biker"},
        {"dirt", "bikers"},
        {"motor", "bike"},
        {"motor", "bikes"}}},
      {"snow sports",
       {"ski", "skis", "skier", "skiers", "skiing", "skiier", "skiiers", "snowboard", "snowboards", "snowboarder",
        "snowboarders", "snowboarding"},
       {}},
  };
}

// Phrases that name none of the objects though a word of theirs would: matched like a group's phrases, then ignored.
const std::vector<Phrase> kNotObjects = {{"hot", "dog"},     {"hot", "dogs"},     {"water", "ski"},   {"water", "skis"},
                                         {"water", "skier"}, {"water", "skiers"}, {"water", "skiing"}};

struct Lookup {
  std::unordered_map<std::string, int> word;  // token -> group
  std::map<Phrase, int> phrase;               // two tokens -> group, or -1: no object
};

const Lookup& lookup() {
  static const Lookup table = [] {
    Lookup t;
    const auto& groups = object_groups();
    for (int g = 0; g < (int)groups.size(); ++g) {
      for (const auto& w : groups[g].words)
        if (!t.word.emplace(w, g).second) throw Error("object groups: '" + w + "' is in two groups");
      for (const auto& p : groups[g].phrases)
        if (!t.phrase.emplace(p, g).second) throw Error("object groups: '" + p.first + " " + p.second + "' twice");
    }
    for (const auto& p : kNotObjects) t.phrase.emplace(p, -1);
    return t;
  }();
  return table;
}

}  // namespace

const std::vector<ObjectGroup>& object_groups() {
  static const std::vector<ObjectGroup> groups = [] {
    std::vector<ObjectGroup> g = make_groups();
    // The detector's COCO classes for each group (its names: vision/detector.cpp)
    const std::map<std::string, std::vector<std::string>> classes = {
        {"person", {"person"}},         {"dog", {"dog"}},
        {"bicycle", {"bicycle"}},       {"ball", {"sports ball"}},
        {"horse", {"horse"}},           {"boat", {"boat"}},
        {"car", {"car"}},               {"skateboard", {"skateboard"}},
        {"surfboard", {"surfboard"}},   {"frisbee", {"frisbee"}},
        {"motorcycle", {"motorcycle"}}, {"snow sports", {"skis", "snowboard"}}};
    for (auto& group : g) group.coco_classes = classes.at(group.name);
    return g;
  }();
  return groups;
}

std::vector<double> object_group_peaks(const Mat& grid, int grid_channels, float scale,
                                       const std::vector<std::string>& classes) {
  if (grid_channels < 0 || grid_channels + (int64_t)classes.size() > grid.cols() || !(scale > 0))
    throw Error("object evidence: a grid of " + std::to_string(grid.cols()) + " channels has no " +
                std::to_string(classes.size()) + " object channels after its " + std::to_string(grid_channels));
  const auto& groups = object_groups();
  std::vector<double> peaks(groups.size(), 0.0);
  if (grid.rows() == 0) return peaks;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const std::string& name : groups[g].coco_classes) {
      const auto at = std::find(classes.begin(), classes.end(), name);
      if (at == classes.end()) throw Error("object evidence: the detector has no class '" + name + "'");
      const double peak = grid.col(grid_channels + (at - classes.begin())).maxCoeff() / scale;
      peaks[g] = std::max(peaks[g], peak);
    }
  return peaks;
}

double object_evidence(const Tokens& words, const std::vector<double>& peaks, double threshold) {
  if (peaks.size() != object_groups().size()) throw Error("object evidence: one peak per object group expected");
  const std::vector<bool> named = objects_named(words);
  double sum = 0;
  for (size_t g = 0; g < named.size(); ++g)
    if (named[g]) sum += peaks[g] - threshold;
  return sum;
}

std::vector<double> mixed_object_evidence(const std::vector<double>& peaks, const std::vector<double>& shares,
                                          double weight) {
  if (peaks.size() != object_groups().size() || shares.size() != peaks.size())
    throw Error("object evidence: one peak and one caption share per object group expected");
  if (!(weight >= 0 && weight <= 1)) throw Error("object evidence: the captions' weight must be in [0, 1]");
  std::vector<double> out(peaks.size());
  for (size_t g = 0; g < peaks.size(); ++g) out[g] = (1 - weight) * peaks[g] + weight * shares[g];
  return out;
}

int object_group_of_word(const std::string& token) {
  const Lookup& t = lookup();
  const auto at = t.word.find(token);
  return at == t.word.end() ? -1 : at->second;
}

std::vector<bool> objects_named(const Tokens& tokens) {
  const Lookup& t = lookup();
  std::vector<bool> named(object_groups().size(), false);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i + 1 < tokens.size()) {
      auto p = t.phrase.find({tokens[i], tokens[i + 1]});
      if (p != t.phrase.end()) {
        if (p->second >= 0) named[p->second] = true;
        ++i;  // the phrase's second token names nothing more
        continue;
      }
    }
    auto w = t.word.find(tokens[i]);
    if (w != t.word.end()) named[w->second] = true;
  }
  return named;
}

ObjectTable object_table_of_tokens(const std::vector<Tokens>& captions,
                                   const std::vector<std::vector<Tokens>>& references) {
  if (captions.size() != references.size()) throw Error("object table: captions and references differ in number");
  const auto& groups = object_groups();
  const size_t G = groups.size();
  ObjectTable table;
  for (const auto& g : groups) table.rows.push_back({g.name});
  table.rare.name = "rarer objects";
  for (size_t i = 0; i < captions.size(); ++i) {
    std::vector<int> votes(G, 0);
    for (const Tokens& ref : references[i]) {
      const std::vector<bool> named = objects_named(ref);
      for (size_t g = 0; g < G; ++g) votes[g] += named[g];
    }
    const int agree = std::min<int>(3, (int)references[i].size());
    const std::vector<bool> said = objects_named(captions[i]);
    for (size_t g = 0; g < G; ++g) {
      ObjectRow& row = table.rows[g];
      if (agree > 0 && votes[g] >= agree) {
        ++row.photos;
        row.named += said[g];
      } else if (votes[g] == 0) {
        ++row.unnamed_photos;
        row.false_mentions += said[g];
      }
    }
  }
  for (size_t g = 0; g < G; ++g) {
    if (!groups[g].rare) continue;
    table.rare.photos += table.rows[g].photos;
    table.rare.named += table.rows[g].named;
    table.rare.false_mentions += table.rows[g].false_mentions;
    table.rare.unnamed_photos += table.rows[g].unnamed_photos;
  }
  return table;
}

ObjectTable object_table(const std::vector<std::string>& captions,
                         const std::vector<std::vector<std::string>>& references) {
  std::vector<Tokens> c;
  std::vector<std::vector<Tokens>> r(references.size());
  for (const auto& s : captions) c.push_back(ptb_tokenize(s));
  for (size_t i = 0; i < references.size(); ++i)
    for (const auto& s : references[i]) r[i].push_back(ptb_tokenize(s));
  return object_table_of_tokens(c, r);
}

namespace {

nlohmann::json row_json(const ObjectRow& r) {
  nlohmann::json j = {{"name", r.name},
                      {"photos", r.photos},
                      {"named", r.named},
                      {"false_mentions", r.false_mentions},
                      {"unnamed_photos", r.unnamed_photos}};
  j["recall"] = r.photos > 0 ? nlohmann::json(r.recall()) : nlohmann::json(nullptr);
  return j;
}

ObjectRow row_from_json(const nlohmann::json& j) {
  ObjectRow r;
  r.name = j.at("name");
  r.photos = j.at("photos");
  r.named = j.at("named");
  r.false_mentions = j.at("false_mentions");
  r.unnamed_photos = j.at("unnamed_photos");
  return r;
}

std::string text_row(const ObjectRow& r) {
  char buf[160];
  char recall[16] = "     -";
  if (r.photos > 0) std::snprintf(recall, sizeof recall, "%6.3f", r.recall());
  std::snprintf(buf, sizeof buf, "  %-13s %6d %6d %s %6d %8d\n", r.name.c_str(), r.photos, r.named, recall,
                r.false_mentions, r.unnamed_photos);
  return buf;
}

}  // namespace

nlohmann::json ObjectTable::to_json() const {
  nlohmann::json j = {{"groups", nlohmann::json::array()}, {"rare", row_json(rare)}};
  for (const ObjectRow& r : rows) j["groups"].push_back(row_json(r));
  return j;
}

ObjectTable ObjectTable::from_json(const nlohmann::json& j) {
  ObjectTable t;
  for (const auto& r : j.at("groups")) t.rows.push_back(row_from_json(r));
  t.rare = row_from_json(j.at("rare"));
  return t;
}

std::string ObjectTable::text() const {
  if (rows.empty()) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-15s %6s %6s %6s %6s %8s\n", "objects named", "photos", "named", "recall", "false",
                "none");
  std::string s = buf;
  for (const ObjectRow& r : rows) s += text_row(r);
  return s + text_row(rare) +
         "  photos: at least 3 references name it; named: of those, the captions naming it; false: captions naming\n"
         "  it where no reference does, of the `none` photos; rarer objects: all but person and dog, summed\n";
}

}  // namespace sat
