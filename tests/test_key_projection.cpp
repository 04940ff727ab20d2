// A caption memory's keys projected by canonical correlation analysis with its captions' words: the math, the
// nearest photos it finds, the memory and model file that keep it, and the damaged forms of that file.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "datasets/safetensors.hpp"
#include "tests/model_fixtures.hpp"
#include "tests/scratch.hpp"
#include "train/consensus.hpp"
#include "train/key_projection.hpp"
#include "train/model.hpp"
#include "train/search_policy.hpp"

using namespace sat;
using test::error_of;
using test::TempDir;

namespace {

// Photos of `topics` kinds: each key is mostly noise (dims - 2 channels of unit variance) with its topic written
// small into 2 channels; each photo's 5 captions say the topic's word (and common or random filler words).
struct TopicPhotos {
  Mat keys;
  std::vector<int> topic;
  std::vector<std::vector<std::string>> captions;
};

TopicPhotos topic_photos(int photos, int dims, int topics, Rng& rng) {
  TopicPhotos out;
  out.keys.resize(photos, dims);
  for (int i = 0; i < photos; ++i) {
    const int t = i % topics;
    out.topic.push_back(t);
    for (int d = 0; d < dims; ++d) out.keys(i, d) = (float)rng.normal();
    const double angle = 2 * M_PI * t / topics;
    out.keys(i, 0) = 0.6f * (float)std::cos(angle) + 0.05f * (float)rng.normal();
    out.keys(i, 1) = 0.6f * (float)std::sin(angle) + 0.05f * (float)rng.normal();
    out.keys.row(i).normalize();
    std::vector<std::string> caps;
    for (int c = 0; c < 5; ++c)
      caps.push_back("a topic" + std::to_string(t) + " with filler" + std::to_string(rng.integer(0, 11)));
    out.captions.push_back(caps);
  }
  return out;
}

// The share of each photo's k nearest others (by cosine of the rows of `keys`) of its own topic.
double same_topic_share(const Mat& keys, const std::vector<int>& topic, int k) {
  Mat unit = keys;
  for (int64_t i = 0; i < unit.rows(); ++i) unit.row(i).normalize();
  const Mat cosine = unit * unit.transpose();
  int same = 0;
  for (int64_t i = 0; i < unit.rows(); ++i) {
    std::vector<int> order;
    for (int64_t j = 0; j < unit.rows(); ++j)
      if (j != i) order.push_back((int)j);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return cosine(i, a) > cosine(i, b); });
    for (int m = 0; m < k; ++m) same += topic[order[m]] == topic[i];
  }
  return (double)same / (double)(unit.rows() * k);
}

}  // namespace

TEST_CASE("key projection: a key channel that counts a word's captions has canonical correlation 1") {
  Rng rng(3);
  const int n = 300, D = 6;
  Mat keys(n, D);
  std::vector<std::vector<std::string>> captions;
  for (int i = 0; i < n; ++i) {
    const int holding = rng.integer(0, 5);  // captions holding "dog": 0..5
    std::vector<std::string> caps;
    for (int c = 0; c < 5; ++c)
      caps.push_back(std::string(c < holding ? "a dog" : "a cat") + (rng.integer(0, 1) ? " runs" : " sits"));
    captions.push_back(caps);
    for (int d = 0; d < D; ++d) keys(i, d) = (float)rng.normal();
    keys(i, 3) = (float)holding;  // exactly linear in the word's column of the bag of words
  }
  KeyProjectionOptions o;
  o.dims = 2;
  o.regularization = 1e-6;
  o.power = 0;
  o.min_photos = 1;
  const KeyProjection p = learn_key_projection(keys, captions, o);
  CHECK(p.words == 5);  // a, dog, cat, runs, sits
  REQUIRE(p.correlations.size() == 2);
  CHECK(p.correlations[0] == doctest::Approx(1.0).epsilon(1e-4));
  CHECK(p.correlations[1] < 0.5);  // "dog" and "cat" are one direction; runs/sits are noise
  CHECK(p.center.size() == D);
  CHECK(p.center(3) == doctest::Approx(keys.col(3).mean()).epsilon(1e-5));
  // The first direction reads channel 3 alone.
  const Eigen::VectorXf first = p.map.col(0).normalized();
  CHECK(std::abs(first(3)) == doctest::Approx(1.0).epsilon(1e-3));
  // With power 2 the same directions, each scaled by its correlation squared.
  o.power = 2;
  const KeyProjection q = learn_key_projection(keys, captions, o);
  for (int k = 0; k < 2; ++k) {
    const double scale = q.map.col(k).norm() / p.map.col(k).norm();
    CHECK(scale == doctest::Approx(p.correlations[k] * p.correlations[k]).epsilon(1e-3));
  }
}

namespace {

// Pearson correlation of two equally long lists.
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const Eigen::Map<const Eigen::VectorXd> x(a.data(), (int64_t)a.size()), y(b.data(), (int64_t)b.size());
  const Eigen::VectorXd xc = x.array() - x.mean(), yc = y.array() - y.mean();
  return xc.dot(yc) / std::sqrt(xc.squaredNorm() * yc.squaredNorm());
}

}  // namespace

TEST_CASE("key projection: the word side is CCA's other half: a photo's captions land where its key does") {
  // Each photo's 5 captions are one sentence, so a caption stands for its photo's whole bag of words, and the
  // projected caption is the photo's canonical variate on the word side.
  Rng rng(13);
  const int n = 400, D = 6;
  Mat keys(n, D);
  std::vector<std::vector<std::string>> captions;
  std::vector<bool> dog(n);
  for (int i = 0; i < n; ++i) {
    dog[i] = rng.integer(0, 1) == 1;
    const std::string sentence = std::string(dog[i] ? "a dog" : "a cat") + (rng.integer(0, 1) ? " runs" : " sits");
    captions.push_back(std::vector<std::string>(5, sentence));
    for (int d = 0; d < D; ++d) keys(i, d) = (float)rng.normal();
    keys(i, 3) = dog[i] ? 1.f : 0.f;
  }
  KeyProjectionOptions o;
  o.dims = 2;
  o.regularization = 1e-6;
  o.power = 0;
  o.min_photos = 1;
  const KeyProjection p = learn_key_projection(keys, captions, o);
  REQUIRE(p.has_word_side());
  CHECK(p.vocabulary == std::vector<std::string>{"a", "cat", "dog", "runs", "sits"});
  CHECK(p.word_map.rows() == 5);
  CHECK(p.word_map.cols() == 2);
  CHECK(p.word_center.size() == 2);
  CHECK(p.word_map.row(0).norm() == 0);  // "a" is in every photo: no information, inverse document frequency 0
  CHECK(word_side_problem(p).empty());
  // Along the first direction the two variates agree (correlation 1) and each has unit variance (power 0).
  std::vector<double> key_side, word_side;
  for (int i = 0; i < n; ++i) {
    key_side.push_back(((keys.row(i) - p.center) * p.map)(0));
    word_side.push_back(project_caption(p, split_words(captions[i][0]))(0));
  }
  CHECK(correlation(key_side, word_side) == doctest::Approx(p.correlations[0]).epsilon(1e-4));
  CHECK(p.correlations[0] == doctest::Approx(1.0).epsilon(1e-4));
  const Eigen::Map<const Eigen::VectorXd> w(word_side.data(), n);
  CHECK(w.mean() == doctest::Approx(0.0).scale(1.0));  // the centre is the mean photo's bag
  CHECK((w.array() - w.mean()).square().mean() == doctest::Approx(1.0).epsilon(1e-3));
  // A word outside the vocabulary counts for nothing; a word said twice counts once.
  CHECK(project_caption(p, {"dog", "dog", "zebra"}) == project_caption(p, {"dog"}));

  // Relevance: with the weaker direction scaled down (power 4), every photo's own animal fits it better than the other.
  o.power = 4;
  const KeyProjection q = learn_key_projection(keys, captions, o);
  int right = 0;
  for (int i = 0; i < n; ++i) {
    const Vec key = (keys.row(i) - q.center) * q.map;
    const std::vector<double> r = caption_relevances(q, key.data(), {{"a", "dog", "runs"}, {"a", "cat", "runs"}});
    right += dog[i] ? r[0] > r[1] : r[1] > r[0];
  }
  CHECK(right == n);
  // Damage that a file could carry.
  KeyProjection bad = q;
  std::swap(bad.vocabulary[1], bad.vocabulary[2]);
  CHECK(word_side_problem(bad) == "its word side's vocabulary is not sorted without repeats (word 2)");
  bad = q;
  bad.word_map.conservativeResize(4, 2);
  CHECK(word_side_problem(bad) ==
        "its word side has 5 words, a 4 x 2 map and a centre of 2 (expected one row per word and 2 columns)");
  bad = q;
  bad.word_center(1) = std::nanf("");
  CHECK(word_side_problem(bad) == "its word side holds a value that is not a finite number");
}

TEST_CASE("key projection: photos whose captions share words become nearest, where the raw keys mix them") {
  Rng rng(5);
  const TopicPhotos photos = topic_photos(600, 24, 6, rng);
  KeyProjectionOptions o;
  o.dims = 4;
  const KeyProjection p = learn_key_projection(photos.keys, photos.captions, o);
  for (size_t k = 1; k < p.correlations.size(); ++k) CHECK(p.correlations[k] <= p.correlations[k - 1]);
  CHECK(p.correlations[0] > 0.9);
  Mat projected = photos.keys;
  projected.rowwise() -= p.center;
  projected = projected * p.map;
  const double raw = same_topic_share(photos.keys, photos.topic, 5);
  const double cca = same_topic_share(projected, photos.topic, 5);
  CAPTURE(raw);
  CAPTURE(cca);
  CHECK(raw < 0.5);
  CHECK(cca > 0.9);
}

TEST_CASE("key projection: shapes and options out of range are one-line errors") {
  Rng rng(7);
  const TopicPhotos photos = topic_photos(60, 8, 3, rng);
  KeyProjectionOptions o;
  o.dims = 9;
  CHECK(error_of([&] { learn_key_projection(photos.keys, photos.captions, o); }) ==
        "key projection: 9 directions asked of keys of dimension 8");
  o.dims = 4;
  CHECK(error_of([&] { learn_key_projection(photos.keys.topRows(7), photos.captions, o); }) ==
        "key projection: 7 keys but 60 caption lists");
  CHECK(error_of([&] {
          learn_key_projection(photos.keys.topRows(7), {photos.captions.begin(), photos.captions.begin() + 7}, o);
        }) == "key projection: 7 memory photos are too few for 4 directions (at least twice as many)");
  o.min_photos = 61;  // no word in that many photos
  CHECK(error_of([&] { learn_key_projection(photos.keys, photos.captions, o); }) ==
        "key projection: the captions hold 0 words in at least 61 photos each, fewer than the 4 directions asked");
  o.min_photos = 5;
  o.regularization = 0;
  CHECK(error_of([&] { learn_key_projection(photos.keys, photos.captions, o); }) ==
        "key projection: the regularization must be in (0, 100]");
  o.regularization = 0.01;
  o.power = -1;
  CHECK(error_of([&] { learn_key_projection(photos.keys, photos.captions, o); }) ==
        "key projection: the power must be in [0, 16]");
  o.power = 4;
  o.dims = 0;
  CHECK(error_of([&] { learn_key_projection(photos.keys, photos.captions, o); }).find("the dimension must be in") !=
        std::string::npos);
}

TEST_CASE("key projection: a projected memory keys each grid the same way, survives its model file, and damaged "
          "projections are errors") {
  TempDir dir;
  CaptionModel m;
  build_tiny_model(m, {{"a", "red", "circle"}, {"a", "blue", "square"}, {"the", "green", "triangle"}});
  Rng rng(11);
  m.init(rng);
  const int n = 40, D = m.encoder_config.feature_dim();
  const std::vector<float> planes = random_tiny_photos(rng, n);
  const Mat F = m.encode(planes, n);

  // The memory as build_caption_memory makes it: unit-length pooled keys, the projection learned from them, the
  // projected keys made unit length.
  auto memory = std::make_shared<CaptionMemory>();
  const char* said[] = {"a red circle", "the green triangle", "a blue square", "a red square"};
  const Mat pooled = mean_grid_vectors(F, n);
  memory->keys = pooled;
  for (int i = 0; i < n; ++i) {
    memory->keys.row(i).normalize();
    memory->captions.push_back({said[i % 4], said[(i + i / 4) % 4]});
  }
  KeyProjectionOptions o;
  o.dims = 3;
  o.min_photos = 2;
  memory->projection = learn_key_projection(memory->keys, memory->captions, o);
  memory->projection_options = o;
  const Mat raw_unit = memory->keys;
  memory->keys = memory->projected_keys(memory->keys);
  for (int i = 0; i < n; ++i) memory->keys.row(i).normalize();
  memory->prepare(D, "mem");
  CHECK(memory->keys.cols() == 3);

  // key_vectors: pooled, of unit length, centred, mapped (the query's length does not matter to nearest()).
  const Mat queries = memory->key_vectors(F, n);
  REQUIRE(queries.rows() == n);
  REQUIRE(queries.cols() == 3);
  for (int i = 0; i < n; ++i) {
    const Vec want = (raw_unit.row(i) - memory->projection.center) * memory->projection.map;
    for (int k = 0; k < 3; ++k) CHECK(queries(i, k) == doctest::Approx(want(k)).epsilon(1e-4));
    CHECK(memory->nearest(queries.row(i).data(), 1)[0] == i);  // each photo finds its own key first
  }

  m.memory = memory;
  m.consensus = {5, 20.0};
  m.consensus.relevance_weight = 2;
  m.consensus.neighbour_evidence = 0.75;
  REQUIRE(memory->weighs_relevance());
  const std::string path = dir.file("cca.sat");
  m.save(path);
  auto loaded = CaptionModel::load(path);
  REQUIRE(loaded->memory);
  REQUIRE(loaded->memory->projected());
  CHECK(loaded->memory->projection_options.dims == 3);
  CHECK(loaded->memory->projection_options.power == 4);
  CHECK(loaded->memory->projection.words == memory->projection.words);
  CHECK(loaded->memory->projection.map == memory->projection.map);  // float32: exact
  CHECK(loaded->memory->projection.center == memory->projection.center);
  CHECK(loaded->memory->keys.cols() == 3);
  // The word side: the vocabulary and centre exactly, the map within float16's rounding.
  const KeyProjection& words = loaded->memory->projection;
  CHECK(loaded->consensus.relevance_weight == 2);
  CHECK(loaded->consensus.neighbour_evidence == 0.75);
  CHECK(words.vocabulary == memory->projection.vocabulary);
  CHECK(words.word_center == memory->projection.word_center);
  REQUIRE(words.word_map.rows() == memory->projection.word_map.rows());
  CHECK((words.word_map - memory->projection.word_map).cwiseAbs().maxCoeff() <=
        1e-3f * memory->projection.word_map.cwiseAbs().maxCoeff());
  // A search weighing relevance: each candidate's is its words' cosine with the photo's key, and the total has it.
  const std::vector<CandidateList> lists = loaded->search(F, n, search_with(*loaded, 4, 0.5, 0, {}, {}, {}, 4));
  for (int i = 0; i < n; ++i) {
    std::vector<Tokens> said;
    for (auto& c : lists[i].candidates) said.push_back(loaded->vocab.decode(c.hypothesis.tokens));
    const std::vector<double> want = caption_relevances(words, queries.row(i).data(), said);
    for (size_t k = 0; k < said.size(); ++k) {
      const Candidate& c = lists[i].candidates[k];
      CHECK(c.relevance == doctest::Approx(want[k]).epsilon(1e-3));
      CHECK(c.total == doctest::Approx(c.hypothesis.score + 20 * c.agreement + 2 * c.relevance));
    }
  }
  m.consensus.relevance_weight = 0;  // the keys alone (the stored map is float16, the relevance a little different)
  SearchOptions keys_alone;
  keys_alone.beam = 4, keys_alone.length_norm = 0.5, keys_alone.relevance_weight = 0;
  const auto before = m.search_kept(F, n, resolve_search(m, keys_alone, "m"));
  const auto after = loaded->search_kept(F, n, resolve_search(*loaded, keys_alone, "loaded"));
  for (int i = 0; i < n; ++i) CHECK(before[i].tokens == after[i].tokens);

  auto damaged = [&](const std::string& name, const std::function<void(TensorFile&)>& damage) {
    return load_error_of_changed(path, dir.file(name), damage);
  };
  CHECK(damaged("p1.sat", [](TensorFile& tf) { tf.tensors.erase(kMemoryKeyMap); }) ==
        dir.file("p1.sat") + ": caption memory's key projection needs the float32 tensors 'memory.key_center' and "
                             "'memory.key_map'");
  CHECK(damaged("p2.sat", [&](TensorFile& tf) {
          Param wrong(kMemoryKeyMap, {(int64_t)D, 4}, false);
          tf.tensors.erase(kMemoryKeyMap);
          tf.tensors.emplace(kMemoryKeyMap, std::move(wrong));
        }) == dir.file("p2.sat") + ": caption memory's key projection tensors have the wrong shapes (a 1 x D centre "
                                   "and a D x 3 map)");
  CHECK(damaged("p3.sat", [&](TensorFile& tf) {
          auto c = nlohmann::json::parse(tf.metadata["consensus"]);
          c["key_projection"]["kind"] = "pca";
          tf.metadata["consensus"] = c.dump();
        }) == dir.file("p3.sat") + ": caption memory's key projection is of an unknown kind 'pca' (this build knows "
                                   "cca)");
  CHECK(damaged("p4.sat", [&](TensorFile& tf) {
          tf.tensors.at(kMemoryKeyMap).value[0] = std::nanf("");
        }) == dir.file("p4.sat") + ": caption memory's key projection holds a value that is not a finite number");
  CHECK(damaged("p5.sat", [&](TensorFile& tf) {
          auto c = nlohmann::json::parse(tf.metadata["consensus"]);
          c["key_projection"].erase("words");
          tf.metadata["consensus"] = c.dump();
        }).find(dir.file("p5.sat") + ": ") == 0);
  CHECK(damaged("p6.sat", [&](TensorFile& tf) {  // the keys of a memory before its projection
          Param wrong(kMemoryKeys, {n, (int64_t)D}, false);
          for (auto& v : wrong.value) v = 1.f / std::sqrt((float)D);
          tf.tensors.erase(kMemoryKeys);
          tf.half.erase(kMemoryKeys);
          tf.tensors.emplace(kMemoryKeys, std::move(wrong));
        }) == dir.file("p6.sat") + ": caption memory vectors have " + std::to_string(D) +
                  " values, its key projection 3");
  CHECK(damaged("w1.sat", [](TensorFile& tf) {
          tf.tensors.erase(kMemoryWordMap);
          tf.half.erase(kMemoryWordMap);
        }) == dir.file("w1.sat") + ": caption memory's key projection has a vocabulary but not the tensors "
                                   "'memory.word_map' (words x dims) and 'memory.word_center' (1 x dims)");
  auto header_projection = [](TensorFile& tf, const std::function<void(nlohmann::json&)>& change) {
    auto c = nlohmann::json::parse(tf.metadata["consensus"]);
    change(c);
    tf.metadata["consensus"] = c.dump();
  };
  CHECK(damaged("w2.sat", [&](TensorFile& tf) {
          header_projection(tf, [](nlohmann::json& c) { c["key_projection"].erase("vocabulary"); });
        }) == dir.file("w2.sat") + ": caption memory's key projection has word-side tensors but no \"vocabulary\" in "
                                   "its header");
  CHECK(damaged("w3.sat", [&](TensorFile& tf) {
          header_projection(tf, [](nlohmann::json& c) {
            auto& v = c["key_projection"]["vocabulary"];
            std::swap(v[0], v[1]);
          });
        }) == dir.file("w3.sat") + ": caption memory's key projection: its word side's vocabulary is not sorted "
                                   "without repeats (word 1)");
  CHECK(damaged("w4.sat", [&](TensorFile& tf) {  // a memory built before the word side, with relevance asked of it
          header_projection(tf, [](nlohmann::json& c) { c["key_projection"].erase("vocabulary"); });
          tf.tensors.erase(kMemoryWordMap), tf.half.erase(kMemoryWordMap), tf.tensors.erase(kMemoryWordCenter);
        }) == dir.file("w4.sat") + ": consensus relevance_weight needs the word side of a key projection, and the "
                                   "caption memory has none");
  CHECK(damaged("w5.sat", [&](TensorFile& tf) {
          header_projection(tf, [](nlohmann::json& c) { c["relevance_weight"] = 101; });
        }) == dir.file("w5.sat") + ": consensus relevance_weight must be in [0, 100]");
  CHECK(damaged("w6.sat", [&](TensorFile& tf) {
          header_projection(tf, [](nlohmann::json& c) { c["neighbour_evidence"] = 1.5; });
        }) == dir.file("w6.sat") + ": consensus neighbour_evidence must be in [0, 1]");
}
