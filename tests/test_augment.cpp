// Mirror augmentation: sat extract --mirror and sat train --mirror-features. A photo read mirrored is the photo
// flipped left to right, and its captions say "right" where they said "left".
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "datasets/features.hpp"
#include "datasets/io.hpp"
#include "datasets/synth.hpp"
#include "train/extract.hpp"
#include "train/model.hpp"
#include "train/trainer.hpp"
#include "tests/scratch.hpp"

using namespace sat;

namespace {

using test::error_of;
using test::TempDir;

const std::string kInception = std::string(SAT_SOURCE_DIR) + "/models/inception_v3.sat";

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(' ', i);
    if (j == std::string::npos) j = text.size();
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// DIR/images/*.png flipped left to right into OUT, and captions.json with each caption mirrored.
void write_mirrored_dataset(const std::string& dir, const std::string& out) {
  make_dirs(join_path(out, "images"));
  nlohmann::json j = nlohmann::json::parse(read_file(join_path(dir, "captions.json")));
  for (auto& img : j["images"]) {
    const std::string name = img["file_name"].get<std::string>();
    cv::Mat bgr = cv::imread(join_path(dir, "images/" + name), cv::IMREAD_COLOR);
    REQUIRE(!bgr.empty());
    cv::flip(bgr, bgr, 1);
    REQUIRE(cv::imwrite(join_path(out, "images/" + name), bgr));
  }
  for (auto& a : j["annotations"]) {
    std::string text;
    for (auto& w : mirror_caption(words_of(a["caption"].get<std::string>()))) text += (text.empty() ? "" : " ") + w;
    a["caption"] = text;
    a.erase("grounding");
  }
  write_file_atomic(join_path(out, "captions.json"), j.dump());
}

std::vector<std::string> names_of(const std::string& dir) {
  std::vector<std::string> out;
  const nlohmann::json j = nlohmann::json::parse(read_file(join_path(dir, "captions.json")));
  for (auto& img : j["images"]) out.push_back(img["file_name"].get<std::string>());
  return out;
}

void extract(const std::string& dir, const std::string& out, bool mirror) {
  auto enc = pretrained_encoder_model(kInception, "mixed2", 96);
  std::vector<std::string> paths, names = names_of(dir);
  for (auto& n : names) paths.push_back(join_path(dir, "images/" + n));
  ExtractOptions opt;
  opt.quiet = true;
  opt.mirror = mirror;
  extract_features(*enc, paths, names, out, opt);
}

std::vector<float> record(const FeatureCache& cache, int i) {
  std::vector<float> out((size_t)cache.header().locations() * cache.header().channels);
  cache.read(i, out.data());
  return out;
}

// A synthetic dataset (plain/), the same photos flipped with their captions mirrored (flipped/), and three caches:
// plain.feat, mirror.feat (plain/ encoded mirrored) and flipped.feat (flipped/ encoded as it is).
struct MirroredSets {
  TempDir dir;
  MirroredSets(int images, uint64_t seed) {
    SynthOptions so;
    so.images = images, so.size = 96, so.seed = seed;
    write_synth_dataset(dir.file("plain"), so);
    write_mirrored_dataset(dir.file("plain"), dir.file("flipped"));
    extract(dir.file("plain"), dir.file("plain.feat"), false);
    extract(dir.file("plain"), dir.file("mirror.feat"), true);
    extract(dir.file("flipped"), dir.file("flipped.feat"), false);
  }
};

// Every decoder weight of a model file, in order.
std::vector<float> decoder_weights(const std::string& path) {
  auto m = CaptionModel::load(path);
  std::vector<float> out;
  for (Param* p : m->decoder->params()) out.insert(out.end(), p->value.begin(), p->value.end());
  return out;
}

}  // namespace

TEST_CASE("mirror augmentation: captions swap left and right, nothing else") {
  CHECK(mirror_caption({"a", "dog", "to", "the", "left", "of", "a", "man"}) ==
        std::vector<std::string>{"a", "dog", "to", "the", "right", "of", "a", "man"});
  CHECK(mirror_caption({"right", "left", "leftover", "bright"}) ==
        std::vector<std::string>{"left", "right", "leftover", "bright"});
  CHECK(mirror_caption({}).empty());
}

TEST_CASE("mirror augmentation: a mirrored cache is the flipped photos' grids, and says so in its header") {
  MirroredSets sets(6, 11);
  const TempDir& dir = sets.dir;
  FeatureCache plain(dir.file("plain.feat")), mirror(dir.file("mirror.feat")), flipped(dir.file("flipped.feat"));
  CHECK(!plain.header().mirrored);
  CHECK(mirror.header().mirrored);
  CHECK(mirror.header().encoder_id == plain.header().encoder_id);
  for (int i = 0; i < mirror.size(); ++i) {
    CHECK(record(mirror, i) == record(flipped, i));  // the same pixels through the same network
    CHECK(record(mirror, i) != record(plain, i));
  }
  // prefetching (every record, and indices outside the cache, which it ignores) changes nothing read() gives
  std::vector<std::vector<float>> before;
  for (int i = 0; i < plain.size(); ++i) before.push_back(record(plain, i));
  plain.prefetch(-1);
  plain.prefetch(plain.size());
  for (int i = plain.size() - 1; i >= 0; --i) plain.prefetch(i);
  for (int i = 0; i < plain.size(); ++i) CHECK(record(plain, i) == before[i]);
  const std::vector<std::string> names = names_of(dir.file("plain"));
  const std::string id = plain.header().encoder_id;
  CHECK_NOTHROW(plain.require(id, names));
  CHECK_NOTHROW(mirror.require(id, names, true));
  CHECK(error_of([&] { mirror.require(id, names); }) ==
        dir.file("mirror.feat") +
            ": feature cache holds the photos mirrored (sat extract --mirror): it is for sat "
            "train --mirror-features, not the photos' own features");
  CHECK(error_of([&] { plain.require(id, names, true); }) ==
        dir.file("plain.feat") +
            ": feature cache holds the photos as they are, not mirrored: make one with sat "
            "extract --mirror");
}

TEST_CASE("mirror augmentation: training on mirrored grids is training on the flipped photos with mirrored captions") {
  MirroredSets sets(24, 12);
  const TempDir& dir = sets.dir;

  TrainOptions start;  // an untrained model: its vocabulary and weights are every run's start
  start.data = dir.file("plain");
  start.encoder = kInception, start.cut = "mixed2", start.encoder_size = 96;
  start.features = dir.file("plain.feat");
  start.embed_dim = start.hidden_dim = start.attn_dim = 16;
  start.epochs = 0, start.threads = 1, start.out = dir.file("start");
  train(start);

  auto run = [&](const std::string& data, const std::string& features, const std::string& mirror, float prob,
                 const std::string& out) {
    TrainOptions o;
    o.data = data, o.features = features, o.mirror_features = mirror, o.mirror_prob = prob;
    o.init_from = dir.file("start/model.sat");
    o.epochs = 1, o.batch_images = 8, o.val_limit = 4, o.threads = 1, o.seed = 5, o.lr = 1e-2f, o.out = out;
    train(o);
    return decoder_weights(join_path(out, "model.sat"));
  };
  const auto as_mirrored = run(dir.file("plain"), dir.file("plain.feat"), dir.file("mirror.feat"), 1.f, dir.file("a"));
  const auto on_flipped = run(dir.file("flipped"), dir.file("flipped.feat"), "", 0.5f, dir.file("b"));
  const auto plain = run(dir.file("plain"), dir.file("plain.feat"), "", 0.5f, dir.file("c"));
  const auto half = run(dir.file("plain"), dir.file("plain.feat"), dir.file("mirror.feat"), 0.5f, dir.file("d"));
  CHECK(as_mirrored == on_flipped);
  CHECK(as_mirrored != plain);  // the mirrored grids and captions did change the training
  CHECK(half != plain);
  CHECK(half != as_mirrored);

  // the wrong cache in either place, and options that cannot go together, are one-line errors
  auto bad = [&](const std::function<void(TrainOptions&)>& change) {
    TrainOptions o;
    o.data = dir.file("plain"), o.features = dir.file("plain.feat"), o.mirror_features = dir.file("mirror.feat");
    o.init_from = dir.file("start/model.sat");
    o.epochs = 1, o.threads = 1, o.out = dir.file("bad");
    change(o);
    return error_of([&] { train(o); });
  };
  CHECK(bad([&](TrainOptions& o) { o.mirror_features = dir.file("plain.feat"); }) ==
        dir.file("plain.feat") +
            ": feature cache holds the photos as they are, not mirrored: make one with sat "
            "extract --mirror");
  CHECK(bad([&](TrainOptions& o) {
          o.features = dir.file("mirror.feat");
        }).find(dir.file("mirror.feat") + ": feature cache holds the photos mirrored") == 0);
  CHECK(bad([&](TrainOptions& o) { o.mirror_prob = 0; }) == "train: --mirror-prob must be in (0, 1]");
  CHECK(bad([&](TrainOptions& o) { o.objective = "cider"; }) ==
        "train: --mirror-features is for cross-entropy training, not --objective cider");
  CHECK(!file_exists(dir.file("bad/model.sat")));
}
