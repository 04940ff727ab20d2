// Model surgery (train/model_surgery.hpp): checkpoint averaging, ensembles and their members.
#include "train/model_surgery.hpp"

#include <algorithm>
#include <cctype>

namespace sat {

std::unique_ptr<CaptionModel> average_models(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("model average: no model files");
  auto out = CaptionModel::load(paths[0]);
  if (out->members() > 1) fail(paths[0], "is an ensemble: average its members' own files");
  std::vector<Param*> sum = out->params();
  // Summed in double and divided once: weights every model holds alike (a frozen fine-tuned unit, say) come out
  // exactly as they were, so the average still shares them (sat model ensemble compares them exactly).
  std::vector<std::vector<double>> total(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) total[i].assign(sum[i]->value.begin(), sum[i]->value.end());
  for (size_t k = 1; k < paths.size(); ++k) {
    auto m = CaptionModel::load(paths[k]);
    if (m->members() > 1) fail(paths[k], "is an ensemble: average its members' own files");
    auto differs = [&](const std::string& what) {
      fail(paths[k], what + " differs from " + paths[0] + "'s: only models that differ in their weights average");
    };
    if (m->encoder_config.to_json() != out->encoder_config.to_json()) differs("the encoder");
    // a pretrained encoder's frozen part is not averaged: it must be the same network (a CNN trains whole)
    if (out->encoder_config.pretrained() && m->encoder_id() != out->encoder_id()) differs("the frozen encoder");
    if (m->decoder_config.to_json() != out->decoder_config.to_json()) differs("the decoder");
    if (m->vocab.words != out->vocab.words) differs("the vocabulary");
    if (m->neighbour_words.to_json() != out->neighbour_words.to_json()) differs("the neighbour words");
    if (m->object_standardization != out->object_standardization) differs("the object channels' standardization");
    std::vector<Param*> add = m->params();
    if (add.size() != sum.size()) differs("the parameter list");
    for (size_t i = 0; i < sum.size(); ++i) {
      if (add[i]->name != sum[i]->name || add[i]->shape != sum[i]->shape) differs("parameter " + add[i]->name);
      for (size_t j = 0; j < sum[i]->value.size(); ++j) total[i][j] += add[i]->value[j];
    }
  }
  // int8 ranges stay: they describe the frozen part, the same network in every model (the fine-tuned units, averaged,
  // run in float32)
  for (size_t i = 0; i < sum.size(); ++i)
    for (size_t j = 0; j < sum[i]->value.size(); ++j) sum[i]->value[j] = (float)(total[i][j] / (double)paths.size());
  return out;
}

std::unique_ptr<Decoder> widened_decoder(Decoder& from, int extra) {
  if (extra < 0) throw Error("widened decoder: " + std::to_string(extra) + " more features");
  DecoderConfig c = from.config();
  const int64_t D = c.feature_dim;
  c.feature_dim += extra;
  auto to = std::make_unique<Decoder>(c);
  std::vector<Param*> was = from.params(), now = to->params();
  if (was.size() != now.size()) throw Error("widened decoder: the wider decoder has another parameter list");
  for (size_t k = 0; k < was.size(); ++k) {
    const Param& a = *was[k];
    Param& b = *now[k];
    if (a.name != b.name) throw Error("widened decoder: parameter " + a.name + " became " + b.name);
    if (a.shape == b.shape) {
      b.value = a.value;
      continue;
    }
    // a weight that reads the features: D x n rows become D + extra, the new ones zero
    if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[0] != D || b.shape[0] != D + extra ||
        a.shape[1] != b.shape[1])
      throw Error("widened decoder: parameter " + a.name + " goes from " + shape_str(a.shape) + " to " +
                  shape_str(b.shape) + ", not by " + std::to_string(extra) + " more feature rows");
    std::fill(b.value.begin(), b.value.end(), 0.f);
    std::copy(a.value.begin(), a.value.end(), b.value.begin());  // row-major: from's D rows come first
  }
  return to;
}

std::unique_ptr<CaptionModel> ensemble_member(const std::string& path, int k) {
  auto m = CaptionModel::load(path);
  if (k < 1 || k > m->members())
    fail(path, "has " + std::to_string(m->members()) + (m->members() == 1 ? " decoder" : " decoders") +
                   ": there is no member " + std::to_string(k));
  if (k > 1) {
    std::swap(m->decoder, m->more_members[k - 2]);
    m->decoder_config = m->decoder->config();
  }
  m->more_members.clear();
  return m;
}

std::unique_ptr<CaptionModel> ensemble_models(const std::vector<std::string>& paths) {
  if (paths.size() < 2) throw Error("model ensemble: give at least two model files");
  auto out = CaptionModel::load(paths[0]);
  out->half_precision = false;  // the members' weights as loaded; compact again to store float16
  std::vector<const std::string*> member_file(out->members(), &paths[0]);  // where each decoder came from
  // Each decoder's provenance, in order: a model gives its own, an ensemble the list it already holds.
  nlohmann::json provenance = nlohmann::json::array();
  auto add_provenance = [&](const nlohmann::json& info, const std::string& path) {
    if (info.contains("members") && info["members"].is_array()) {
      for (const auto& one : info["members"]) provenance.push_back(one);
      return;
    }
    nlohmann::json one = {{"file", path}};
    for (const char* key : {"command", "epoch", "averaged", "git_commit"})
      if (info.contains(key)) one[key] = info[key];
    provenance.push_back(one);
  };
  add_provenance(out->info, paths[0]);
  const std::string first_id = out->encoder_id();
  std::vector<Param*> first_tuned;
  if (out->tuned)
    for (auto& p : out->tuned->params()) first_tuned.push_back(&p);
  for (size_t k = 1; k < paths.size(); ++k) {
    auto m = CaptionModel::load(paths[k]);
    auto differs = [&](const std::string& what) {  // what: "the vocabulary differs", ...
      fail(paths[k], what + " from " + paths[0] +
                         "'s: an ensemble's members share their encoder and "
                         "vocabulary (train members with sat train --init-from " +
                         paths[0] + " --fresh-decoder --tune-lr 0)");
    };
    if (m->vocab.words != out->vocab.words) differs("the vocabulary differs");
    if (m->encoder_config.to_json() != out->encoder_config.to_json()) differs("the encoder differs");
    if (m->encoder_id() != first_id) differs("the encoder's weights differ");
    if (m->neighbour_words.to_json() != out->neighbour_words.to_json()) differs("the neighbour words differ");
    if (m->object_standardization != out->object_standardization)
      differs("the object channels' standardization differs");
    if (out->tuned) {  // fine-tuned layers: the very same weights
      std::vector<Param*> theirs;
      for (auto& p : m->tuned->params()) theirs.push_back(&p);
      if (theirs.size() != first_tuned.size()) differs("the fine-tuned encoder layers differ");
      for (size_t i = 0; i < theirs.size(); ++i)
        if (theirs[i]->name != first_tuned[i]->name || theirs[i]->value != first_tuned[i]->value)
          differs("the fine-tuned encoder weight " + theirs[i]->name + " differs");
    }
    member_file.insert(member_file.end(), m->members(), &paths[k]);
    add_provenance(m->info, paths[k]);
    out->more_members.push_back(std::move(m->decoder));
    for (auto& d : m->more_members) out->more_members.push_back(std::move(d));
  }
  try {
    DecoderEnsemble check(out->member_decoders());
  } catch (const EnsembleMemberError& e) {  // named by its file; "member 1" is the first file's first decoder
    std::string problem = e.problem;
    const size_t at = problem.find("member 1");
    if (at != std::string::npos && (at + 8 == problem.size() || !std::isdigit((unsigned char)problem[at + 8])))
      problem.replace(at, 8, paths[0]);
    fail(*member_file[e.member - 1], problem);
  }
  out->info["members"] = provenance;
  // the first member's epoch, greedy validation and dev scores describe it alone
  for (const char* key : {"epoch", "val_scores", "scores", "scores_command"}) out->info.erase(key);
  return out;
}

}  // namespace sat
