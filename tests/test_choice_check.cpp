// The choice check: choosing among systems on one half of the images and scoring the choice on the other. By hand
// for two systems that each win one image; a system better on every image is chosen every time and holds its lead;
// among systems that differ only by luck, the choice's own half overstates it and the other half shows no gain.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sat/error.hpp"
#include "tests/scratch.hpp"
#include "tests/score_stats.hpp"
#include "train/choice_check.hpp"

using namespace sat;
using test::cider_only;
using test::error_of;

namespace {

// n values in [0, 1) from the stream (the same on every platform: no distribution object).
std::vector<double> uniform_values(std::mt19937_64& rng, int n, double shift = 0) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(shift + (double)(rng() >> 11) / 9007199254740992.0);
  return v;
}

}  // namespace

TEST_CASE("choice check: two systems that each win one image, by hand") {
  const ChoiceCheck c = check_choice({cider_only({1, 0}), cider_only({0, 1})}, "CIDEr", 40, 3);
  CHECK(c.systems == 2);
  CHECK(c.images == 2);
  CHECK(c.on_all == std::vector<double>{0.5, 0.5});
  CHECK(c.best_on_all == 0);  // the first of the best
  CHECK(c.median_on_all == 0.5);
  // Each half is one image: the system that wins it is chosen, scores 1 there and 0 on the other image, where the
  // median of the two scores (0 and 1) is 0.5.
  CHECK(c.chosen_own_half == 1);
  CHECK(c.chosen_other_half == 0);
  CHECK(c.median_other_half == 0.5);
  CHECK(c.overstated_low == 1);
  CHECK(c.overstated_high == 1);
  CHECK(c.times_chosen[0] + c.times_chosen[1] == 40);
  CHECK(c.times_chosen[0] > 0);
  CHECK(c.times_chosen[1] > 0);
}

TEST_CASE("choice check: a system better on every image is chosen every time and holds its lead") {
  std::mt19937_64 rng(11);
  std::vector<ImageScoreStats> systems;
  systems.push_back(cider_only(uniform_values(rng, 40, 1.0)));  // in [1, 2): above every other system's images
  for (int k = 0; k < 4; ++k) systems.push_back(cider_only(uniform_values(rng, 40)));
  const ChoiceCheck c = check_choice(systems, "CIDEr", 100, 5);
  CHECK(c.best_on_all == 0);
  CHECK(c.times_chosen[0] == 100);
  CHECK(c.chosen_other_half - c.median_other_half > 0.5);
  CHECK(c.overstated_low <= c.overstated_high);
}

TEST_CASE("choice check: among systems that differ only by luck, the choice buys nothing out of its half") {
  std::mt19937_64 rng(12);
  std::vector<ImageScoreStats> systems;
  for (int k = 0; k < 20; ++k) systems.push_back(cider_only(uniform_values(rng, 200)));
  const ChoiceCheck c = check_choice(systems, "CIDEr", 200, 6);
  CAPTURE(c.chosen_own_half);
  CAPTURE(c.chosen_other_half);
  CAPTURE(c.median_other_half);
  // The best of 20 half-means of 100 values (sd 0.029 each) sits well above its other half...
  CHECK(c.chosen_own_half - c.chosen_other_half > 0.03);
  // ... which scores as the median system does, give or take the noise of one half-mean.
  CHECK(std::abs(c.chosen_other_half - c.median_other_half) < 0.02);
  // The same splits for the same seed.
  const ChoiceCheck again = check_choice(systems, "CIDEr", 200, 6);
  CHECK(again.chosen_other_half == c.chosen_other_half);
  CHECK(again.times_chosen == c.times_chosen);
}

TEST_CASE("choice check: errors") {
  const ImageScoreStats a = cider_only({1, 0, 1}), b = cider_only({0, 1, 0});
  CHECK(error_of([&] { check_choice({a}, "CIDEr", 10, 1); }) == "a choice needs at least 2 systems, got 1");
  CHECK(error_of([&] { check_choice({a, cider_only({1, 0})}, "CIDEr", 10, 1); }) ==
        "system 2 has statistics of 2 images, the first 3");
  CHECK(error_of([&] { check_choice({cider_only({1}), cider_only({0})}, "CIDEr", 10, 1); }) ==
        "a choice check splits the images in two: it needs at least 2, got 1");
  CHECK(error_of([&] { check_choice({a, b}, "rarer_false", 10, 1); }) ==
        "choose by one of Bleu_4, METEOR, ROUGE_L, CIDEr, rarer_named (higher is better), not 'rarer_false'");
  CHECK(error_of([&] { check_choice({a, b}, "CIDEr", 0, 1); }) == "the splits must be in [1, 10000]");
  CHECK(error_of([&] { check_choice({a, b}, "METEOR", 10, 1); }).find("METEOR is not computed here") == 0);
}
