// Test helpers: central finite differences against analytic gradients (on a sample of each parameter's entries),
// random inputs, and the largest difference between two outputs.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "datasets/io.hpp"

namespace sat::test {

// n standard-normal values from the run's generator.
inline std::vector<float> randoms(size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (auto& x : v) x = (float)rng.normal();
  return v;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

struct GradCheckResult {
  double worst = 0;  // largest |analytic - numeric| / (|analytic| + |numeric| + floor)
  int checked = 0;
  int skipped = 0;  // entries whose step straddled a kink (ReLU, max pool)
  std::vector<double> errors;
  // Fraction of checked entries with error below tol.
  double fraction_within(double tol) const {
    int ok = 0;
    for (double e : errors) ok += e < tol;
    return errors.empty() ? 0.0 : (double)ok / errors.size();
  }
};

// loss(): recomputes the scalar loss from the current values. analytic: gradient buffer filled beforehand.
// Checks up to `samples` entries spread over the tensor. float32 forward passes, so eps is not tiny.
template <typename Values, typename Analytic>
GradCheckResult check_gradient(Values& values, const Analytic& analytic, const std::function<double()>& loss,
                               int samples = 12, double eps = 1e-2, double floor = 2e-3, double kink_tolerance = 0) {
  GradCheckResult r;
  const size_t n = values.size();
  const size_t stride = std::max<size_t>(1, n / samples);
  for (size_t i = (n > 1 ? 1 : 0) % std::max<size_t>(n, 1); i < n; i += stride) {
    float keep = values[i];
    values[i] = keep + (float)eps;
    double lp = loss();
    values[i] = keep - (float)eps;
    double lm = loss();
    values[i] = keep;
    double numeric = (lp - lm) / (2 * eps);
    if (kink_tolerance > 0) {
      // Same estimate with half the step: a kink inside the interval makes the two disagree.
      values[i] = keep + (float)(eps / 2);
      double hp = loss();
      values[i] = keep - (float)(eps / 2);
      double hm = loss();
      values[i] = keep;
      double half = (hp - hm) / eps;
      if (std::fabs(half - numeric) > kink_tolerance * (std::fabs(half) + std::fabs(numeric) + floor)) {
        r.skipped++;
        continue;
      }
    }
    double err = std::fabs(analytic[i] - numeric) / (std::fabs(analytic[i]) + std::fabs(numeric) + floor);
    r.worst = std::max(r.worst, err);
    r.errors.push_back(err);
    r.checked++;
  }
  return r;
}

}  // namespace sat::test
