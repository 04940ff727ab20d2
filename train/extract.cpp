#include "train/extract.hpp"

#include <chrono>
#include <cstdio>

#include "datasets/features.hpp"
#include "train/progress.hpp"
#include "vision/image.hpp"

namespace sat {

int extract_features(CaptionModel& model, const std::vector<std::string>& paths, const std::vector<std::string>& names,
                     const std::string& out, const ExtractOptions& opt) {
  if (paths.size() != names.size() || paths.empty()) throw Error("extract: no images");
  if (opt.dtype != "f16" && opt.dtype != "f32") throw Error("extract: --dtype must be f16 or f32");
  // A model with fine-tuned layers: its caches hold the frozen part's records (the tuned layers run on them).
  const EncoderConfig cached = model.encoder_config.cache_config();
  ImageEncoder* encoder = model.frozen_encoder();
  if (!encoder) throw Error("extract: the model's encoder is not built");
  std::vector<std::string> use_paths = paths, use_names = names;
  FeatureHeader h;
  if (opt.skip_bad) {  // a first pass decodes every photo, so the header can list the ones left out
    use_paths.clear(), use_names.clear();
    for (size_t i = 0; i < paths.size(); ++i) {
      try {
        load_image_bgr(paths[i]);
        use_paths.push_back(paths[i]), use_names.push_back(names[i]);
      } catch (const Error& e) {
        std::fprintf(stderr, "sat: %s (skipped)\n", e.what());
        h.skipped.emplace_back(names[i], e.what());
      }
    }
    if (use_paths.empty()) throw Error("extract: no readable images");
    if (!h.skipped.empty())
      std::fprintf(stderr, "extract: %zu of %zu images unreadable, left out of the cache and listed in its header\n",
                   h.skipped.size(), paths.size());
  }
  h.encoder = cached.to_json();
  // the arithmetic it ran in (bf16 grids differ from f32's by rounding): on record, not part of the encoder's id
  if (cached.pretrained()) h.encoder["precision"] = precision_name(encoder->precision());
  h.encoder_id = model.encoder_id();
  h.grid_h = cached.grid_h();
  h.grid_w = cached.grid_w();
  h.channels = cached.feature_dim();
  h.dtype = opt.dtype;
  h.images = use_names;
  h.mirrored = opt.mirror;
  FeatureWriter writer(out, h);
  const int total = (int)use_names.size(), start = writer.done();
  if (start > 0 && !opt.quiet)
    std::fprintf(stderr, "resuming %s.partial: %d of %d images already there\n", out.c_str(), start, total);
  Progress bar("extract", total);
  auto t0 = std::chrono::steady_clock::now();
  for (int s = start; s < total; s += opt.batch) {
    const int n = std::min(opt.batch, total - s);
    std::vector<std::string> batch(use_paths.begin() + s, use_paths.begin() + s + n);
    std::vector<float> planes = model.load_planes(batch, opt.mirror), records;
    encoder->encode(planes.data(), n, records);
    writer.append(records.data(), n);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char stats[64];
    std::snprintf(stats, sizeof stats, "%.1f images/s", (s + n - start) / std::max(secs, 1e-9));
    if (!opt.quiet) bar.update(s + n, stats);
  }
  writer.finish();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char stats[96];
  std::snprintf(stats, sizeof stats, "%d images in %.1f s; %dx%dx%d %s per image", total - start, secs, h.grid_h,
                h.grid_w, h.channels, h.dtype.c_str());
  if (!opt.quiet) bar.finish(stats);
  return total - start;
}

}  // namespace sat
