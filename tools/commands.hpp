// Subcommands of the `sat` CLI: each only parses flags and calls the library.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

namespace sat {

struct CaptionModel;
class Collective;

// The search flags of caption, attend and eval: each overrides the model's stored setting for one run.
struct SearchFlags {
  int beam = 0;             // 0: the model's
  double length_norm = -1;  // < 0: the model's
  int no_repeat = -1;       // < 0: the model's
  double consensus_weight = -1;  // < 0: the model's
  int neighbours = 0;            // 0: the model's
  int memory_candidates = -1;    // < 0: the model's
  int beam_groups = 0;           // 0: the model's
  double diversity = -1;         // < 0: the model's
  std::string include;           // a word every caption must say (constrained search); empty: none
  void add_to(CLI::App* command);
  void apply(CaptionModel& model, const std::string& model_path) const;  // errors name model_path
  // --include's word as the model's vocabulary id, -1 without it (an Error naming model_path if it does not know it).
  int include_id(const CaptionModel& model, const std::string& model_path) const;
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
// The ranks of a data-parallel run (tools/ranks.cpp): those mpirun started, when it started this process (each rank's
// OpenMP threads then share the node's cores), else this process alone. Under mpirun, a sat built without MPI is an
// error. watchdog_seconds: how long a rank waits in one exchange before it gives up (0: forever).
std::unique_ptr<Collective> join_ranks(double watchdog_seconds);
// main, after an error: under mpirun, prints it naming the rank and ends the whole run (never returns then).
void abort_ranks_after(const std::string& message);
// The command line this process was started with ("sat train --data ..."), for provenance records.
const std::string& command_line();

}  // namespace sat
