// Adam with gradient-norm clipping; its moments go into checkpoints.
#pragma once
#include <vector>

#include "datasets/io.hpp"

namespace sat {

struct Adam {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  int64_t step = 0;
  std::vector<FloatBuffer> m, v;  // one per trainable param, in params order

  void attach(const std::vector<Param*>& params);
  // Scales gradients so their global L2 norm is at most max_norm (<= 0: no clipping); returns the norm before.
  static double clip_grad_norm(const std::vector<Param*>& params, double max_norm);
  // lr_scale (optional, one per param): that parameter's step is lr * lr_scale[k] (fine-tuned encoder blocks).
  void update(const std::vector<Param*>& params, float lr, const std::vector<float>* lr_scale = nullptr);
};

}  // namespace sat
