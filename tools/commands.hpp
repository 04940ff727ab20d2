// Subcommands of the `sat` CLI: each only parses flags and calls the library.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace sat {

void add_synth_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_caption_commands(CLI::App& app);  // caption, attend
void add_eval_commands(CLI::App& app);     // eval, eval-grounding
void add_bench_commands(CLI::App& app);    // bench decoder, bench cnn
std::string default_model_path();

}  // namespace sat
