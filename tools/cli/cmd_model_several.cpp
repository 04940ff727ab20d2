// sat model average / ensemble / member / diff: the model subcommands over several files. The mean of several models'
// weights, several models' decoders searched as one, one of those alone, and how far two files' weights are apart.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "datasets/safetensors.hpp"
#include "tools/cli/cmd_model.hpp"
#include "tools/cli/commands.hpp"
#include "train/model.hpp"
#include "train/model_surgery.hpp"

namespace sat {

namespace {

// Every tensor of a model or checkpoint file as floats, by name (quantized ones dequantized), without the optimizer's
// state (adam.*): what two training runs are compared by.
std::map<std::string, Param> weights_of(const std::string& path) {
  TensorFile tf = load_safetensors(path);
  std::map<std::string, Param> weights;
  for (auto& [name, p] : tf.tensors)
    if (name.rfind("adam.", 0) != 0) weights.emplace(name, std::move(p));
  for (auto& [name, q] : tf.quantized) {
    Param p(name, q.shape, false);
    p.value = q.dequantize();
    weights.emplace(name, std::move(p));
  }
  if (weights.empty()) fail(path, "holds no weights");
  return weights;
}

// The flags of the commands that join several model files into one (average, ensemble).
struct JoinArgs {
  std::vector<std::string> inputs;
  std::string out;
};

struct MemberArgs {
  std::string in, out;
  int k = 1;  // from 1
};

// Writes member k of an ensemble as a model of its own, with that member's provenance in place of the ensemble's.
void write_ensemble_member(const MemberArgs& a) {
  const int k = a.k;
  auto m = ensemble_member(a.in, k);
  nlohmann::json& i = m->info;
  const nlohmann::json members = i.contains("members") ? i["members"] : nlohmann::json();
  for (const char* key : {"members", "ensembled", "scores", "scores_command", "val_scores"}) i.erase(key);
  if (k > 1) {  // the file's own provenance is its first member's: this member's comes from its entry
    for (const char* key : {"command", "epoch", "averaged", "git_commit", "started_from"}) i.erase(key);
    if (members.is_array() && (int)members.size() >= k)
      for (const char* key : {"command", "epoch", "averaged", "git_commit"})
        if (members[k - 1].contains(key)) i[key] = members[k - 1][key];
  }
  i["member_of"] = a.in + " (member " + std::to_string(k) + "): " + command_line();
  m->save(a.out);
  std::printf("%s member %d -> %s: one decoder\n", a.in.c_str(), k, a.out.c_str());
}

struct DiffArgs {
  std::vector<std::string> inputs;  // the two files
  double tolerance = 1e-3;
  bool json = false;
};

// How far one tensor of two files is apart: its largest difference, absolute and relative to its largest weight.
struct TensorDifference {
  double relative = 0, absolute = 0, largest = 0;
};

TensorDifference difference_of(const Param& pa, const Param& pb) {
  double largest = 0, difference = 0;
  for (int64_t i = 0; i < pa.size(); ++i) {
    largest = std::max({largest, (double)std::fabs(pa.value[i]), (double)std::fabs(pb.value[i])});
    // a NaN on either side is as far as it gets
    const double d = std::fabs((double)pa.value[i] - pb.value[i]);
    difference = std::isnan(d) ? INFINITY : std::max(difference, d);
  }
  const double relative = difference == 0 ? 0 : difference / std::max(largest, 1e-30);
  return {relative, difference, largest};
}

// Prints how far the weights of the two files are apart (text or JSON); whether they are within the tolerance.
bool compare_weights(const DiffArgs& a) {
  const std::string& path_a = a.inputs[0];
  const std::string& path_b = a.inputs[1];
  std::map<std::string, Param> wa = weights_of(path_a), wb = weights_of(path_b);
  for (auto& [name, p] : wa)
    if (!wb.count(name)) fail(path_b, "has no tensor " + name + " (" + path_a + " has): not the same model");
  for (auto& [name, p] : wb)
    if (!wa.count(name)) fail(path_a, "has no tensor " + name + " (" + path_b + " has): not the same model");
  nlohmann::json tensors = nlohmann::json::object();
  std::string worst;
  double worst_relative = -1, worst_absolute = 0;
  int64_t weights = 0;
  for (auto& [name, pa] : wa) {
    const Param& pb = wb.at(name);
    if (pa.shape != pb.shape)
      fail(path_b, "tensor " + name + " is " + shape_str(pb.shape) + ", " + shape_str(pa.shape) + " in " + path_a);
    const TensorDifference d = difference_of(pa, pb);
    tensors[name] = {{"relative", d.relative}, {"absolute", d.absolute}, {"largest", d.largest}};
    weights += pa.size();
    if (d.relative > worst_relative) worst_relative = d.relative, worst_absolute = d.absolute, worst = name;
  }
  const bool same = worst_relative <= a.tolerance;
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"a", path_a},
                                       {"b", path_b},
                                       {"tensors", tensors.size()},
                                       {"weights", weights},
                                       {"worst_tensor", worst},
                                       {"relative", worst_relative},
                                       {"absolute", worst_absolute},
                                       {"tolerance", a.tolerance},
                                       {"within_tolerance", same},
                                       {"by_tensor", tensors}}
                            .dump(1)
                            .c_str());
  } else {
    std::printf(
        "%s vs %s: %zu tensors, %lld weights; largest difference %.3g of the tensor's largest weight, in %s "
        "(absolute %.3g): %s the tolerance %g\n",
        path_a.c_str(), path_b.c_str(), tensors.size(), (long long)weights, worst_relative, worst.c_str(),
        worst_absolute, same ? "within" : "BEYOND", a.tolerance);
  }
  return same;
}

}  // namespace

void add_model_average(CLI::App& model) {
  auto a = std::make_shared<JoinArgs>();
  auto* average = model.add_subcommand(
      "average",
      "Write a model whose weights are the mean of several models' weights (checkpoint averaging: "
      "e.g. the last epochs of one run, kept with sat train --keep-epochs); the result records the command");
  average->add_option("models", a->inputs, "Model files that differ only in their weights")
      ->required()
      ->expected(2, -1);
  average->add_option("--out", a->out, "Model file to write")->required();
  average->callback([a] {
    auto m = average_models(a->inputs);
    m->info["averaged"] = command_line();
    // the first model's epoch and greedy validation scores do not describe the average
    m->info.erase("epoch");
    m->info.erase("val_scores");
    m->save(a->out);
    std::printf("%zu models -> %s: weights averaged\n", a->inputs.size(), a->out.c_str());
  });
}

void add_model_ensemble(CLI::App& model) {
  auto a = std::make_shared<JoinArgs>();
  auto* ensemble = model.add_subcommand(
      "ensemble",
      "Write one model whose decoders are those of several models over the same encoder and vocabulary "
      "(members trained with sat train --init-from M --fresh-decoder --tune-lr 0); captioning averages "
      "their word distributions. The result records the command and each member's provenance");
  ensemble->add_option("models", a->inputs, "Model files (the first one's encoder and settings are kept)")
      ->required()
      ->expected(2, -1);
  ensemble->add_option("--out", a->out, "Model file to write")->required();
  ensemble->callback([a] {
    auto m = ensemble_models(a->inputs);  // with each member's provenance in info.members
    m->info["ensembled"] = command_line();
    m->save(a->out);
    std::printf("%zu models -> %s: an ensemble of %d decoders\n", a->inputs.size(), a->out.c_str(), m->members());
  });
}

void add_model_member(CLI::App& model) {
  auto a = std::make_shared<MemberArgs>();
  auto* member = model.add_subcommand(
      "member",
      "Write one decoder of an ensemble as a model of its own (the shared encoder, vocabulary and search "
      "settings): to score a member alone, or to ship one faster decoder. The result records where it came "
      "from, with the member's own provenance");
  member->add_option("model", a->in, "Ensemble model file")->required();
  member->add_option("k", a->k, "Which member, from 1 (the first model joined)")->required();
  member->add_option("--out", a->out, "Model file to write")->required();
  member->callback([a] { write_ensemble_member(*a); });
}

void add_model_diff(CLI::App& model) {
  auto a = std::make_shared<DiffArgs>();
  auto* diff = model.add_subcommand(
      "diff",
      "Compare the weights of two model or checkpoint files, e.g. a data-parallel run against one process: "
      "each tensor's largest difference relative to its largest weight. Exit status 1 beyond --tolerance. The "
      "optimizer's state in checkpoints is left out");
  diff->add_option("models", a->inputs, "The two files")->required()->expected(2);
  diff->add_option("--tolerance", a->tolerance, "Largest relative difference still taken as the same weights")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  diff->add_flag("--json", a->json, "One JSON object: the worst tensor and every tensor's difference");
  diff->callback([a] {
    if (!compare_weights(*a)) throw CLI::RuntimeError(1);
  });
}

}  // namespace sat
