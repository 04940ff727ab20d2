// A model's recorded commands and paths, read from another folder (sat model rebase).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sat {

// A model's provenance (its info) with the commands on record taken as run in the folder `ran_in` (a run started
// inside runs/x, say) rewritten as seen from the current folder: every relative path in its text (an option's value,
// or a word with a '/' or '.') that `exists` under ran_in becomes ran_in/path, normalized ("runs/x/../../data" is
// "../data"). Absolute paths, option names and words naming nothing under ran_in stay; scores and the git commit are
// not looked at. `rewrites` gets each (old, new) pair once, in order (a path that stays as it was is not listed).
// here (the current folder's absolute path; empty: not looked for): an absolute path on record that starts with it
// (written by a run in this checkout) becomes relative to it ("/repo/../shared/data" is "../shared/data").
nlohmann::json rebase_recorded_paths(const nlohmann::json& info, const std::string& ran_in,
                                     const std::function<bool(const std::string&)>& exists,
                                     std::vector<std::pair<std::string, std::string>>* rewrites = nullptr,
                                     const std::string& here = "");

}  // namespace sat
