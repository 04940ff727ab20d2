// The model subcommands over several model files (tools/cli/cmd_model_several.cpp), which add_model_commands
// (tools/cli/cmd_model.cpp) registers among those on one file.
#pragma once
#include <CLI/CLI.hpp>

namespace sat {

void add_model_average(CLI::App& model);   // model average: the mean of several models' weights
void add_model_ensemble(CLI::App& model);  // model ensemble: several models' decoders searched as one
void add_model_member(CLI::App& model);    // model member: one decoder of an ensemble as a model of its own
void add_model_diff(CLI::App& model);      // model diff: how far two files' weights are apart

}  // namespace sat
