// sat: Show, Attend and Tell. A thin CLI over the sat libraries.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <malloc.h>
#include <string>

#include "datasets/io.hpp"
#include "datasets/shipped.hpp"
#include "tools/cli/commands.hpp"
#include "vision/image.hpp"
#include "vision/pretrained.hpp"

namespace sat {
std::string default_model_path() {
  if (const char* env = std::getenv("SAT_MODEL")) return env;
  return join_path(shipped_models_dir(), "flickr8k.sat");
}
std::string default_encoder_path() {
  if (const char* env = std::getenv("SAT_ENCODER")) return env;
  return join_path(shipped_models_dir(), "inception_v3.sat");
}
void add_allow_damaged_flag(CLI::App* command, bool& to) {
  command->add_flag("--allow-damaged", to,
                    "Read a damaged JPEG or PNG anyway (cut short, corrupt data, a failed checksum: by default an "
                    "error naming the file), its missing part grey");
}
CLI::Option* add_model_option(CLI::App* command, std::string& to, const std::string& help) {
  return command->add_option("--model", to, help)->default_str("$SAT_MODEL, else flickr8k.sat in sat's models folder");
}
std::string damaged_hint(const CLI::App& app) {
  for (const char* name : {"caption", "attend", "detect"})
    if (app.got_subcommand(name)) return " (--allow-damaged reads it anyway)";
  return "";
}
static std::string g_command_line;
const std::string& command_line() {
  return g_command_line;
}
}  // namespace sat

// The sanitizer builds exit normally: LeakSanitizer checks at exit.
#if defined(__SANITIZE_ADDRESS__)
#define SAT_EXIT_NORMALLY 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SAT_EXIT_NORMALLY 1
#endif
#endif

// caption and attend end without tearing the process down (std::_Exit after a flush)
static bool quick_exit_after(const CLI::App& app) {
#ifdef SAT_EXIT_NORMALLY
  return false;
#else
  for (const char* name : {"caption", "attend"})
    if (app.got_subcommand(name)) return true;
  return false;
#endif
}

// A command-line mistake in one line: an unknown command named, and where help is.
static std::string usage_problem(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  // The command: the first argument that is neither an option nor the value of a global option.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--weights-dir" || arg == "--encoder-precision") {
      ++i;
      continue;
    }
    if (arg.empty() || arg[0] == '-') continue;
    try {
      app.get_subcommand(arg);
    } catch (const CLI::OptionNotFound&) {
      return "unknown command '" + arg + "' (sat --help lists the commands)";
    }
    const std::string what = e.what();
    return what + " (sat " + arg + " --help)";
  }
  return std::string(e.what()) + " (sat --help)";
}

int main(int argc, char** argv) {
  // Training allocates the same large temporaries every step; keep freed blocks in the heap instead of
  // returning them to the kernel, which would page-fault and zero them again each time (~8% of a step).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  sat::g_command_line = "sat";
  for (int i = 1; i < argc; ++i) sat::g_command_line += std::string(" ") + argv[i];
  // named "sat" whatever path ran it: usage lines show no path of the machine
  CLI::App app{"sat: Show, Attend and Tell image captioning with attention maps (oneDNN encoder, LSTM decoder)", "sat"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  app.fallthrough();  // --weights-dir may come after the command
  app.add_option("--weights-dir",
                 "Folder holding encoder weights that models name but do not contain (ResNet v2: "
                 "resnet_v2_101.safetensors, or a resnet_v2_101/ folder with it); then $SAT_WEIGHTS, "
                 "then ../shared/models beside the source checkout")
      ->each([](const std::string& dir) { sat::set_weights_dir(dir); });
  app.add_option("--encoder-precision",
                 "A pretrained encoder's arithmetic: f32, bf16 (bfloat16 with float32 "
                 "accumulation: AMX on CPUs that have it), int8 (8-bit activations and "
                 "weights, ranges calibrated by sat model calibrate) or auto (bf16 where it is "
                 "the faster arithmetic: AMX, or AVX512-BF16 on AMD; else f32); default: what the model file stores "
                 "(f32 if nothing)")
      ->each([](const std::string& p) { sat::set_encoder_precision(sat::parse_precision(p)); });
  sat::add_synth_command(app);
  sat::add_train_command(app);
  sat::add_caption_commands(app);
  sat::add_eval_commands(app);
  sat::add_bench_commands(app);
  sat::add_encoder_commands(app);
  sat::add_data_commands(app);
  sat::add_model_commands(app);
  sat::add_report_command(app);
  sat::add_serve_command(app);
  sat::add_detect_command(app);
  try {
    app.parse(argc, argv);
    if (quick_exit_after(app)) {
      // One photo's caption in a fresh process: tearing down (the freed model, oneDNN's kernels, the finalizers of
      // OpenCV's ~140 libraries) cost ~30 ms of wall time at the median after the answer was written. The output is
      // flushed; the files these commands write are complete and renamed before they return.
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(0);
    }
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's verdict as its exit status (sat model diff: 1 when models differ)
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all
    std::fprintf(stderr, "sat: %s\n", usage_problem(app, e, argc, argv).c_str());
    return 2;  // a usage error, as for other Unix commands
  } catch (const sat::DamagedImage& e) {
    std::fprintf(stderr, "sat: %s%s\n", e.what(), sat::damaged_hint(app).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    sat::abort_ranks_after("out of memory");
    std::fprintf(stderr, "sat: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    sat::abort_ranks_after(e.what());
    std::fprintf(stderr, "sat: %s\n", e.what());
    return 1;
  }
  return 0;
}
