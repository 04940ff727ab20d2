// Small decoders for the decoder, search and ensemble tests: a config over a 2x3 grid of 4 features and an
// 11-word vocabulary, and random grids for it.
#pragma once
#include <string>

#include "seq/decoder.hpp"

namespace sat::test {

inline DecoderConfig small_config(float dropout, bool coverage = false, const std::string& score = "additive",
                                  const std::string& attention = "soft") {
  DecoderConfig c;
  c.coverage = coverage;
  c.score = score;
  c.attention = attention;
  c.vocab_size = 11;
  c.embed_dim = 6;
  c.hidden_dim = 7;
  c.attn_dim = 5;
  c.feature_dim = 4;
  c.grid_h = 2;
  c.grid_w = 3;
  c.dropout = dropout;
  return c;
}

inline Mat random_features(int B, const DecoderConfig& c, Rng& rng) {
  Mat F((int64_t)B * c.locations(), c.feature_dim);
  for (int64_t i = 0; i < F.size(); ++i) F.data()[i] = (float)rng.normal();
  return F;
}

}  // namespace sat::test
