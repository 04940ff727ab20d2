// TF-slim's ResNet v2 (pre-activation bottleneck units) as a network graph, read straight from a safetensors file
// of its trunk (../shared/models/resnet_v2_101: tensors named conv1/weights, blockB/unit_U/bottleneck_v2/...).
#pragma once
#include <string>

#include "datasets/safetensors.hpp"
#include "vision/netgraph.hpp"

namespace sat {

// Does the file hold a TF-slim ResNet v2 trunk (its root convolution and block1's first unit)?
bool is_resnet_v2(const TensorFile& tf);

// The trunk as TF-slim computes it: conv1 7x7/2 (explicit padding 3) with bias, pool1 3x3/2 max ('same'), then per
// unit: preact = relu(x * scale + offset); shortcut = x (subsampled by a 1x1/s max pool when the unit strides), or
// a 1x1 projection of preact; residual 1x1 -> 3x3/s (explicit padding 1) -> 1x1 on preact; out = shortcut + residual.
// The last unit of every block but the fourth strides by 2. Nodes: "conv1", "pool1", each unit's sum named
// "blockB/unit_U" (the last unit's also "blockB"), whose attention grid is the next unit's pre-activation
// ("blockB/unit_U/bottleneck_v2/preact"; after block3's last unit, block4/unit_1's). Kernels stay OHWI.
// Errors (a unit missing a tensor, blocks out of order) name `where`.
NetGraph resnet_v2_graph(const TensorFile& tf, const std::string& where);

}  // namespace sat
