// The neighbours' words as the decoder's input (train/neighbour_words.hpp): the shares counted by hand, the words
// chosen, the nearest photos with a training photo's own left out, the joined grid, the widened decoder that computes
// what it did, and a model that reads them through its search and its file.
#include <doctest/doctest.h>

#include <cmath>

#include "datasets/safetensors.hpp"
#include "seq/search.hpp"
#include "tests/decoder_fixtures.hpp"
#include "tests/model_fixtures.hpp"
#include "tests/scratch.hpp"
#include "train/model_surgery.hpp"
#include "train/neighbour_words.hpp"

using namespace sat;
using test::error_of;
using test::random_features;
using test::small_config;
using test::TempDir;

namespace {

// Photos' captions as a memory holds them, with random unit keys of dimension D.
CaptionMemory memory_of(const std::vector<std::vector<std::string>>& captions, int D, Rng& rng) {
  CaptionMemory m;
  m.keys.resize((int64_t)captions.size(), D);
  for (int64_t i = 0; i < m.keys.rows(); ++i) {
    for (int d = 0; d < D; ++d) m.keys(i, d) = (float)rng.normal();
    m.keys.row(i).normalize();
  }
  m.captions = captions;
  return m;
}

}  // namespace

TEST_CASE("neighbour words: each word's share of the photos' captions, a caption counting a word once") {
  Rng rng(1);
  const CaptionMemory memory =
      memory_of({{"a dog runs", "a dog and a dog"}, {"a red car", "the car is red"}, {"a cat"}}, 3, rng);
  const std::vector<std::string> words = {"dog", "red", "a", "bird"};
  std::vector<float> out(4, -1.f);
  neighbour_word_shares(memory, {0, 1}, words, 1.f, out.data());
  // four captions: "dog" in 2, "red" in 2, "a" in 3 (twice in one: once), "bird" in none
  CHECK(out == std::vector<float>{0.5f, 0.5f, 0.75f, 0.f});
  neighbour_word_shares(memory, {2}, words, 4.f, out.data());
  CHECK(out == std::vector<float>{0.f, 0.f, 4.f, 0.f});
  neighbour_word_shares(memory, {0, 0}, words, 2.f, out.data());  // a photo counted twice weighs twice alike
  CHECK(out == std::vector<float>{2.f, 0.f, 2.f, 0.f});
  neighbour_word_shares(memory, {}, words, 1.f, out.data());  // no photos: zeros
  CHECK(out == std::vector<float>{0.f, 0.f, 0.f, 0.f});
}

TEST_CASE("neighbour words: the words most said in the memory's captions, of the vocabulary only") {
  Rng rng(2);
  const CaptionMemory memory =
      memory_of({{"a dog runs", "a dog sits"}, {"a red car", "the red car"}, {"a zebra"}}, 3, rng);
  const Vocab vocab = Vocab::build({{"the", "red", "car", "dog", "a", "runs", "sits", "cat"}}, 1);
  // said by: a 4 captions, dog 2, red 2, car 2, the 1, runs 1, sits 1; "zebra" is not in the vocabulary, "cat" unsaid
  const std::vector<std::string> top = most_said_words(memory, vocab, 4);
  REQUIRE(top.size() == 4);
  CHECK(top[0] == "a");
  // ties in the vocabulary's order
  std::vector<std::string> tied(top.begin() + 1, top.end());
  std::vector<std::string> expected;
  for (const std::string& w : vocab.words)
    if (w == "dog" || w == "red" || w == "car") expected.push_back(w);
  CHECK(tied == expected);
  CHECK(most_said_words(memory, vocab, 100).size() == 7);  // fewer when fewer are said
  CHECK(most_said_words(memory, vocab, 0).empty());
}

TEST_CASE("neighbour words: the nearest photos leave the photo's own out, and join every location of its grid") {
  Rng rng(3);
  const int D = 5, photos = 12, n = 3, L = 4;
  std::vector<std::vector<std::string>> captions;
  for (int i = 0; i < photos; ++i)
    captions.push_back({"photo" + std::to_string(i) + " a", "b" + std::to_string(i % 3)});
  const CaptionMemory memory = memory_of(captions, D, rng);
  // Grids whose mean is memory photo 2's, 7's and 5's key: each one's nearest photo is that one.
  Mat F(n * L, D);
  const int own[] = {2, 7, 5};
  for (int i = 0; i < n; ++i)
    for (int l = 0; l < L; ++l) F.row(i * L + l) = memory.keys.row(own[i]) * (0.5f + l * 0.25f);
  const auto with_own = neighbour_photos(memory, F, n, 4);
  const auto left_out = neighbour_photos(memory, F, n, 4, {2, -1, 5});
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    REQUIRE(with_own[i].size() == 4);
    CHECK(with_own[i][0] == own[i]);
    CHECK(with_own[i] == memory.nearest(memory.keys.row(own[i]).data(), 4));
    REQUIRE(left_out[i].size() == 4);
    if (i == 1) {
      CHECK(left_out[i] == with_own[i]);
    } else {  // the own photo out, the next nearest in
      const std::vector<int> five = memory.nearest(memory.keys.row(own[i]).data(), 5);
      CHECK(left_out[i] == std::vector<int>(five.begin() + 1, five.end()));
    }
  }
  CHECK(error_of([&] { neighbour_photos(memory, F, n, 4, {1}); }).find("1 photos to leave out for 3 images") !=
        std::string::npos);

  NeighbourWords nw;
  nw.words = {"a", "b0", "b1", "b2", "photo2"};
  nw.neighbours = 3;
  nw.scale = 2;
  const Mat G = join_neighbour_words(F, n, memory, nw, {2, -1, 5});
  REQUIRE(G.rows() == F.rows());
  REQUIRE(G.cols() == D + 5);
  CHECK(G.leftCols(D) == F);
  const auto near3 = neighbour_photos(memory, F, n, 3, {2, -1, 5});
  for (int i = 0; i < n; ++i) {
    std::vector<float> shares(5);
    neighbour_word_shares(memory, near3[i], nw.words, 2.f, shares.data());
    CHECK(shares[0] == 1.f);  // "a" in one caption of each photo's two: 1/2, times 2
    for (int l = 0; l < L; ++l)
      for (int k = 0; k < 5; ++k) CHECK(G(i * L + l, D + k) == shares[k]);
  }
  CHECK(G(0, D + 4) == 0.f);  // grid 0's own photo 2 was left out: nothing else says "photo2"
  // kept: 1 caption of its 3 nearest photos' 6, times 2
  CHECK(join_neighbour_words(F, n, memory, nw)(0, D + 4) == doctest::Approx(2.0 / 6));
  CHECK(error_of([&] { join_neighbour_words(F.topRows(5), 2, memory, nw); }).find("5 rows for 2 images") !=
        std::string::npos);
}

TEST_CASE("neighbour words: a training photo's own memory photo is found by its captions") {
  Rng rng(4);
  CaptionMemory memory = memory_of({}, 2, rng);
  memory.keys.resize(3, 2);
  memory.captions = {{memory_caption("A dog runs."), memory_caption("A dog, running.")},
                     {memory_caption("Two cats")},
                     {memory_caption("A dog runs."), memory_caption("A dog is running")}};
  const std::vector<int> found =
      own_memory_photos(memory, {{"Two cats"}, {"A dog runs.", "A dog is running!"}, {"A dog runs."}, {}});
  CHECK(found == std::vector<int>{1, 2, -1, -1});  // the raw captions tokenized as the memory keeps them
}

TEST_CASE("neighbour words: the widened decoder computes exactly what it did, whatever the new inputs hold") {
  for (const char* order : {"bahdanau", "luong", "updown"}) {
    CAPTURE(order);
    Rng rng(5);
    DecoderConfig cfg = small_config(0);
    cfg.order = order;
    Decoder dec(cfg);
    dec.init(rng);
    const int n = 3, extra = 4;
    const Mat F = random_features(n, cfg, rng);
    Mat G(F.rows(), F.cols() + extra);
    G.leftCols(F.cols()) = F;
    for (int64_t i = 0; i < G.rows(); ++i)
      for (int k = 0; k < extra; ++k) G(i, F.cols() + k) = (float)rng.normal() * 3;
    const std::unique_ptr<Decoder> wide = widened_decoder(dec, extra);
    CHECK(wide->config().feature_dim == cfg.feature_dim + extra);
    const auto a = beam_search_nbest(dec, F, n, 3, 6, 0.5, 0);
    const auto b = beam_search_nbest(*wide, G, n, 3, 6, 0.5, 0);
    REQUIRE(a.size() == b.size());
    for (int i = 0; i < n; ++i) {
      REQUIRE(a[i].size() == b[i].size());
      for (size_t k = 0; k < a[i].size(); ++k) {
        CHECK(a[i][k].tokens == b[i][k].tokens);
        CHECK(a[i][k].logprob == doctest::Approx(b[i][k].logprob).epsilon(1e-6));
      }
    }
    // the new rows are zeros and the old ones from's, row by row
    std::vector<Param*> was = dec.params(), now = wide->params();
    int widened = 0;
    for (size_t k = 0; k < was.size(); ++k) {
      if (was[k]->shape == now[k]->shape) {
        CHECK(was[k]->value == now[k]->value);
        continue;
      }
      ++widened;
      const int64_t cols = was[k]->shape[1];
      for (int64_t j = 0; j < was[k]->size(); ++j) CHECK(now[k]->value[j] == was[k]->value[j]);
      for (int64_t j = was[k]->size(); j < now[k]->size(); ++j) CHECK(now[k]->value[j] == 0.f);
      CHECK(now[k]->shape[0] * cols == now[k]->size());
    }
    CHECK(widened >= 3);  // the initial state's, the attention's and the context's weights at least
  }
}

TEST_CASE("neighbour words: a model reads them in its search and its file, and refuses them without a memory") {
  TempDir dir;
  CaptionModel m;
  build_tiny_model(m, {{"a", "red", "circle"}, {"a", "blue", "square"}, {"the", "green", "triangle"}});
  Rng rng(6);
  const int D = m.encoder_config.feature_dim(), n = 4;
  auto memory = std::make_shared<CaptionMemory>(memory_of({{"a red circle", "a red square"},
                                                           {"the green triangle"},
                                                           {"a blue square", "a blue circle"},
                                                           {"a circle"},
                                                           {"the red triangle"}},
                                                          D, rng));
  memory->prepare(D, "mem");
  m.memory = memory;
  m.consensus = {3, 0.0};
  m.neighbour_words.words = {"red", "blue", "green", "circle"};
  m.neighbour_words.neighbours = 2;
  m.build();  // the decoder reads D + 4 features
  m.init(rng);
  CHECK(m.decoder_config.feature_dim == D + 4);
  const std::vector<float> planes = random_tiny_photos(rng, n);
  const Mat F = m.encode(planes, n);
  const Mat G = m.decoder_grid(F, n);
  CHECK(G == join_neighbour_words(F, n, *memory, m.neighbour_words));
  const auto kept = m.search_kept(F, n, search_with(m, 3, 0.5, 0));
  const auto direct = beam_search(*m.decoder, G, n, 3, m.max_len, 0.5, 0);
  const auto greedy = m.search_kept(F, n, search_with(m, 1, 0.5, 0));
  const auto greedy_direct = greedy_search(*m.decoder, G, n, m.max_len, 0);
  for (int i = 0; i < n; ++i) {
    CHECK(kept[i].tokens == direct[i].tokens);
    CHECK(greedy[i].tokens == greedy_direct[i].tokens);
  }
  // reranked: the memory's keys come from the encoder's grid, the decoder's candidates from the joined one
  const auto reranked = m.search(F, n, search_with(m, 3, 0.5, 0, 20.0, {}, {}, kMaxBeam));
  const auto found = beam_search_nbest(*m.decoder, G, n, 3, m.max_len, 0.5, 0);
  for (int i = 0; i < n; ++i) {
    REQUIRE(reranked[i].candidates.size() == found[i].size());
    for (size_t k = 0; k < found[i].size(); ++k)
      CHECK(reranked[i].candidates[k].hypothesis.tokens == found[i][k].tokens);
  }

  const std::string path = dir.file("nw.sat");
  m.save(path);
  auto loaded = CaptionModel::load(path);
  CHECK(loaded->neighbour_words.words == m.neighbour_words.words);
  CHECK(loaded->neighbour_words.neighbours == 2);
  CHECK(loaded->neighbour_words.scale == 40.f);
  CHECK(loaded->decoder_config.feature_dim == D + 4);
  const auto again = loaded->search_kept(loaded->encode(planes, n), n, search_with(*loaded, 3, 0.5, 0));
  for (int i = 0; i < n; ++i) CHECK(again[i].tokens == kept[i].tokens);

  auto damaged = [&](const std::string& name, const std::function<void(TensorFile&)>& change) {
    return load_error_of_changed(path, dir.file(name), change);
  };
  const std::string no_memory = damaged("n1.sat", [](TensorFile& tf) {
    tf.tensors.erase(kMemoryKeys);
    tf.half.erase(kMemoryKeys);
    tf.metadata.erase("memory_captions");
    tf.metadata.erase("consensus");
  });
  CHECK(no_memory.find(dir.file("n1.sat") + ": ") == 0);
  CHECK(no_memory.find("nearest memory photos, and its caption memory holds 0") != std::string::npos);
  CHECK(damaged("n2.sat", [](TensorFile& tf) {
          tf.metadata["neighbour_words"] = R"({"words": ["red"], "neighbours": 9, "scale": 4})";
        }).find("its caption memory holds 5") != std::string::npos);
  CHECK(damaged("n3.sat", [](TensorFile& tf) {
          tf.metadata["neighbour_words"] = R"({"words": ["red", "red"], "neighbours": 2, "scale": 4})";
        }).find("neighbour word 'red' is empty, holds a space or comes twice") != std::string::npos);
  CHECK(damaged("n4.sat", [](TensorFile& tf) {
          tf.metadata["neighbour_words"] = R"({"words": [], "neighbours": 2, "scale": 4})";
        }).find("reads 0 neighbour words") != std::string::npos);
  CHECK(damaged("n5.sat", [](TensorFile& tf) {
          tf.metadata["neighbour_words"] = R"({"words": ["red"], "neighbours": 2, "scale": -1})";
        }).find("scale must be in (0, 100]") != std::string::npos);
  CHECK(damaged("n6.sat", [](TensorFile& tf) {
          tf.metadata["neighbour_words"] = R"({"words": 3})";
        }).find("its neighbour words are malformed") != std::string::npos);
  // a decoder that reads 4 words, the header saying 3: the weights do not fit
  CHECK(damaged("n7.sat", [](TensorFile& tf) {
          tf.metadata["neighbour_words"] = R"({"words": ["red", "blue", "green"], "neighbours": 2, "scale": 4})";
        }).find(dir.file("n7.sat")) == 0);

  m.memory.reset();
  CHECK(error_of([&] { m.decoder_grid(F, n); }) == "the model reads its neighbours' words but holds no caption memory");
}
