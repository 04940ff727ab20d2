// Eigen views over Param buffers: decoder math is batched, row-major float32.
#pragma once
#include <Eigen/Dense>

#include "datasets/io.hpp"

namespace sat {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::Matrix<float, 1, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<Mat>;
using ConstMatMap = Eigen::Map<const Mat>;
// A block of consecutive rows of a const Mat (one grid's L rows of features)
using ConstRows = Eigen::Block<const Mat, Eigen::Dynamic, Eigen::Dynamic, true>;

// A Param viewed as rows x cols (shape [rows, cols] or [n] as 1 x n).
inline MatMap value_of(Param& p) {
  int64_t r = p.shape.size() == 2 ? p.shape[0] : 1, c = p.shape.size() == 2 ? p.shape[1] : p.shape[0];
  return MatMap(p.value.data(), r, c);
}
// The gradient viewed alike (allocated, zeros, on first use: Param::ensure_grad).
inline MatMap grad_of(Param& p) {
  int64_t r = p.shape.size() == 2 ? p.shape[0] : 1, c = p.shape.size() == 2 ? p.shape[1] : p.shape[0];
  p.ensure_grad();
  return MatMap(p.grad.data(), r, c);
}

}  // namespace sat
