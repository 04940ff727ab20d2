// What the files of sat bench share: tools/bench/cmd_bench.cpp (the command itself, and the decoder and cache benches)
// and the benches in files of their own, which add_bench_commands registers: tools/bench/cmd_bench_eval.cpp (search,
// metrics) and tools/bench/cmd_bench_encoder.cpp (cnn, encoder, tune).
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <string>
#include <vector>

namespace sat {

double seconds_since(std::chrono::steady_clock::time_point t0);

// A comma-separated list of batch sizes ("1,8"), each 1 to 4096; errors name the flag.
std::vector<int> parse_batches(const std::string& text, const std::string& flag);

void add_bench_search(CLI::App& bench);    // bench search: caption search with a model's decoder
void add_bench_metrics(CLI::App& bench);   // bench metrics: corpus scoring
void add_bench_cnn(CLI::App& bench);       // bench cnn: the trainable CNN encoder
void add_bench_encoder(CLI::App& bench);   // bench encoder: a pretrained encoder on oneDNN
void add_bench_detector(CLI::App& bench);  // bench detector: the COCO object detector on oneDNN
void add_bench_tune(CLI::App& bench);      // bench tune: fine-tuning a pretrained encoder's top blocks

}  // namespace sat
