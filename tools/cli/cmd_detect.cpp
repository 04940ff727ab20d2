// sat detect: the COCO objects the detector finds in photos, with their scores and where (vision/detector.hpp).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "datasets/io.hpp"
#include "tools/cli/commands.hpp"
#include "vision/detector.hpp"
#include "vision/image.hpp"

namespace sat {

namespace {

struct DetectArgs {
  std::vector<std::string> images;
  int size = 448;
  float threshold = 0.3f;
  int batch = 4;
  bool json = false, allow_damaged = false;
};

std::string score_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

void run_detect(const DetectArgs& a) {
  for (const std::string& path : a.images)  // a missing photo is named before the detector is looked for
    if (!file_exists(path)) load_image_bgr(path, DecodeOptions{a.allow_damaged});
  const Precision precision = resolve(encoder_precision_setting().value_or(PrecisionChoice::auto_));
  std::unique_ptr<ObjectDetector> detector = load_object_detector(a.size, precision, "sat detect");
  const auto& names = coco_class_names();
  if (detector->classes() != (int)names.size())
    fail(detector->path(), "gives " + std::to_string(detector->classes()) + " classes, not COCO's 80");
  const size_t plane = (size_t)3 * a.size * a.size;
  const size_t map = (size_t)detector->map_size() * detector->map_size() * detector->classes();
  nlohmann::json out = nlohmann::json::array();
  std::vector<float> planes, heat;
  for (size_t first = 0; first < a.images.size(); first += a.batch) {
    const size_t n = std::min(a.images.size() - first, (size_t)a.batch);
    planes.resize(n * plane);
    for (size_t k = 0; k < n; ++k)
      image_to_rgb255_planes(load_image_bgr(a.images[first + k], DecodeOptions{a.allow_damaged}), a.size,
                             planes.data() + k * plane);
    detector->forward(planes.data(), (int)n, heat);
    for (size_t k = 0; k < n; ++k) {
      const auto found = class_peaks(heat.data() + k * map, detector->map_size(), detector->map_size(),
                                     detector->classes(), a.threshold);
      const std::string& path = a.images[first + k];
      if (a.json) {
        out.push_back({{"image", path}, {"objects", objects_to_json(found)}});
        continue;
      }
      std::string line = path + ":";
      for (size_t j = 0; j < found.size(); ++j)
        line += (j ? ", " : " ") + names[found[j].cls] + " " + score_text(found[j].score);
      if (found.empty()) line += " nothing above " + score_text(a.threshold);
      std::printf("%s\n", line.c_str());
    }
  }
  if (a.json) std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

void add_detect_command(CLI::App& app) {
  auto a = std::make_shared<DetectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "detect",
      "The COCO objects in photos (CenterNet MobileNetV3 from ../shared/models/centernet_mobilenetv3, found like "
      "encoder weights: --weights-dir, $SAT_WEIGHTS): each class whose heat peaks at or above the threshold, best "
      "first, with where it peaks (x, y as fractions of the width and height)");
  cmd->add_option("images", a->images, "Photos")->required();
  cmd->add_option("--size", a->size, "Side the photos are resized to, a multiple of 32")
      ->check(CLI::Range(32, 2048))
      ->capture_default_str();
  cmd->add_option("--threshold", a->threshold, "Lowest peak reported")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--batch", a->batch, "Photos per pass")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_flag("--json", a->json, "JSON: [{image, objects: [{class, score, x, y}]}]");
  add_allow_damaged_flag(cmd, a->allow_damaged);
  cmd->callback([a] {
    if (a->size % 32) throw Error("--size must be a multiple of 32, got " + std::to_string(a->size));
    run_detect(*a);
  });
}

}  // namespace sat
