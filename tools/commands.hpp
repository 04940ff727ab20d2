// Subcommands of the `sat` CLI: each only parses flags and calls the library.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace sat {

struct CaptionModel;

// The search flags of caption, attend and eval: each overrides the model's stored setting for one run.
struct SearchFlags {
  int beam = 0;             // 0: the model's
  double length_norm = -1;  // < 0: the model's
  int no_repeat = -1;       // < 0: the model's
  void add_to(CLI::App* command);
  void apply(CaptionModel& model) const;
};

void add_synth_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_caption_commands(CLI::App& app);  // caption, attend
void add_eval_commands(CLI::App& app);     // eval, eval-grounding
void add_bench_commands(CLI::App& app);    // bench decoder, bench cnn
void add_encoder_commands(CLI::App& app);  // import-tfjs, extract
void add_data_commands(CLI::App& app);     // data convert
void add_model_commands(CLI::App& app);    // model info, model compact
void add_report_command(CLI::App& app);    // report (HTML page of captions, scores, attention maps)
void add_serve_command(CLI::App& app);     // serve (HTTP server, tools/server.hpp)
std::string default_model_path();
std::string default_encoder_path();  // the imported InceptionV3 (tools/import-inception.sh writes it)
// The command line this process was started with ("sat train --data ..."), for provenance records.
const std::string& command_line();

}  // namespace sat
