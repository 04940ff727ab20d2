// The public API (train/sat/captioner.hpp) through libsat.so, as a program linking it sees it: the captions the CLI's
// path gives, every input kind, batches, attention, errors, and one Captioner shared by threads.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <thread>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "datasets/synth.hpp"
#include "tests/scratch.hpp"
#include "train/model.hpp"
#include "train/sat/captioner.hpp"
#include "train/sat/scores.hpp"
#include "vision/image.hpp"

namespace {

const std::string kSource = SAT_SOURCE_DIR;
const std::string kSynthModel = kSource + "/models/synth.sat";
const std::string kInceptionModel = kSource + "/models/flickr8k-inception.sat";
const std::string kScene = kSource + "/examples/scene.png";
const std::string kPhoto = kSource + "/examples/dog_and_man.jpg";

std::vector<uint8_t> file_bytes(const std::string& path) {
  const std::string s = sat::read_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

// Scenes of the kind synth.sat was trained on (its test seed), as BGR images.
std::vector<cv::Mat> synth_scenes(int n) {
  std::vector<cv::Mat> out;
  for (int i = 0; i < n; ++i) {
    sat::SynthScene scene = sat::make_synth_scene(777, i, 128);
    out.push_back(cv::Mat(128, 128, CV_8UC3, scene.bgr.data()).clone());
  }
  return out;
}

// What `sat caption --model M FILE` computes for one file, through the internal classes.
sat::Hypothesis cli_hypothesis(const std::string& model_path, const std::string& image) {
  auto model = sat::CaptionModel::load(model_path);
  sat::Mat F = model->encode(model->load_planes({image}), 1);
  return model->search_kept(F, 1, sat::stored_search(*model))[0];
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const sat::Error& e) {
    return e.what();
  }
  return "(no error)";
}

void check_same(const sat::CaptionResult& a, const sat::CaptionResult& b) {
  CHECK(a.text == b.text);
  CHECK(a.words == b.words);
  CHECK(a.logprob == b.logprob);
  REQUIRE(a.attention.size() == b.attention.size());
  for (size_t w = 0; w < a.attention.size(); ++w) CHECK(a.attention[w].weights == b.attention[w].weights);
}

}  // namespace

TEST_CASE("captioner: a file's caption and log-probability are the CLI's, with the model's search settings") {
  for (const std::string& path : {kSynthModel, kInceptionModel}) {
    const std::string image = path == kSynthModel ? kScene : kPhoto;
    sat::Captioner captioner(path);
    const sat::CaptionResult c = captioner.caption_file(image);
    const sat::Hypothesis h = cli_hypothesis(path, image);
    auto model = sat::CaptionModel::load(path);
    CHECK(c.words == model->vocab.decode(h.tokens));
    CHECK(c.text == sat::join_words(c.words));
    CHECK(c.logprob == h.logprob);
    CHECK(c.logprob < 0);
    CHECK(c.attention.empty());
    const sat::ModelInfo info = captioner.info();
    CHECK(info.beam == model->beam);
    CHECK(info.length_norm == model->length_norm);
    CHECK(info.no_repeat_ngram == model->no_repeat_ngram);
    CHECK(info.grid_rows == model->encoder_config.grid_h());
    CHECK(info.input_size == model->encoder_config.input_size);
    MESSAGE(path << ": " << c.text << " (log p " << c.logprob << ")");
  }
}

TEST_CASE("captioner: a cv::Mat, the file and its bytes give one caption; grey and BGRA images are converted") {
  sat::Captioner captioner(kSynthModel);
  const sat::CaptionResult from_file = captioner.caption_file(kScene);
  const std::vector<uint8_t> bytes = file_bytes(kScene);
  check_same(captioner.caption_bytes(bytes), from_file);
  check_same(captioner.caption_bytes(bytes.data(), bytes.size()), from_file);
  const cv::Mat bgr = cv::imread(kScene, cv::IMREAD_COLOR);
  check_same(captioner.caption(bgr), from_file);
  cv::Mat bgra, grey, grey_bgr;
  cv::cvtColor(bgr, bgra, cv::COLOR_BGR2BGRA);
  check_same(captioner.caption(bgra), from_file);
  cv::cvtColor(bgr, grey, cv::COLOR_BGR2GRAY);
  cv::cvtColor(grey, grey_bgr, cv::COLOR_GRAY2BGR);
  check_same(captioner.caption(grey), captioner.caption(grey_bgr));
}

TEST_CASE("captioner: a batch gives each image's own caption, in order") {
  sat::Captioner captioner(kSynthModel);
  const std::vector<cv::Mat> scenes = synth_scenes(20);  // more than one encoder batch (16)
  const std::vector<sat::CaptionResult> batch = captioner.caption(scenes);
  REQUIRE(batch.size() == scenes.size());
  int differ = 0;
  for (size_t i = 0; i < scenes.size(); ++i) {
    const sat::CaptionResult one = captioner.caption(scenes[i]);
    CHECK(batch[i].text == one.text);
    CHECK(std::abs(batch[i].logprob - one.logprob) < 1e-4);
    differ += batch[i].text != batch[0].text;
  }
  CHECK(differ > 0);  // the scenes are told apart
  std::vector<std::vector<uint8_t>> encoded;
  for (const cv::Mat& m : scenes) {
    std::vector<uint8_t> png;
    cv::imencode(".png", m, png);
    encoded.push_back(png);
  }
  const std::vector<sat::CaptionResult> from_bytes = captioner.caption_bytes(encoded);
  for (size_t i = 0; i < scenes.size(); ++i) check_same(from_bytes[i], batch[i]);
  CHECK(captioner.caption(std::vector<cv::Mat>{}).empty());
  const auto files = captioner.caption_files({kScene, kScene});
  REQUIRE(files.size() == 2);
  check_same(files[0], files[1]);
}

TEST_CASE("captioner: explicit search settings replace the model's") {
  sat::Captioner captioner(kInceptionModel);
  const sat::ModelInfo info = captioner.info();
  sat::CaptionOptions stored;
  stored.beam = info.beam, stored.length_norm = info.length_norm, stored.no_repeat_ngram = info.no_repeat_ngram;
  check_same(captioner.caption_file(kPhoto, stored), captioner.caption_file(kPhoto));

  // greedy is what the internal greedy search gives
  sat::CaptionOptions greedy;
  greedy.beam = 1;
  auto model = sat::CaptionModel::load(kInceptionModel);
  sat::Mat F = model->encode(model->load_planes({kPhoto}), 1);
  const sat::Hypothesis g = sat::greedy_search(*model->decoder, F, 1, model->max_len, model->no_repeat_ngram)[0];
  const sat::CaptionResult c = captioner.caption_file(kPhoto, greedy);
  CHECK(c.words == model->vocab.decode(g.tokens));
  CHECK(c.logprob == g.logprob);
  // and an explicit beam is the internal beam search with exactly those settings (not the model's)
  sat::CaptionOptions wide;
  wide.beam = 8, wide.length_norm = 0.0, wide.no_repeat_ngram = 0;
  const sat::Hypothesis b = sat::beam_search(*model->decoder, F, 1, 8, model->max_len, 0.0, 0)[0];
  const sat::CaptionResult w = captioner.caption_file(kPhoto, wide);
  CHECK(w.words == model->vocab.decode(b.tokens));
  CHECK(w.logprob == b.logprob);
  CHECK((info.beam != 8 || info.length_norm != 0.0 || info.no_repeat_ngram != 0));

  struct Setting {
    int beam;
    double length_norm;
    int no_repeat_ngram;
  };
  for (const Setting& s : {Setting{0, 0.5, 0}, Setting{101, 0.5, 0}, Setting{3, -0.1, 0}, Setting{3, 2.5, 0},
                           Setting{3, 0.5, 10}, Setting{3, 0.5, -1}}) {
    sat::CaptionOptions bad;
    bad.beam = s.beam, bad.length_norm = s.length_norm, bad.no_repeat_ngram = s.no_repeat_ngram;
    CHECK_THROWS_AS(captioner.caption_file(kPhoto, bad), sat::Error);
  }
  // consensus reranking: this model has no caption memory, so weight 0 is its own search and more is an error
  CHECK(info.memory_photos == 0);
  sat::CaptionOptions off;
  off.consensus_weight = 0.0;
  check_same(captioner.caption_file(kPhoto, off), captioner.caption_file(kPhoto));
  for (double w : {2.0, -1.0, 1001.0}) {
    sat::CaptionOptions bad;
    bad.consensus_weight = w;
    CHECK_THROWS_AS(captioner.caption_file(kPhoto, bad), sat::Error);
  }
  CHECK(info.memory_candidates == 0);
  sat::CaptionOptions no_memory;
  no_memory.memory_candidates = 0;
  check_same(captioner.caption_file(kPhoto, no_memory), captioner.caption_file(kPhoto));
  no_memory.memory_candidates = 1;  // no memory to take captions from
  CHECK_THROWS_AS(captioner.caption_file(kPhoto, no_memory), sat::Error);
  // The detector's evidence, in reranking and steering the beam: off for this model (it reads no detector), and
  // asking for either is an error naming it
  CHECK(info.object_evidence == 0);
  CHECK(info.beam_evidence == 0);
  for (const auto& option : {std::pair{&sat::CaptionOptions::object_evidence, "object_evidence"},
                              std::pair{&sat::CaptionOptions::beam_evidence, "beam_evidence"}}) {
    const std::string name = option.second;
    CAPTURE(name);
    sat::CaptionOptions asked;
    asked.*option.first = 0;
    check_same(captioner.caption_file(kPhoto, asked), captioner.caption_file(kPhoto));
    asked.*option.first = 2;
    const std::string error = "has no object channels for " + name;
    CHECK_THROWS_WITH_AS(captioner.caption_file(kPhoto, asked), doctest::Contains(error.c_str()), sat::Error);
  }
  sat::CaptionOptions evidence;
  evidence.evidence_threshold = 1.5;
  CHECK_THROWS_WITH_AS(captioner.caption_file(kPhoto, evidence), doctest::Contains("evidence_threshold must be in [0, 1]"),
                       sat::Error);

  // Diverse beam groups: the same captions the search gives with them; groups that do not divide the beam, or a
  // penalty out of range, are errors.
  CHECK(info.beam_groups == 1);
  CHECK(info.diversity == 0);
  sat::CaptionOptions diverse = wide;
  diverse.beam_groups = 4, diverse.diversity = 2.0, diverse.candidates = 100;
  const auto grouped = sat::beam_search_nbest(*model->decoder, F, 1, 8, model->max_len, 0.0, 0, {4, 2.0});
  const sat::CaptionResult d = captioner.caption_file(kPhoto, diverse);
  REQUIRE(d.candidates.size() == grouped[0].size());
  for (size_t k = 0; k < grouped[0].size(); ++k)
    CHECK(d.candidates[k].text == sat::join_words(model->vocab.decode(grouped[0][k].tokens)));
  for (auto [groups, penalty] : {std::pair{3, 1.0}, std::pair{0, 1.0}, std::pair{2, -1.0}, std::pair{2, 101.0}}) {
    sat::CaptionOptions bad = wide;
    bad.beam_groups = groups, bad.diversity = penalty;
    CHECK_THROWS_AS(captioner.caption_file(kPhoto, bad), sat::Error);
  }

  // The candidates behind a caption: the beam's list, best score first; the kept one is the caption.
  sat::CaptionOptions listed = wide;
  listed.candidates = 3;
  const sat::CaptionResult l = captioner.caption_file(kPhoto, listed);
  check_same(l, w);
  const auto lists = sat::beam_search_nbest(*model->decoder, F, 1, 8, model->max_len, 0.0, 0);
  REQUIRE(l.candidates.size() == std::min<size_t>(3, lists[0].size()));
  for (size_t k = 0; k < l.candidates.size(); ++k) {
    const sat::CaptionCandidate& c = l.candidates[k];
    CHECK(c.rank == (int)k + 1);
    CHECK(c.text == sat::join_words(model->vocab.decode(lists[0][k].tokens)));
    CHECK(c.logprob == lists[0][k].logprob);
    CHECK(c.score == lists[0][k].score);
    CHECK(c.total == c.score);  // no reranking
    CHECK(c.agreement == 0);
    CHECK(c.chosen == (k == 0));
    CHECK(c.memory_photo == -1);
  }
  CHECK(l.candidates[0].text == l.text);
  CHECK(captioner.caption_file(kPhoto, wide).candidates.empty());  // only when asked for
  for (int n : {-1, 101}) {
    sat::CaptionOptions bad;
    bad.candidates = n;
    CHECK_THROWS_AS(captioner.caption_file(kPhoto, bad), sat::Error);
  }
}

TEST_CASE("captioner: include makes every caption say the word, as the constrained search finds it") {
  sat::Captioner captioner(kInceptionModel);
  sat::CaptionOptions with_dog;
  with_dog.include = "Dog";  // tokenized as captions are: lower case
  with_dog.candidates = 3;
  const sat::CaptionResult c = captioner.caption_file(kPhoto, with_dog);
  CHECK(std::count(c.words.begin(), c.words.end(), "dog") >= 1);
  REQUIRE(!c.candidates.empty());
  for (const auto& cand : c.candidates) CHECK(cand.text.find("dog") != std::string::npos);
  // the internal constrained search with the model's settings gives the same caption
  auto model = sat::CaptionModel::load(kInceptionModel);
  sat::Mat F = model->encode(model->load_planes({kPhoto}), 1);
  sat::SearchOptions dog;
  dog.include = "dog";
  const auto lists = model->search(F, 1, sat::resolve_search(*model, dog, kInceptionModel));
  const sat::Hypothesis& h = lists[0].candidates[lists[0].chosen].hypothesis;
  CHECK(c.words == model->vocab.decode(h.tokens));
  CHECK(c.logprob == h.logprob);
  CHECK(captioner.caption_file(kPhoto).text != c.text);  // the plain caption has no dog
  // words it cannot require are refused before any work, by check() and caption() alike
  sat::CaptionOptions zebra;
  zebra.include = "zebrafish";
  CHECK(error_of([&] {
          captioner.check(zebra);
        }).rfind(std::string(kInceptionModel) + ": does not know the word 'zebrafish' (include)", 0) == 0);
  CHECK_THROWS_AS(captioner.caption_file(kPhoto, zebra), sat::Error);
  sat::CaptionOptions two;
  two.include = "black dog";
  CHECK(error_of([&] { captioner.check(two); }) == "include takes one word, got 'black dog'");
  captioner.check(with_dog);  // fine
}

TEST_CASE("captioner: attention grids per word, and hard attention's glimpse at the grid's peak") {
  sat::CaptionOptions with_attention;
  with_attention.attention = true;
  {
    sat::Captioner captioner(kSynthModel);
    const sat::ModelInfo info = captioner.info();
    const sat::CaptionResult c = captioner.caption_file(kScene, with_attention);
    REQUIRE(c.attention.size() == c.words.size());
    CHECK(c.glimpses.empty());  // soft attention
    for (const sat::AttentionGrid& g : c.attention) {
      CHECK(g.rows == info.grid_rows);
      CHECK(g.cols == info.grid_cols);
      REQUIRE(g.weights.size() == (size_t)g.rows * g.cols);
      double sum = 0;
      for (float w : g.weights) sum += w;
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-4));
    }
    check_same(captioner.caption_file(kScene), [&] {
      sat::CaptionResult plain = c;
      plain.attention.clear();
      return plain;
    }());
  }
  // A hard-attention decoder (random weights: the glimpses, not the words, are under test) over synth's encoder
  auto model = sat::CaptionModel::load(kSynthModel);
  model->decoder_config.attention = "hard";
  model->build();
  sat::Rng rng(7);
  model->decoder->init(rng);
  const std::string path = "/tmp/sat_test_captioner_hard.sat";
  model->save(path);
  sat::Captioner captioner(path);
  CHECK(captioner.info().attention == "hard");
  const sat::CaptionResult c = captioner.caption_file(kScene, with_attention);
  REQUIRE(!c.words.empty());
  REQUIRE(c.glimpses.size() == c.words.size());
  REQUIRE(c.attention.size() == c.words.size());
  for (size_t w = 0; w < c.words.size(); ++w) {
    const sat::AttentionGrid& g = c.attention[w];
    const size_t peak = std::max_element(g.weights.begin(), g.weights.end()) - g.weights.begin();
    CHECK(c.glimpses[w].row == (int)peak / g.cols);
    CHECK(c.glimpses[w].col == (int)peak % g.cols);
  }
  std::remove(path.c_str());
}

TEST_CASE("captioner: bad images and models throw sat::Error with the CLI's one-line message") {
  sat::Captioner captioner(kSynthModel);
  const std::string dir = "/tmp/sat_test_captioner";
  sat::make_dirs(dir);
  const std::string missing = dir + "/missing.jpg", text = dir + "/notes.jpg", cut = dir + "/cut.jpg";
  sat::write_file_atomic(text, "not an image\n");
  const std::string jpeg = sat::read_file(kPhoto);
  sat::write_file_atomic(cut, jpeg.substr(0, jpeg.size() / 2));
  // the CLI prints "sat: " and the message load_image_bgr throws
  for (const std::string& file : {missing, text, cut}) {
    const std::string cli = error_of([&] { sat::load_image_bgr(file); });
    CHECK(cli.rfind(file + ": ", 0) == 0);
    CHECK(error_of([&] { captioner.caption_file(file); }) == cli);
    CHECK(error_of([&] { captioner.caption_files({kScene, file}); }) == cli);
  }
  CHECK(error_of([&] { captioner.caption_bytes(file_bytes(text)); }) ==
        "image bytes: cannot decode image (not a JPEG, PNG, WebP, BMP, GIF, TIFF or PNM file: corrupt or another format)");
  CHECK(error_of([&] { captioner.caption_bytes(nullptr, 0); }) == "image bytes: empty file, not an image");
  const std::vector<std::vector<uint8_t>> second_empty{file_bytes(kScene), {}};
  CHECK(error_of([&] { captioner.caption_bytes(second_empty); }) == "image bytes[1]: empty file, not an image");
  const std::string half = jpeg.substr(0, jpeg.size() / 2);
  CHECK(error_of([&] { captioner.caption_bytes(reinterpret_cast<const uint8_t*>(half.data()), half.size()); }) ==
        "image bytes: truncated JPEG (" + std::to_string(half.size()) + " bytes, no end-of-image marker)");
  // half a photo with an end-of-image marker appended decodes (its lower half grey): refused unless allow_damaged
  const std::string half_ended = dir + "/half_ended.jpg";
  sat::write_file_atomic(half_ended, half + "\xFF\xD9");
  CHECK(error_of([&] {
          captioner.caption_file(half_ended);
        }).rfind(half_ended + ": damaged JPEG: scan 1's data ends", 0) == 0);
  sat::CaptionOptions anyway;
  anyway.allow_damaged = true;
  CHECK(!captioner.caption_file(half_ended, anyway).words.empty());
  CHECK(!captioner.caption_files({half_ended}, anyway)[0].words.empty());
  CHECK(error_of([&] { captioner.caption(cv::Mat()); }) == "image: empty image");
  CHECK(error_of([&] { captioner.caption(std::vector<cv::Mat>{cv::Mat(8, 8, CV_32FC3)}); }) ==
        "image[0]: expected an 8-bit BGR image (as cv::imread gives), got CV_32FC3");

  // models: missing, not a model, a truncated model file
  const std::string model_bytes = sat::read_file(kSynthModel);
  const std::string short_model = dir + "/short.sat";
  sat::write_file_atomic(short_model, model_bytes.substr(0, model_bytes.size() - 1000));
  for (const std::string& file : {dir + "/missing.sat", text, short_model}) {
    const std::string cli = error_of([&] { sat::CaptionModel::load(file); });
    CHECK(cli.rfind(file + ": ", 0) == 0);
    CHECK(error_of([&] { sat::Captioner c(file); }) == cli);
  }
  CHECK_THROWS_AS(sat::Captioner(kSynthModel, sat::LoadOptions{"", -1, ""}), sat::Error);
  CHECK(error_of([&] {
          sat::Captioner c(kSynthModel, sat::LoadOptions{"", 0, "fp8"});
        }) == "unknown encoder precision 'fp8' (f32, bf16, int8 or auto)");
  // the Captioner that saw all of this still captions
  CHECK(captioner.caption_file(kScene).text == sat::Captioner(kSynthModel).caption_file(kScene).text);
  for (const std::string& f : {text, cut, short_model}) std::remove(f.c_str());
}

TEST_CASE("captioner: threads sharing one Captioner get the captions one thread gets") {
  for (const std::string& path : {kSynthModel, kInceptionModel}) {
    sat::Captioner captioner(path, sat::LoadOptions{"", 2, ""});
    std::vector<cv::Mat> images = synth_scenes(path == kSynthModel ? 8 : 2);
    images.push_back(cv::imread(kScene));
    images.push_back(cv::imread(kPhoto));
    sat::CaptionOptions options;
    options.attention = true;
    std::vector<sat::CaptionResult> expected;
    for (const cv::Mat& m : images) expected.push_back(captioner.caption(m, options));

    const int kThreads = 4;
    std::vector<std::vector<sat::CaptionResult>> got(kThreads, std::vector<sat::CaptionResult>(images.size()));
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (size_t k = 0; k < images.size(); ++k) {  // each thread in its own order
          const size_t i = (k + t * 3) % images.size();
          got[t][i] = captioner.caption(images[i], options);
        }
      });
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t)
      for (size_t i = 0; i < images.size(); ++i) check_same(got[t][i], expected[i]);
  }
}

TEST_CASE("captioner: the default ResNet-101 model finds the shared weights, or says where it looked") {
  const std::string model = kSource + "/models/flickr8k.sat";
  const std::string weights_dir = std::string(SAT_SHARED_DATA) + "/../models";
  if (!sat::file_exists(weights_dir + "/resnet_v2_101/resnet_v2_101.safetensors")) {
    MESSAGE("skipped: " << weights_dir << "/resnet_v2_101 not present (the shared ResNet-101 v2 weights)");
    return;
  }
  sat::Captioner captioner(model, sat::LoadOptions{weights_dir, 0, ""});
  CHECK(captioner.info().encoder_weights == weights_dir + "/resnet_v2_101/resnet_v2_101.safetensors");
  const sat::CaptionResult c = captioner.caption_file(kPhoto);
  const sat::Hypothesis h = cli_hypothesis(model, kPhoto);
  CHECK(c.logprob == h.logprob);
  CHECK(c.words.size() == h.tokens.size());
  // the model stores "auto": bfloat16 where it is the faster arithmetic; LoadOptions chooses float32 instead
  CHECK(captioner.info().encoder_precision == (sat::cpu_prefers_bf16() ? "bf16" : "f32"));
  MESSAGE(model << " (" << captioner.info().encoder_precision << " encoder): " << c.text);
  sat::Captioner full(model, sat::LoadOptions{weights_dir, 0, "f32"});
  CHECK(full.info().encoder_precision == "f32");
  const sat::CaptionResult f = full.caption_file(kPhoto);
  CHECK(!f.words.empty());
  if (sat::cpu_prefers_bf16()) CHECK(f.logprob != c.logprob);  // the grid rounded differently
  MESSAGE(model << " (f32 encoder): " << f.text);
  // the objects beside the caption (../shared/models/centernet_mobilenetv3): the example's man and dog, the caption
  // unchanged by asking for them
  if (!sat::file_exists(weights_dir + "/centernet_mobilenetv3/centernet.json")) return;
  sat::CaptionOptions with_objects;
  with_objects.objects = true;
  const sat::CaptionResult o = full.caption_file(kPhoto, with_objects);
  CHECK(o.text == f.text);
  REQUIRE(o.objects.size() >= 2);
  CHECK(o.objects[0].name == "person");
  CHECK(o.objects[1].name == "dog");
  CHECK(o.objects[0].score == doctest::Approx(0.478).epsilon(0.01));
  CHECK(o.objects[0].score >= o.objects[1].score);
  CHECK(f.objects.empty());
  with_objects.object_threshold = 2;
  CHECK_THROWS_WITH_AS(full.check(with_objects), doctest::Contains("object_threshold must be in [0, 1]"), sat::Error);
}

TEST_CASE("captioner: encode gives the grid the caption search reads, for a file, a cv::Mat and a batch") {
  sat::Captioner captioner(kSynthModel);
  auto model = sat::CaptionModel::load(kSynthModel);
  const sat::Mat F = model->encode(model->load_planes({kScene}), 1);
  const sat::FeatureGrid g = captioner.encode_file(kScene);
  REQUIRE(g.rows == captioner.info().grid_rows);
  REQUIRE(g.cols == captioner.info().grid_cols);
  REQUIRE(g.depth == (int)F.cols());
  REQUIRE(g.values.size() == (size_t)F.size());
  CHECK(std::equal(g.values.begin(), g.values.end(), F.data()));
  CHECK(g.at(g.rows - 1, 1, 3) == F((g.rows - 1) * g.cols + 1, 3));  // cell-major, row-major cells
  CHECK(captioner.encode(cv::imread(kScene, cv::IMREAD_COLOR)).values == g.values);
  const std::vector<cv::Mat> scenes = synth_scenes(3);
  const std::vector<sat::FeatureGrid> batch = captioner.encode(scenes);
  REQUIRE(batch.size() == 3);
  for (size_t i = 0; i < scenes.size(); ++i) {
    const sat::FeatureGrid one = captioner.encode(scenes[i]);
    REQUIRE(one.values.size() == batch[i].values.size());
    for (size_t k = 0; k < one.values.size(); ++k) REQUIRE(std::fabs(one.values[k] - batch[i].values[k]) < 1e-4f);
  }
  CHECK(batch[0].values != batch[1].values);  // each image its own grid
  CHECK(error_of([&] { captioner.encode_files({kScene, "/nonexistent/x.png"}); }).rfind("/nonexistent/x.png:", 0) == 0);
  CHECK(captioner.encode(std::vector<cv::Mat>{}).empty());
}

TEST_CASE("scores: sat::score and sat::score_files compute sat eval's metrics") {
  // clipped n-gram precisions 5/6, 3/5, 1/4 with no brevity penalty; LCS 5 of 6 words; one image: CIDEr-D's idf is 0
  const sat::Scores s = sat::score({"a dog runs on the grass"}, {{"a dog runs in the grass"}});
  CHECK(s.images == 1);
  CHECK(s.bleu[0] == doctest::Approx(5.0 / 6).epsilon(1e-6));
  CHECK(s.bleu[1] == doctest::Approx(std::sqrt(0.5)).epsilon(1e-6));
  CHECK(s.bleu[2] == doctest::Approx(0.5).epsilon(1e-6));
  CHECK(s.rouge_l == doctest::Approx(5.0 / 6));
  CHECK(s.cider_d == 0);
  const sat::test::TempDir tmp;
  const std::string dir = tmp.path;
  sat::write_file_atomic(dir + "/refs.json", R"({"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
    "annotations": [{"image_id": 1, "id": 1, "caption": "A dog runs in the grass."},
                    {"image_id": 2, "id": 2, "caption": "two kids play in the water"},
                    {"image_id": 2, "id": 3, "caption": "children splash in a pool"}]})");
  sat::write_file_atomic(dir + "/results.json", R"([{"image_id": 2, "caption": "kids play in the water"},
                                                    {"image_id": "a.jpg", "caption": "a dog runs on the grass"}])");
  const sat::Scores files = sat::score_files(dir + "/results.json", dir + "/refs.json");
  const sat::Scores lists = sat::score({"kids play in the water", "a dog runs on the grass"},
                                       {{"two kids play in the water", "children splash in a pool"},
                                        {"A dog runs in the grass."}});
  const sat::Scores ids = sat::score_files({"2", "a"}, {"kids play in the water", "a dog runs on the grass"},
                                           dir + "/refs.json");
  for (const sat::Scores& t : {lists, ids}) {
    CHECK(t.images == files.images);
    CHECK(t.bleu == files.bleu);
    CHECK(t.rouge_l == files.rouge_l);
    CHECK(t.cider_d == files.cider_d);
    CHECK(t.meteor == files.meteor);
  }
  CHECK(files.cider_d > 0);
  CHECK(error_of([] { sat::score({"a"}, {}); }).find("score:") == 0);
  CHECK(error_of([] { sat::score({"a"}, {{}}); }) == "score: references[0] holds no captions");
  CHECK(error_of([&] { sat::score_files({"zebra.jpg"}, {"a zebra"}, dir + "/refs.json"); }).find("zebra") !=
        std::string::npos);
  CHECK(error_of([&] { sat::score_files(dir + "/missing.json", dir + "/refs.json"); }).rfind(dir + "/missing.json:", 0) ==
        0);
}
