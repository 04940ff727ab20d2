// Recorded paths rebased to another folder (train/recorded_paths.hpp).
#include "train/recorded_paths.hpp"

#include <filesystem>

namespace sat {

namespace {

// One string of a model's provenance with its paths rebased (see rebase_recorded_paths).
std::string rebase_text(const std::string& text, const std::string& ran_in,
                        const std::function<bool(const std::string&)>& exists,
                        std::vector<std::pair<std::string, std::string>>* rewrites, const std::string& here) {
  std::string out;
  std::string previous;  // the word before, as written
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') {
      out += text[i++];
      continue;
    }
    const size_t end = std::min(text.find(' ', i), text.size());
    const std::string word = text.substr(i, end - i);
    i = end;
    // "(path", "path:", "path;" and "path)," name the path inside
    size_t first = word.find_first_not_of('('), last = word.find_last_not_of(":;,)");
    std::string core = first != std::string::npos && last != std::string::npos && last >= first
                           ? word.substr(first, last - first + 1)
                           : std::string();
    const bool option_value = previous.rfind("--", 0) == 0;
    const bool looks_like_path = core.find('/') != std::string::npos || core.find('.') != std::string::npos;
    std::string replaced = word;
    const bool absolute_here = !here.empty() && core.rfind(here + "/", 0) == 0;
    if (absolute_here || (!core.empty() && core[0] != '-' && core[0] != '/' && (option_value || looks_like_path) &&
                          exists(ran_in + "/" + core))) {
      std::string rebased = absolute_here ? std::filesystem::path(core)
                                                .lexically_normal()
                                                .lexically_relative(std::filesystem::path(here).lexically_normal())
                                                .string()
                                          : (std::filesystem::path(ran_in) / core).lexically_normal().string();
      while (rebased.size() > 1 && rebased.back() == '/') rebased.pop_back();
      if (rebased.empty()) rebased = ".";
      replaced = word.substr(0, first) + rebased + word.substr(last + 1);
      if (rewrites && rebased != core &&
          std::find(rewrites->begin(), rewrites->end(), std::make_pair(core, rebased)) == rewrites->end())
        rewrites->emplace_back(core, rebased);
    }
    out += replaced;
    previous = word;
  }
  return out;
}

}  // namespace

nlohmann::json rebase_recorded_paths(const nlohmann::json& info, const std::string& ran_in,
                                     const std::function<bool(const std::string&)>& exists,
                                     std::vector<std::pair<std::string, std::string>>* rewrites,
                                     const std::string& here) {
  if (info.is_string()) return rebase_text(info.get<std::string>(), ran_in, exists, rewrites, here);
  if (info.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : info) out.push_back(rebase_recorded_paths(v, ran_in, exists, rewrites, here));
    return out;
  }
  if (info.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, v] : info.items())
      out[key] = key == "scores" || key == "val_scores" || key == "git_commit"
                     ? v
                     : rebase_recorded_paths(v, ran_in, exists, rewrites, here);
    return out;
  }
  return info;
}

}  // namespace sat
