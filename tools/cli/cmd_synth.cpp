#include "datasets/synth.hpp"
#include "tools/cli/commands.hpp"

#include <cstdio>

namespace sat {

void add_synth_command(CLI::App& app) {
  auto opt = std::make_shared<SynthOptions>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("synth", "Generate a synthetic grounded caption set (images/ + captions.json)");
  cmd->add_option("--out", *out, "Output directory (created if missing)")->required();
  cmd->add_option("--images", opt->images, "Number of scenes to generate")->capture_default_str();
  cmd->add_option("--seed", opt->seed, "Random seed; the same seed gives the same bytes")->capture_default_str();
  cmd->add_option("--size", opt->size, "Image side in pixels")->capture_default_str();
  cmd->callback([opt, out] {
    write_synth_dataset(*out, *opt);
    std::printf("wrote %d scenes to %s (captions.json, images/)\n", opt->images, out->c_str());
  });
}

}  // namespace sat
