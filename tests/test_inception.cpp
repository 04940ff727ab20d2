// The imported InceptionV3 on oneDNN against TensorFlow.js reference activations
// (tests/fixtures/inception_v3_tfjs.safetensors, written by tools/make-inception-fixture.sh).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "datasets/safetensors.hpp"
#include "vision/pretrained.hpp"

using namespace sat;

namespace {

struct Diff {
  double max_abs = 0, max_ref = 0, mean_abs = 0;
};

Diff compare(const std::vector<float>& ours, const FloatBuffer& ref, size_t offset = 0) {
  Diff d;
  for (size_t i = 0; i < ref.size(); ++i) {
    double e = std::fabs((double)ours[offset + i] - ref[i]);
    d.max_abs = std::max(d.max_abs, e);
    d.max_ref = std::max(d.max_ref, (double)std::fabs(ref[i]));
    d.mean_abs += e;
  }
  d.mean_abs /= (double)ref.size();
  return d;
}

// The fixture's pixels (H x W x 3 RGB bytes) as the encoder's planar input, RGB / 255.
std::vector<float> planes_of(const QuantizedTensor& img, int copies) {
  const int H = (int)img.shape[0], W = (int)img.shape[1];
  std::vector<float> out((size_t)copies * 3 * H * W);
  for (int k = 0; k < copies; ++k)
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < H * W; ++p) out[((size_t)k * 3 + c) * H * W + p] = img.data[(size_t)p * 3 + c] / 255.f;
  return out;
}

}  // namespace

// Tolerance: both sides compute in float32 but differently (tfjs: conv, then batch norm, then ReLU; ours: batch
// norm folded into the weights, oneDNN's blocked accumulation order). Rounding differences of ~1e-7 relative per
// operation grow through the 40-70 convolutions. Measured: max 2.1e-5 and mean 7e-7 of the largest activation.
// We allow 1e-4 of the largest activation at any element and 5e-6 of it on average. A real bug (a wrong padding
// side, pooling divisor, channel order, unfolded batch norm) is orders of magnitude larger.
TEST_CASE("InceptionV3 on oneDNN matches TensorFlow.js at mixed5 and mixed7, batch 1 and 2, 160 and 299") {
  const std::string dir = SAT_SOURCE_DIR;
  PretrainedNet net = load_pretrained_net(dir + "/models/inception_v3.sat");
  TensorFile fx = load_safetensors(dir + "/tests/fixtures/inception_v3_tfjs.safetensors");
  struct Case {
    std::string image, cut;
  };
  for (const Case& c : {Case{"image0", "mixed5"}, Case{"image0", "mixed7"}, Case{"image1", "mixed5"}}) {
    const QuantizedTensor& img = fx.quantized.at(c.image);
    const Param& ref = fx.tensors.at(c.image + "." + c.cut);
    const int S = (int)img.shape[0];
    PretrainedEncoder enc(net.graph.cut(c.cut), net.weights, S, "inception_v3.sat");
    CHECK(enc.grid_h() == ref.shape[0]);
    CHECK(enc.grid_w() == ref.shape[1]);
    CHECK(enc.channels() == ref.shape[2]);
    for (int batch : {1, 2}) {  // batch 1: concatenation in place; batch 2: concat primitive
      std::vector<float> grid;
      enc.forward(planes_of(img, batch).data(), batch, grid);
      REQUIRE(grid.size() == (size_t)batch * ref.value.size());
      for (int k = 0; k < batch; ++k) {
        Diff d = compare(grid, ref.value, (size_t)k * ref.value.size());
        std::printf("  %s %dx%d %s batch %d: max |ours - tfjs| %.3g (largest activation %.3g), mean %.3g\n",
                    c.image.c_str(), S, S, c.cut.c_str(), batch, d.max_abs, d.max_ref, d.mean_abs);
        CHECK(d.max_abs <= 1e-4 * d.max_ref);
        CHECK(d.mean_abs <= 5e-6 * d.max_ref);
      }
    }
  }
}

TEST_CASE("encoder files: truncated or foreign files are refused with the file named") {
  const std::string dir = SAT_SOURCE_DIR;
  std::string bytes = read_file(dir + "/models/inception_v3.sat");
  std::string tmp = "/tmp/sat_test_truncated_encoder.sat";
  write_file_atomic(tmp, bytes.substr(0, bytes.size() / 2));
  CHECK_THROWS_WITH_AS(load_pretrained_net(tmp), doctest::Contains("sat_test_truncated_encoder.sat"), Error);
  CHECK_THROWS_WITH_AS(load_pretrained_net(dir + "/models/synth.sat"), doctest::Contains("not a sat encoder file"),
                       Error);
  PretrainedNet net = load_pretrained_net(dir + "/models/inception_v3.sat");
  CHECK_THROWS_WITH_AS(net.graph.cut("mixed99"), doctest::Contains("mixed5"), Error);
  CHECK_THROWS_WITH_AS(PretrainedEncoder(net.graph.cut("mixed5"), net.weights, 40, "enc.sat"),
                       doctest::Contains("too small"), Error);
  std::remove(tmp.c_str());
}
