#include <doctest/doctest.h>

#include "tests/gradcheck.hpp"
#include "vision/cnn.hpp"

using namespace sat;

namespace {

// loss = sum(grid * R) for a fixed random R, so d loss / d grid = R.
struct EncoderProbe {
  CnnEncoder enc;
  int n;
  std::vector<float> images, R;
  EncoderProbe(const EncoderConfig& cfg, int batch, uint64_t seed) : enc(cfg), n(batch) {
    Rng rng(seed);
    enc.init(rng);
    for (auto& p : enc.params())
      if (p.trainable && p.name.find("conv.weight") == std::string::npos)
        for (auto& v : p.value) v += 0.1f * (float)rng.normal();
    images.resize((size_t)n * 3 * cfg.input_size * cfg.input_size);
    for (auto& v : images) v = (float)rng.normal();
    R.resize((size_t)n * cfg.locations() * cfg.feature_dim());
    for (auto& v : R) v = (float)rng.normal();
  }
  double loss() {
    std::vector<float> grid;
    enc.forward(images.data(), n, true, grid);
    double s = 0;
    for (size_t i = 0; i < grid.size(); ++i) s += (double)grid[i] * R[i];
    return s;
  }
};

void check_encoder(const EncoderConfig& cfg, double tol) {
  EncoderProbe probe(cfg, 3, 21);
  probe.loss();
  for (auto& p : probe.enc.params()) p.zero_grad();
  probe.enc.backward(probe.R.data());
  for (auto& p : probe.enc.params()) {
    if (!p.trainable) continue;
    CAPTURE(p.name);
    FloatBuffer analytic = p.grad;
    // Max pooling and ReLU have kinks: keep the step small so few samples straddle one.
    // Many ReLU/pool kinks bend the curve: a small step, and a floor scaled to this tensor's gradients
    // so that float32 round-off on tiny entries does not count as an error.
    double gmax = 0;
    for (float g : analytic) gmax = std::max(gmax, (double)std::fabs(g));
    auto r = test::check_gradient(
        p.value, analytic, [&] { return probe.loss(); }, 20, 5e-4, 0.05 * gmax + 1e-4, 0.05);
    if (getenv("SAT_GRADCHECK_VERBOSE"))
      MESSAGE(p.name << " worst " << r.worst << " within " << r.fraction_within(tol) << " skipped " << r.skipped);
    // Max-pool ties on noise inputs leave a few entries whose difference quotient never settles (it drifts
    // toward the analytic value as the step shrinks); a real backward bug moves every entry.
    CHECK(r.fraction_within(tol) >= 0.85);
    CHECK(r.worst < 0.3);
    CHECK(r.skipped * 2 < r.checked + r.skipped);  // most entries really were checked
  }
}

}  // namespace

TEST_CASE("encoder: conv + batch norm + ReLU + max pool gradients match finite differences") {
  EncoderConfig cfg;
  cfg.input_size = 12;
  cfg.blocks = {{5, 3, 2}, {6, 3, 2}};  // block 0's gradient passes through block 1's conv backward-data and pooling
  cfg.coord_channels = true;
  // 3e-2: the float32 forward sums differently with one thread than with two (oneDNN splits the work by thread),
  // which moved one batch-norm shift entry to 2.3e-2; a wrong backward is off by far more (and worst < 0.3 holds).
  check_encoder(cfg, 3e-2);
}

TEST_CASE("encoder: blocks without pooling and a 1x1 conv") {
  EncoderConfig cfg;
  cfg.input_size = 8;
  cfg.blocks = {{4, 3, 1}, {8, 1, 1}, {5, 3, 2}};
  cfg.coord_channels = false;
  check_encoder(cfg, 2e-2);
}

TEST_CASE("encoder: grid shape, coordinate channels, inference uses running statistics") {
  EncoderConfig cfg;
  cfg.input_size = 32;
  cfg.blocks = {{4, 3, 2}, {6, 3, 2}};
  CnnEncoder enc(cfg);
  Rng rng(1);
  enc.init(rng);
  CHECK(cfg.grid_h() == 8);
  CHECK(cfg.feature_dim() == 8);
  std::vector<float> img(2 * 3 * 32 * 32);
  for (auto& v : img) v = (float)rng.normal();
  std::vector<float> g_train, g_infer, g_infer2;
  enc.forward(img.data(), 2, false, g_infer);
  REQUIRE(g_infer.size() == 2u * 64 * 8);
  // the last two channels are (row, col) in [-1, 1]
  CHECK(g_infer[6] == doctest::Approx(-1.0));
  CHECK(g_infer[7] == doctest::Approx(-1.0));
  CHECK(g_infer[63 * 8 + 6] == doctest::Approx(1.0));
  CHECK(g_infer[63 * 8 + 7] == doctest::Approx(1.0));
  // a training pass moves the running statistics, which changes inference outputs
  enc.forward(img.data(), 2, true, g_train);
  enc.forward(img.data(), 2, false, g_infer2);
  double diff = 0;
  for (size_t i = 0; i < g_infer.size(); ++i) diff += std::fabs(g_infer[i] - g_infer2[i]);
  CHECK(diff > 1e-3);
  // inference is deterministic and per-image (batch of 1 equals the first row of the batch of 2)
  std::vector<float> one;
  enc.forward(img.data(), 1, false, one);
  for (size_t i = 0; i < one.size(); ++i) REQUIRE(one[i] == doctest::Approx(g_infer2[i]).epsilon(1e-4));
}

TEST_CASE("encoder config: bad values are errors, not crashes") {
  nlohmann::json j = EncoderConfig().to_json();
  j["blocks"][0]["kernel"] = 2;
  CHECK_THROWS_AS(EncoderConfig::from_json(j), Error);
  j = EncoderConfig().to_json();
  j["input_size"] = 16;  // 4 pools of 2 -> 1x1 grid, still valid; 8 pools away to nothing
  CHECK_NOTHROW(EncoderConfig::from_json(j));
  j["input_size"] = 8;
  CHECK_THROWS_AS(EncoderConfig::from_json(j), Error);
  CHECK_THROWS_AS(EncoderConfig::parse_blocks("16,x,32"), Error);
  CHECK(EncoderConfig::parse_blocks("16,32").size() == 2);
}
