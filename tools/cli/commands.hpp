// Subcommands of the `sat` CLI: each only parses flags and calls the library.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "train/search_policy.hpp"

namespace sat {

struct CaptionModel;
class Collective;

// The search flags of caption, attend, eval and report, as the one search-options type: each set flag overrides the
// model's stored setting for this run.
struct SearchFlags {
  SearchOptions options;
  void add_to(CLI::App* command);
  // The options resolved against the model (train/search_policy.hpp); errors name model_path and the flags.
  SearchSettings resolve(const CaptionModel& model, const std::string& model_path) const;
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
void add_serve_command(CLI::App& app);
void add_detect_command(CLI::App& app);    // detect (the COCO objects in photos)     // serve (HTTP server, tools/cli/server.hpp)
// --allow-damaged, on the commands that read photos a user names (caption, attend, detect).
void add_allow_damaged_flag(CLI::App* command, bool& to);
// What follows the error of a damaged photo: how to read it anyway, on the commands that can.
std::string damaged_hint(const CLI::App& app);
// --model, its default (default_model_path()) described rather than printed: it is a path into wherever sat was built
// or installed, which --help would show every user.
CLI::Option* add_model_option(CLI::App* command, std::string& to, const std::string& help = "Model file");
std::string default_model_path();
std::string default_encoder_path();  // the imported InceptionV3 (tools/import-inception.sh writes it)
// The ranks of a data-parallel run (tools/cli/ranks.cpp): those mpirun started, when it started this process (each
// rank's OpenMP threads then share the node's cores), else this process alone. Under mpirun, a sat built without MPI is
// an error. watchdog_seconds: how long a rank waits in one exchange before it gives up (0: forever).
std::unique_ptr<Collective> join_ranks(double watchdog_seconds);
// main, after an error: under mpirun, prints it naming the rank and ends the whole run (never returns then).
void abort_ranks_after(const std::string& message);
// The command line this process was started with ("sat train --data ..."), for provenance records.
const std::string& command_line();

}  // namespace sat
