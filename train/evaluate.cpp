#include "train/evaluate.hpp"

#include <cstdio>
#include <map>
#include <set>

#include "datasets/io.hpp"
#include "datasets/json_checks.hpp"
#include "train/meteor.hpp"
#include "train/ptb_tokenizer.hpp"

namespace sat {

using nlohmann::json;

json CaptionScores::to_json() const {
  json j = {{"images", images},   {"Bleu_1", bleu[0]}, {"Bleu_2", bleu[1]},
            {"Bleu_3", bleu[2]},  {"Bleu_4", bleu[3]}, {"length_ratio", length_ratio},
            {"ROUGE_L", rouge_l}, {"CIDEr", cider_d}};
  if (meteor >= 0) j["METEOR"] = meteor;
  if (!objects.rows.empty()) j["objects"] = objects.to_json();
  return j;
}

CaptionScores CaptionScores::from_json(const json& j) {
  CaptionScores s;
  s.images = j.at("images");
  for (int k = 0; k < 4; ++k) s.bleu[k] = j.at("Bleu_" + std::to_string(k + 1));
  s.length_ratio = j.at("length_ratio");
  s.rouge_l = j.at("ROUGE_L");
  s.cider_d = j.at("CIDEr");
  s.meteor = j.value("METEOR", -1.0);
  if (j.contains("objects")) s.objects = ObjectTable::from_json(j["objects"]);
  return s;
}

std::string CaptionScores::table() const {
  char buf[512];
  std::string s;
  for (int k = 0; k < 4; ++k) {
    std::snprintf(buf, sizeof buf, "Bleu_%d   %.4f\n", k + 1, bleu[k]);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "  length ratio %.3f (caption words / closest reference words)\n", length_ratio);
  s += buf;
  if (meteor >= 0) {
    std::snprintf(buf, sizeof buf, "METEOR   %.4f  (approximation: exact+stem+synonym stages, no paraphrase table)\n",
                  meteor);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "ROUGE_L  %.4f\nCIDEr    %.4f  (CIDEr-D)\n", rouge_l, cider_d);
  s += buf;
  std::snprintf(buf, sizeof buf, "images   %d\n", images);
  return s + buf + objects.text();
}

TokenizedCaptions tokenize_for_scoring(const std::vector<std::string>& hyps,
                                       const std::vector<std::vector<std::string>>& refs) {
  if (hyps.size() != refs.size()) throw Error("scoring: hypotheses and references differ in number");
  TokenizedCaptions t{std::vector<Tokens>(hyps.size()), std::vector<std::vector<Tokens>>(hyps.size())};
#pragma omp parallel for schedule(dynamic, 64)
  for (size_t i = 0; i < hyps.size(); ++i) {
    t.hyps[i] = ptb_tokenize(hyps[i]);
    for (auto& ref : refs[i]) t.refs[i].push_back(ptb_tokenize(ref));
  }
  return t;
}

CaptionScores score_captions(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs) {
  const auto [h, r] = tokenize_for_scoring(hyps, refs);
  CaptionScores s;
  s.images = (int)hyps.size();
  s.objects = object_table_of_tokens(h, r);
  if (hyps.empty()) return s;
  BleuResult bleu = corpus_bleu(h, r);
  s.bleu = bleu.bleu;
  s.length_ratio = bleu.reflen > 0 ? (double)bleu.testlen / (double)bleu.reflen : 0.0;
  s.rouge_l = corpus_rouge_l(h, r);
  s.cider_d = corpus_cider_d(h, r).score;
  if (meteor_available()) s.meteor = corpus_meteor(h, r);
  return s;
}

std::vector<ResultEntry> load_results(const std::string& path) {
  std::string text = read_file(path);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) fail(path, "empty results file");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(path, std::string("malformed JSON (") + e.what() + ")");
  }
  require_json_numbers_in_range(j, path);
  if (!j.is_array()) fail(path, "a results file is a JSON array of {\"image_id\", \"caption\"}");
  if (j.empty()) fail(path, "results file holds no captions");
  std::vector<ResultEntry> out;
  for (size_t i = 0; i < j.size(); ++i) {
    auto& e = j[i];
    if (!e.is_object() || !e.contains("image_id") || !e.contains("caption") || !e["caption"].is_string() ||
        !(e["image_id"].is_number_integer() || e["image_id"].is_string()))
      fail(path, "entry " + std::to_string(i) + " needs an integer or string image_id and a string caption");
    out.push_back({e["image_id"], e["caption"].get<std::string>()});
  }
  return out;
}

MatchedResults match_results(const std::vector<ResultEntry>& results, const CaptionSet& refs,
                             const std::string& results_path) {
  std::map<std::string, int> by_name;
  for (int i = 0; i < (int)refs.images.size(); ++i) {
    by_name[refs.images[i].file_name] = i;
    auto dot = refs.images[i].file_name.rfind('.');
    if (dot != std::string::npos) by_name.emplace(refs.images[i].file_name.substr(0, dot), i);
  }
  std::set<int> seen;
  MatchedResults m;
  for (size_t k = 0; k < results.size(); ++k) {
    const auto& id = results[k].image_id;
    int idx = -1;
    if (id.is_number_integer()) {
      auto it = refs.image_index.find(id.get<int64_t>());
      if (it != refs.image_index.end()) idx = it->second;
    } else {
      auto it = by_name.find(id.get<std::string>());
      if (it != by_name.end()) idx = it->second;
    }
    if (idx < 0)
      fail(results_path, "entry " + std::to_string(k) + ": image_id " + id.dump() + " is not in " + refs.json_path);
    if (!seen.insert(idx).second)
      fail(results_path, "entry " + std::to_string(k) + ": image_id " + id.dump() + " has a second caption");
    m.images.push_back(idx);
    m.hyps.push_back(results[k].caption);
    m.refs.push_back(refs.references(idx));
    if (m.refs.back().empty()) fail(refs.json_path, "image " + id.dump() + " has no reference captions");
  }
  return m;
}

CaptionScores score_results(const std::vector<ResultEntry>& results, const CaptionSet& refs,
                            const std::string& results_path) {
  MatchedResults m = match_results(results, refs, results_path);
  return score_captions(m.hyps, m.refs);
}

}  // namespace sat
