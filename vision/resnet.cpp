#include "vision/resnet.hpp"

#include <map>
#include <regex>

namespace sat {

bool is_resnet_v2(const TensorFile& tf) {
  return tf.shape_of("conv1/weights") && tf.shape_of("block1/unit_1/bottleneck_v2/preact/scale");
}

NetGraph resnet_v2_graph(const TensorFile& tf, const std::string& where) {
  // block -> number of units, from the tensor names
  std::map<int, int> units;
  static const std::regex unit_re(R"(block(\d{1,4})/unit_(\d{1,4})/bottleneck_v2/.*)");
  std::vector<std::string> names;
  for (auto& [name, p] : tf.tensors) names.push_back(name);
  for (auto& [name, h] : tf.mapped_half) names.push_back(name);
  for (auto& name : names) {
    std::smatch m;
    if (!std::regex_match(name, m, unit_re)) continue;
    const int b = std::stoi(m[1]), u = std::stoi(m[2]);
    if (b < 1 || b > 4 || u < 1 || u > 1000) fail(where, "unexpected ResNet tensor '" + name + "'");
    units[b] = std::max(units[b], u);
  }
  auto has = [&](const std::string& name) { return tf.shape_of(name) != nullptr; };
  auto filters = [&](const std::string& kernel) {
    const std::vector<int64_t>* shape = tf.shape_of(kernel);
    if (!shape) fail(where, "missing tensor '" + kernel + "'");
    if (shape->size() != 4) fail(where, "tensor '" + kernel + "' is not a 4-d OHWI kernel");
    return (int)(*shape)[0];
  };
  NetGraph g;
  NetNode input;
  input.name = "input";
  input.op = "input";
  g.nodes.push_back(input);

  auto conv = [&](const std::string& name, const std::string& scope, const std::string& from, int k, int stride,
                  bool relu) {
    NetNode c;
    c.name = name;
    c.op = "conv";
    c.inputs = {from};
    c.kh = c.kw = k;
    c.sh = c.sw = stride;
    c.explicit_pad = true;  // TF-slim pads (k - 1) / 2 on each side, then 'valid' (equal to 'same' at stride 1)
    for (int& p : c.pads) p = (k - 1) / 2;
    c.kernel = scope + "/weights";
    c.bias = scope + "/biases";
    c.kernel_ohwi = true;
    c.filters = filters(c.kernel);
    c.relu = relu;
    g.nodes.push_back(c);
    return name;
  };
  conv("conv1", "conv1", "input", 7, 2, false);
  NetNode pool;
  pool.name = "pool1";
  pool.op = "maxpool";
  pool.inputs = {"conv1"};
  pool.kh = pool.kw = 3;
  pool.sh = pool.sw = 2;
  pool.same = true;
  g.nodes.push_back(pool);

  std::string x = "pool1";  // the residual stream: the last unit's sum
  int expected_block = 1;
  for (auto& [b, count] : units) {
    if (b != expected_block)
      fail(where, "ResNet blocks out of order: block" + std::to_string(b) + " follows block" +
                      std::to_string(expected_block - 1));
    ++expected_block;
    for (int u = 1; u <= count; ++u) {
      const std::string unit = "block" + std::to_string(b) + "/unit_" + std::to_string(u);
      const std::string scope = unit + "/bottleneck_v2";
      if (!has(scope + "/preact/scale")) fail(where, "missing tensor '" + scope + "/preact/scale'");
      NetNode pre;
      pre.name = scope + "/preact";
      pre.op = "affine";
      pre.inputs = {x};
      pre.scale = scope + "/preact/scale";
      pre.offset = scope + "/preact/offset";
      pre.relu = true;
      g.nodes.push_back(pre);
      if (x != "pool1") g.nodes[g.index_of(x)].grid = pre.name;  // the previous unit's sum, as attention sees it
      if (!has(scope + "/conv1/weights")) {
        // block4/unit_1 of a trunk cut after block3: only its pre-activation, which normalizes block3's output
        if (u != 1 || b != (int)units.size()) fail(where, "missing tensor '" + scope + "/conv1/weights'");
        break;
      }
      const int stride = (u == count && b < 4) ? 2 : 1;
      std::string shortcut = x;
      if (has(scope + "/shortcut/weights")) {
        shortcut = conv(scope + "/shortcut", scope + "/shortcut", pre.name, 1, stride, false);
      } else if (stride > 1) {
        NetNode sub;  // x[::s, ::s]
        sub.name = scope + "/shortcut";
        sub.op = "maxpool";
        sub.inputs = {x};
        sub.kh = sub.kw = 1;
        sub.sh = sub.sw = stride;
        g.nodes.push_back(sub);
        shortcut = sub.name;
      }
      conv(scope + "/conv1", scope + "/conv1", pre.name, 1, 1, true);
      conv(scope + "/conv2", scope + "/conv2", scope + "/conv1", 3, stride, true);
      conv(scope + "/conv3", scope + "/conv3", scope + "/conv2", 1, 1, false);
      NetNode sum;
      sum.name = unit;
      sum.op = "add";
      sum.inputs = {shortcut, scope + "/conv3"};
      if (u == count) sum.aliases = {"block" + std::to_string(b)};
      g.nodes.push_back(sum);
      x = unit;
    }
  }
  return NetGraph::from_json(g.to_json());  // the same checks as a graph read from a file
}

}  // namespace sat
