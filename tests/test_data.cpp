#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <unistd.h>

#include "datasets/coco.hpp"
#include "datasets/safetensors.hpp"
#include "datasets/synth.hpp"
#include "datasets/vocab.hpp"
#include "seq/search.hpp"
#include "train/grounding.hpp"
#include "train/metrics.hpp"
#include "tests/model_fixtures.hpp"
#include "train/model.hpp"
#include "train/model_surgery.hpp"
#include "train/recorded_paths.hpp"
#include "vision/image.hpp"
#include "tests/scratch.hpp"

using namespace sat;

namespace {
using test::error_of;
using test::TempDir;

}  // namespace

TEST_CASE("tokenizer and vocabulary") {
  CHECK(tokenize_caption("A man's dog, running!  Fast.") ==
        std::vector<std::string>{"a", "man's", "dog", "running", "fast"});
  CHECK(tokenize_caption(" ' , ").empty());
  Vocab v = Vocab::build({{"a", "dog"}, {"a", "cat"}, {"a", "dog"}}, 2);
  CHECK(v.size() == 6);  // 4 specials + a, dog
  CHECK(v.words[4] == "a");
  CHECK(v.id("cat") == Vocab::kUnk);
  CHECK(v.decode({Vocab::kStart, 4, 5, Vocab::kEnd, 4}) == std::vector<std::string>{"a", "dog"});
  CHECK_THROWS_AS(Vocab::from_words({"<pad>", "x"}, "f"), Error);
  CHECK_THROWS_AS(Vocab::from_words({"<pad>", "<start>", "<end>", "<unk>", "a", "a"}, "f"), Error);
}

TEST_CASE("COCO captions: loading, subsets and errors that name the file") {
  TempDir dir;
  std::string good = dir.write("good.json",
                           R"({"images": [{"id": 7, "file_name": "x.jpg"}, {"id": 9, "file_name": "y.jpg"}],
                               "annotations": [{"image_id": 7, "caption": "A Dog."}, {"image_id": 9, "caption": "a cat"},
                                               {"image_id": 7, "caption": "a dog running"}]})");
  CaptionSet set = load_coco_captions(good, dir.path);
  CHECK(set.images.size() == 2);
  CHECK(set.images[0].caption_indices.size() == 2);
  CHECK(set.captions[0].tokens == std::vector<std::string>{"a", "dog"});
  CaptionSet sub = set.subset({"y.jpg"}, "list");
  CHECK(sub.images.size() == 1);
  CHECK(sub.captions.size() == 1);
  CHECK(error_of([&] { set.subset({"y.jpg", "z.jpg"}, "split.txt"); }).find("split.txt: line 2") == 0);

  std::string bad = dir.write("bad.json", "{\"images\": [");
  CHECK(error_of([&] { load_coco_captions(bad, dir.path); }).find(bad + ": malformed JSON") == 0);
  std::string notcoco = dir.write("notcoco.json", "[1, 2]");
  CHECK(error_of([&] { load_coco_captions(notcoco, dir.path); }).find("not a COCO captions file") != std::string::npos);
  std::string dangling = dir.write("dangling.json", R"({"images": [], "annotations": [{"image_id": 1, "caption": "x"}]})");
  CHECK(error_of([&] { load_coco_captions(dangling, dir.path); }).find("annotations[0] names image_id 1") !=
        std::string::npos);
  std::string wrongtype = dir.write("wrongtype.json", R"({"images": [{"id": "a", "file_name": 3}], "annotations": []})");
  CHECK(error_of([&] { load_coco_captions(wrongtype, dir.path); }).find("images[0] is malformed") != std::string::npos);
  CHECK(error_of([&] { load_coco_captions(dir.file("missing.json"), dir.path); }).find("cannot open") !=
        std::string::npos);
}

TEST_CASE("caption texts without photos: COCO captions and coco-caption's reference files; errors name the file") {
  TempDir dir;
  using Texts = std::vector<std::vector<std::string>>;
  const std::string refs = dir.write("refs.json", R"({"11": [["A Dog runs.", "two cats"]], "12": [["a red bus", " "]]})");
  CHECK(load_caption_texts(refs) == Texts{{"a", "dog", "runs"}, {"two", "cats"}, {"a", "red", "bus"}});
  const std::string flat = dir.write("flat.json", R"({"5": ["a man on a horse"]})");
  CHECK(load_caption_texts(flat) == Texts{{"a", "man", "on", "a", "horse"}});
  const std::string coco = dir.write("coco.json", R"({"images": [{"id": 7, "file_name": "x.jpg"}],
                                                   "annotations": [{"image_id": 7, "caption": "A boat."}]})");
  CHECK(load_caption_texts(coco) == Texts{{"a", "boat"}});
  const std::string wrong = dir.write("wrong.json", R"({"1": [["a dog"]], "2": 7})");
  CHECK(error_of([&] { load_caption_texts(wrong); }) == wrong + ": \"2\" is not an array of captions");
  const std::string number = dir.write("number.json", R"({"1": [["a dog", 3]]})");
  CHECK(error_of([&] { load_caption_texts(number); }) == number + ": \"1\" holds a caption that is not a string");
  const std::string empty = dir.write("empty.json", R"({"1": [[" ", "."]]})");
  CHECK(error_of([&] { load_caption_texts(empty); }) == empty + ": holds no captions");
  const std::string broken = dir.write("broken.json", R"({"1": [["a dog")");
  CHECK(error_of([&] { load_caption_texts(broken); }).find(broken + ": malformed JSON") == 0);
  CHECK(error_of([&] { load_caption_texts(dir.file("missing.json")); }).find("cannot open") != std::string::npos);
}

TEST_CASE("synthetic scenes: deterministic, grounded, objects apart") {
  for (int i = 0; i < 40; ++i) {
    SynthScene a = make_synth_scene(5, i, 128), b = make_synth_scene(5, i, 128);
    REQUIRE(a.bgr == b.bgr);
    REQUIRE(a.captions.size() == 5);
    REQUIRE(!a.objects.empty());
    REQUIRE(a.objects.size() <= 3);
    for (size_t k = 0; k + 1 < a.objects.size(); ++k) {
      auto& p = a.objects[k];
      auto& q = a.objects[k + 1];
      CHECK(p.x + p.w / 2 < q.x + q.w / 2);  // left to right
      bool apart = p.x + p.w <= q.x || q.x + q.w <= p.x || p.y + p.h <= q.y || q.y + q.h <= p.y;
      CHECK(apart);
    }
    for (auto& c : a.captions) {
      // every object is named by exactly its size, colour and shape words
      std::vector<int> per_object(a.objects.size(), 0);
      for (auto& [tok, obj] : c.grounding) {
        const ObjectBox& o = a.objects[obj];
        const std::string& w = c.tokens[tok];
        CHECK((w == o.size || w == o.colour || w == o.shape));
        per_object[obj]++;
      }
      for (int n : per_object) CHECK(n == 3);
    }
  }
  CHECK(make_synth_scene(5, 0, 128).bgr != make_synth_scene(6, 0, 128).bgr);
}

TEST_CASE("model files: save -> load -> caption gives the same words; damaged files are errors") {
  TempDir dir;
  CaptionModel m;
  build_tiny_model(m);
  Rng rng(4);
  m.init(rng);
  std::vector<float> planes(2 * 3 * 32 * 32);
  for (auto& v : planes) v = (float)rng.normal();
  {  // move the BN running statistics away from their defaults, so the round trip covers them
    std::vector<float> grid;
    m.cnn->forward(planes.data(), 2, true, grid);
  }
  Mat F = m.encode(planes, 2);
  m.length_norm = 0.25;
  auto before = m.search_kept(F, 2, stored_search(m, 3));
  std::string path = dir.file("m.sat");
  m.save(path);
  auto loaded = CaptionModel::load(path);
  Mat F2 = loaded->encode(planes, 2);
  CHECK((F - F2).cwiseAbs().maxCoeff() == 0.f);
  CHECK(loaded->length_norm == 0.25);
  auto after = loaded->search_kept(F2, 2, stored_search(*loaded, 3));
  for (int i = 0; i < 2; ++i) CHECK(before[i].tokens == after[i].tokens);
  CHECK(loaded->vocab.words == m.vocab.words);

  std::string bytes = read_file(path);
  for (size_t cut : {size_t(0), size_t(4), size_t(20), bytes.size() / 2, bytes.size() - 1}) {
    write_file_atomic(dir.file("cut.sat"), bytes.substr(0, cut));
    CHECK(error_of([&] { CaptionModel::load(dir.file("cut.sat")); }).find(dir.file("cut.sat") + ": ") == 0);
  }
  std::string flipped = bytes;
  flipped[8] = '#';  // break the JSON header
  write_file_atomic(dir.file("flip.sat"), flipped);
  CHECK(error_of([&] { CaptionModel::load(dir.file("flip.sat")); }).find("not a sat model file") != std::string::npos);
  TensorFile tf = load_safetensors(path);
  tf.tensors.erase("lstm.bias");
  save_safetensors(dir.file("missing.sat"), tf);
  CHECK(error_of([&] { CaptionModel::load(dir.file("missing.sat")); }).find("missing tensor 'lstm.bias'") !=
        std::string::npos);
  tf = load_safetensors(path);
  tf.metadata["decoder"] = "{\"vocab_size\": 3}";
  save_safetensors(dir.file("badcfg.sat"), tf);
  CHECK(error_of([&] { CaptionModel::load(dir.file("badcfg.sat")); }).find("decoder config is malformed") !=
        std::string::npos);
}

TEST_CASE("float16: IEEE binary16 rounding, subnormals, range") {
  CHECK(float_to_half(1.f) == 0x3c00);
  CHECK(float_to_half(-2.f) == 0xc000);
  CHECK(float_to_half(0.1f) == 0x2e66);
  CHECK(float_to_half(65504.f) == 0x7bff);
  CHECK(float_to_half(65519.f) == 0x7bff);               // below the halfway point to 65536
  CHECK(float_to_half(65520.f) == 0x7c00);               // halfway, ties to even: infinity
  CHECK(float_to_half(1.f + 1.f / 2048) == 0x3c00);      // halfway between 1 and 1 + 2^-10: to even
  CHECK(float_to_half(1.f + 3.f / 2048) == 0x3c02);      // halfway between odd and even: up
  CHECK(float_to_half(std::ldexp(1.f, -24)) == 0x0001);  // smallest subnormal
  CHECK(float_to_half(std::ldexp(1.f, -25)) == 0x0000);  // half of it: ties to even (zero)
  CHECK(float_to_half(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);  // rounds up into the smallest normal
  CHECK(float_to_half(-0.f) == 0x8000);
  CHECK(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  // Every finite half survives float and back, and every float rounds to a neighbouring half.
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    mismatches += float_to_half(half_to_float((uint16_t)h)) != h;
  }
  CHECK(mismatches == 0);
  Rng rng(3);
  for (int i = 0; i < 10000; ++i) {
    float x = (float)(rng.normal() * std::pow(10.0, rng.uniform() * 8 - 6));
    float y = half_to_float(float_to_half(x));
    CHECK(std::abs(y - x) <= std::max(std::abs(x) * (1.f / 2048), std::ldexp(1.f, -25)));
  }
}

TEST_CASE("model files: float16 decoder storage (sat model compact)") {
  TempDir dir;
  CaptionModel m;
  build_tiny_model(m);
  Rng rng(5);
  m.init(rng);
  m.save(dir.file("full.sat"));
  m.half_precision = true;
  m.save(dir.file("half.sat"));
  auto half = CaptionModel::load(dir.file("half.sat"));
  CHECK(half->half_precision);
  CHECK_FALSE(CaptionModel::load(dir.file("full.sat"))->half_precision);
  int64_t decoder_values = 0;
  auto src = m.params();
  auto dst = half->params();
  REQUIRE(src.size() == dst.size());
  for (size_t k = 0; k < src.size(); ++k) {
    bool in_decoder = src[k]->name.rfind("enc", 0) != 0;
    for (int64_t i = 0; i < src[k]->size(); ++i) {
      float expect = in_decoder ? half_to_float(float_to_half(src[k]->value[i])) : src[k]->value[i];
      if (dst[k]->value[i] != expect) FAIL_CHECK(src[k]->name << "[" << i << "]");
    }
    if (in_decoder) decoder_values += src[k]->size();
  }
  CHECK(decoder_values > 0);
  // the decoder's bytes halve; everything else is unchanged
  CHECK(read_file(dir.file("full.sat")).size() - read_file(dir.file("half.sat")).size() ==
        doctest::Approx(decoder_values * 2).epsilon(0.01));
  // a value float16 cannot hold is refused with the tensor's name
  m.decoder->params()[0]->value[0] = 1e6f;
  CHECK(error_of([&] { m.save(dir.file("big.sat")); }).find("outside the float16 range") != std::string::npos);
}

TEST_CASE("model files: averaging weights (sat model average); models that differ otherwise are refused") {
  TempDir dir;
  CaptionModel a, b;
  build_tiny_model(a);
  build_tiny_model(b);
  Rng rng_a(5), rng_b(6);
  a.init(rng_a);
  b.init(rng_b);
  a.save(dir.file("a.sat"));
  b.save(dir.file("b.sat"));
  auto avg = average_models({dir.file("a.sat"), dir.file("b.sat"), dir.file("b.sat")});
  auto pa = a.params(), pb = b.params(), pm = avg->params();
  REQUIRE(pm.size() == pa.size());
  int64_t checked = 0;
  for (size_t k = 0; k < pm.size(); ++k)
    for (int64_t i = 0; i < pm[k]->size(); ++i, ++checked)
      if (std::abs(pm[k]->value[i] - (pa[k]->value[i] + 2 * pb[k]->value[i]) / 3) > 1e-6f)
        FAIL_CHECK(pm[k]->name << "[" << i << "]");
  CHECK(checked > 1000);
  // the same model averaged with itself captions as it does
  Mat F = Mat::Random(a.encoder_config.locations(), a.encoder_config.feature_dim());
  auto same = average_models({dir.file("a.sat"), dir.file("a.sat")});
  CHECK(same->search_kept(F, 1, stored_search(*same, 2))[0].tokens ==
        a.search_kept(F, 1, stored_search(a, 2))[0].tokens);
  // weights every model holds alike come back exactly (a frozen fine-tuned unit stays shared with the others)
  auto thrice = average_models({dir.file("a.sat"), dir.file("a.sat"), dir.file("a.sat")});
  auto pt = thrice->params();
  for (size_t k = 0; k < pt.size(); ++k)
    if (pt[k]->value != pa[k]->value) FAIL_CHECK(pt[k]->name << " changed by averaging three copies");

  CaptionModel other;
  build_tiny_model(other);
  other.vocab = Vocab::build({{"a", "green", "star"}, {"a", "blue", "square"}}, 1);
  other.build();
  Rng rng_o(7);
  other.init(rng_o);
  other.save(dir.file("other.sat"));
  CHECK(error_of([&] {
          average_models({dir.file("a.sat"), dir.file("other.sat")});
        }) == dir.file("other.sat") + ": the vocabulary differs from " + dir.file("a.sat") +
                  "'s: only models that differ in their weights average");
  other.decoder_config.hidden_dim = 10;
  other.vocab = a.vocab;
  other.build();
  other.init(rng_o);
  other.save(dir.file("wider.sat"));
  CHECK(error_of([&] {
          average_models({dir.file("a.sat"), dir.file("wider.sat")});
        }).find("the decoder differs") != std::string::npos);
}

TEST_CASE("model files: ensembles (sat model ensemble) save, load and search as built; other encoders are refused") {
  TempDir dir;
  CaptionModel a, b;
  build_tiny_model(a);
  b.encoder_config = a.encoder_config;
  b.vocab = a.vocab;
  b.decoder_config = a.decoder_config;
  b.decoder_config.hidden_dim = 10;  // members may differ in size
  b.max_len = a.max_len;
  b.build();
  Rng rng_a(5), rng_b(6);
  a.init(rng_a);
  b.decoder->init(rng_b);
  auto &pa = a.cnn->params(), &pb = b.cnn->params();  // the same encoder: b's decoder was trained over a's
  for (size_t k = 0; k < pa.size(); ++k) pb[k].value = pa[k].value;
  a.save(dir.file("a.sat"));
  b.save(dir.file("b.sat"));
  auto ens = ensemble_models({dir.file("a.sat"), dir.file("b.sat")});
  CHECK(ens->members() == 2);
  ens->half_precision = true;
  ens->save(dir.file("ens.sat"));
  auto loaded = CaptionModel::load(dir.file("ens.sat"));
  REQUIRE(loaded->members() == 2);
  CHECK(loaded->more_members[0]->config().hidden_dim == 10);
  auto src = b.decoder->params(), dst = loaded->more_members[0]->params();
  REQUIRE(src.size() == dst.size());
  for (size_t k = 0; k < src.size(); ++k)  // stored as float16 like the first member
    for (int64_t i = 0; i < src[k]->size(); ++i)
      if (dst[k]->value[i] != half_to_float(float_to_half(src[k]->value[i])))
        FAIL_CHECK(src[k]->name << "[" << i << "]");
  // the file's ensemble searches as the members' mean distribution
  const int n = 4;
  Mat F = Mat::Random((int64_t)n * a.encoder_config.locations(), a.encoder_config.feature_dim());
  std::vector<Decoder*> members = loaded->member_decoders();
  DecoderEnsemble by_hand(members);
  auto expect = beam_search(by_hand, F, n, 3, loaded->max_len, loaded->length_norm, loaded->no_repeat_ngram);
  auto got = loaded->search_kept(F, n, stored_search(*loaded, 3));
  for (int i = 0; i < n; ++i) CHECK(got[i].tokens == expect[i].tokens);
  // an ensemble of ensembles brings every member; it is not trained or averaged
  CHECK(ensemble_models({dir.file("ens.sat"), dir.file("a.sat")})->members() == 3);
  CHECK(error_of([&] {
          average_models({dir.file("ens.sat"), dir.file("a.sat")});
        }) == dir.file("ens.sat") + ": is an ensemble: average its members' own files");
  // another encoder (a CNN trained with its own decoder) or vocabulary cannot be shared
  CaptionModel c;
  build_tiny_model(c);
  Rng rng_c(7);
  c.init(rng_c);
  c.save(dir.file("c.sat"));
  CHECK(error_of([&] {
          ensemble_models({dir.file("a.sat"), dir.file("c.sat")});
        }).rfind(dir.file("c.sat") + ": the encoder's weights differ from " + dir.file("a.sat") + "'s", 0) == 0);
  c.vocab = Vocab::build({{"a", "green", "star"}, {"a", "blue", "square"}}, 1);
  c.save(dir.file("words.sat"));
  CHECK(error_of([&] {
          ensemble_models({dir.file("a.sat"), dir.file("words.sat")});
        }).rfind(dir.file("words.sat") + ": the vocabulary differs", 0) == 0);
  CHECK(error_of([&] { ensemble_models({dir.file("a.sat")}); }) == "model ensemble: give at least two model files");
  // a decoder that cannot be averaged names its file, inside an ensemble file too
  for (const char* kind : {"hard", "none"}) {
    CaptionModel d;
    d.encoder_config = a.encoder_config;
    d.vocab = a.vocab;
    d.decoder_config = a.decoder_config;
    d.decoder_config.attention = kind;
    d.max_len = a.max_len;
    d.build();
    Rng rng_d(8);
    d.decoder->init(rng_d);
    auto& pd = d.cnn->params();
    for (size_t k = 0; k < pa.size(); ++k) pd[k].value = pa[k].value;
    const std::string file = dir.file(std::string(kind) + ".sat");
    d.save(file);
    const std::string expected = std::string(kind) == "hard"
                                     ? file + ": uses hard attention, which an ensemble cannot average"
                                     : file + ": does not attend and " + dir.file("ens.sat") + " does";
    CHECK(error_of([&] { ensemble_models({dir.file("ens.sat"), file}); }).rfind(expected, 0) == 0);
    if (std::string(kind) == "hard")  // first, or after an ensemble's two members
      CHECK(error_of([&] { ensemble_models({file, dir.file("a.sat")}); }).rfind(expected, 0) == 0);
  }
  // a damaged ensemble header names the file
  TensorFile tf = load_safetensors(dir.file("ens.sat"));
  tf.metadata["ensemble"] = "{}";
  save_safetensors(dir.file("bad.sat"), tf);
  CHECK(error_of([&] { CaptionModel::load(dir.file("bad.sat")); }) ==
        dir.file("bad.sat") + ": model header is malformed (\"ensemble\" must list the decoders after the first)");
}

TEST_CASE("JSON from files: a float that no integer or float can hold is an error, not a conversion") {
  // nlohmann's get<int64_t>() on 1.4e29 is undefined behaviour (found by tests/fuzz/fuzz_model, kept in its corpus)
  std::string header = R"({"a": {"dtype": "F32", "shape": [1.4e29], "data_offsets": [0, 4]}})";
  while (header.size() % 8) header += ' ';
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = (char)((header.size() >> (8 * i)) & 0xff);
  file += header + std::string(4, '\0');
  CHECK_THROWS_WITH_AS(decode_safetensors(file, "m.sat"),
                       doctest::Contains("m.sat: number out of range in JSON (at \"shape\")"), Error);
  const std::string path = "/tmp/sat_test_json_range_" + std::to_string(getpid()) + ".json";
  write_file_atomic(path, R"({"images": [{"id": 1e300, "file_name": "a.jpg"}], "annotations": []})");
  CHECK_THROWS_WITH_AS(load_coco_captions(path, "."), doctest::Contains("number out of range in JSON (at \"id\")"),
                       Error);
  write_file_atomic(
      path, R"({"images": [{"id": 2.0, "file_name": "a.jpg"}], "annotations": [{"image_id": 2, "caption": "a dog"}]})");
  CHECK(load_coco_captions(path, ".").images.size() == 1);  // in range: read as before
  std::remove(path.c_str());
}

TEST_CASE("atomic writes replace whole files and leave no temp files") {
  TempDir dir;
  std::string p = dir.file("f.txt");
  write_file_atomic(p, "first");
  write_file_atomic(p, "second");
  CHECK(read_file(p) == "second");
  CHECK(system(("test $(ls '" + dir.path + "' | wc -l) -eq 1").c_str()) == 0);
  CHECK_THROWS_AS(write_file_atomic(dir.file("no/such/dir/f.txt"), "x"), Error);
}

TEST_CASE("BLEU: coco-caption definition on hand-made vectors") {
  // Identical hypothesis and reference: 1.
  auto r = corpus_bleu({{"a", "b", "c", "d"}}, {{{"a", "b", "c", "d"}}});
  for (double b : r.bleu) CHECK(b == doctest::Approx(1.0));
  // No matches at all: the tiny constants keep it finite and ~0.
  r = corpus_bleu({{"x", "y", "z", "w"}}, {{{"a", "b", "c", "d"}}});
  CHECK(r.bleu[0] < 1e-9);
  // One hypothesis, two references: clipping by the max count in any reference; closest length, ties shorter.
  r = corpus_bleu({{"the", "the", "the", "cat"}}, {{{"the", "cat", "sat"}, {"the", "the", "dog", "is", "here"}}});
  CHECK(r.correct[0] == 3);  // "the" clipped to 2, "cat" 1
  CHECK(r.reflen == 3);      // |4-3| = |4-5|: the shorter wins
  CHECK(r.bleu[0] == doctest::Approx(3.0 / 4.0).epsilon(1e-9));
  // Empty hypothesis: zero, no crash.
  r = corpus_bleu({{}}, {{{"a", "b"}}});
  CHECK(r.bleu[3] < 1e-9);
  // Brevity penalty once at corpus level.
  r = corpus_bleu({{"a", "b"}, {"c", "d", "e", "f"}}, {{{"a", "b", "x"}}, {{"c", "d", "e", "f"}}});
  CHECK(r.testlen == 6);
  CHECK(r.reflen == 7);
  CHECK(r.bleu[0] == doctest::Approx(std::exp(1 - 7.0 / 6.0)).epsilon(1e-6));
}

TEST_CASE("grounding: cell to box overlap") {
  ObjectBox box;
  box.x = 40, box.y = 0, box.w = 20, box.h = 10;       // in a 128x128 image, 8x8 grid of 16-pixel cells
  CHECK(cell_overlaps_box(2, 8, 8, 128, 128, box));    // row 0, col 2: x 32..48
  CHECK(cell_overlaps_box(3, 8, 8, 128, 128, box));    // col 3: x 48..64
  CHECK(!cell_overlaps_box(4, 8, 8, 128, 128, box));   // col 4: x 64..80
  CHECK(!cell_overlaps_box(10, 8, 8, 128, 128, box));  // row 1
}

TEST_CASE("model files: recorded paths rebased from the folder a run started in (sat model rebase)") {
  // what exists under runs/x: the run's own files, the shared data three levels up
  const std::set<std::string> present = {"runs/x/stage.sat",
                                         "runs/x/member2",
                                         "runs/x/cache.feat",
                                         "runs/x/../../../shared/data",
                                         "runs/x/../../../shared/data/dev.txt",
                                         "runs/x/sat"};
  auto exists = [&](const std::string& p) { return present.count(p) > 0; };
  nlohmann::json info = {
      {"command",
       "sat train --data ../../../shared/data --val-split ../../../shared/data/dev.txt --out member2 "
       "--features cache.feat --init-from stage.sat --keep-epochs true --lr 1e-4"},
      {"started_from", "stage.sat: command sat train --data ../shared/data --out runs/y/model; recipe (runs/x)"},
      {"members", {{{"file", "runs/x/stage.sat"}, {"command", "sat model average stage.sat, /abs/stage.sat"}}}},
      {"data", "../../../shared/data"},
      {"git_commit", "stage.sat"},
      {"scores", {{"Bleu_4", 0.2}}},
      {"epoch", 4}};
  std::vector<std::pair<std::string, std::string>> rewrites;
  nlohmann::json out = rebase_recorded_paths(info, "runs/x", exists, &rewrites);
  CHECK(out["command"] ==
        "sat train --data ../shared/data --val-split ../shared/data/dev.txt --out runs/x/member2 "
        "--features runs/x/cache.feat --init-from runs/x/stage.sat --keep-epochs true --lr 1e-4");
  // the start model's own record (run from here) names nothing under runs/x and stays; its leading name moves
  CHECK(out["started_from"] ==
        "runs/x/stage.sat: command sat train --data ../shared/data --out runs/y/model; recipe (runs/x)");
  CHECK(out["members"][0]["file"] == "runs/x/stage.sat");  // already from here: runs/x/runs/x/stage.sat is nothing
  CHECK(out["members"][0]["command"] == "sat model average runs/x/stage.sat, /abs/stage.sat");  // absolute stays
  CHECK(out["data"] == "../shared/data");
  CHECK(out["git_commit"] == "stage.sat");  // never a path
  CHECK(out["scores"] == info["scores"]);
  CHECK(out["epoch"] == 4);
  REQUIRE(rewrites.size() == 5);
  CHECK(rewrites[0] == std::make_pair(std::string("../../../shared/data"), std::string("../shared/data")));
  CHECK(rewrites[2] == std::make_pair(std::string("member2"), std::string("runs/x/member2")));
  // "sat" (a word without '/' or '.', not an option's value) is left alone although runs/x/sat exists
  CHECK(out["command"].get<std::string>().rfind("sat train", 0) == 0);
  // nothing under the folder: the record is unchanged
  CHECK(rebase_recorded_paths(info, "elsewhere", exists) == info);
  // absolute paths inside the current folder become relative to it (those outside stay)
  nlohmann::json absolute = {
      {"command", "sat train --data /repo/../shared/data --out /repo/runs/m --init-from /other/m.sat"}};
  rewrites.clear();
  CHECK(rebase_recorded_paths(absolute, "elsewhere", exists, &rewrites, "/repo")["command"] ==
        "sat train --data ../shared/data --out runs/m --init-from /other/m.sat");
  CHECK(rewrites.size() == 2);
  CHECK(rebase_recorded_paths(absolute, "elsewhere", exists, nullptr, "/rep")["command"] == absolute["command"]);
}
