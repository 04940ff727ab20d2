#include "vision/netgraph.hpp"

#include <map>
#include <set>

#include "datasets/io.hpp"

namespace sat {

using nlohmann::json;

int NetGraph::index_of(const std::string& name) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == name) return (int)i;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (auto& a : nodes[i].aliases)
      if (a == name) return (int)i;
  return -1;
}

static std::string no_layer(const NetGraph& g, const std::string& name) {
  std::string names;
  for (auto& c : g.cut_points()) names += (names.empty() ? "" : ", ") + c;
  return "the network has no layer '" + name + "' (cut points: " + names + ")";
}

NetGraph NetGraph::cut(const std::string& output) const {
  int out = index_of(output);
  if (out < 0) throw Error(no_layer(*this, output));
  std::set<std::string> needed{nodes[out].name};
  for (int i = out; i >= 0; --i)
    if (needed.count(nodes[i].name))
      for (auto& in : nodes[i].inputs) needed.insert(in);
  NetGraph g;
  for (int i = 0; i <= out; ++i)
    if (needed.count(nodes[i].name)) g.nodes.push_back(nodes[i]);
  for (auto& n : g.nodes)  // a grid node cut away: this node's own output is what remains
    if (!n.grid.empty() && !needed.count(n.grid)) n.grid.clear();
  return g;
}

std::string NetGraph::grid_node(const std::string& cut_name) const {
  int i = index_of(cut_name);
  if (i < 0) throw Error(no_layer(*this, cut_name));
  return nodes[i].grid.empty() ? nodes[i].name : nodes[i].grid;
}

// TensorFlow's rule: 'same' gives ceil(in / s) outputs and puts the odd padding pixel at the end;
// 'valid' gives floor((in - k) / s) + 1 and no padding.
static void spatial(int in, int k, int s, bool same, int& out, int& pad_before, int& pad_after) {
  if (same) {
    out = (in + s - 1) / s;
    int total = std::max((out - 1) * s + k - in, 0);
    pad_before = total / 2;
    pad_after = total - pad_before;
  } else {
    out = in >= k ? (in - k) / s + 1 : 0;
    pad_before = pad_after = 0;
  }
}

std::vector<NodeShape> NetGraph::shapes(int h, int w) const {
  std::vector<NodeShape> out(nodes.size());
  std::map<std::string, int> at;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NetNode& n = nodes[i];
    NodeShape& s = out[i];
    if (n.op == "input") {
      s.c = 3, s.h = h, s.w = w;
    } else if (n.op == "concat") {
      const NodeShape& first = out[at.at(n.inputs[0])];
      s.h = first.h, s.w = first.w;
      for (auto& in : n.inputs) {
        const NodeShape& x = out[at.at(in)];
        if (x.h != s.h || x.w != s.w) throw Error("layer '" + n.name + "' concatenates inputs of different sizes");
        s.c += x.c;
      }
    } else if (n.op == "add") {
      s = out[at.at(n.inputs[0])];
      s.pad_t = s.pad_l = s.pad_b = s.pad_r = 0;
      for (auto& in : n.inputs) {
        const NodeShape& x = out[at.at(in)];
        if (x.h != s.h || x.w != s.w || x.c != s.c)
          throw Error("layer '" + n.name + "' adds inputs of different shapes");
      }
    } else if (n.op == "affine") {
      const NodeShape& x = out[at.at(n.inputs[0])];
      s.c = x.c, s.h = x.h, s.w = x.w;
    } else {
      const NodeShape& x = out[at.at(n.inputs[0])];
      if (n.explicit_pad) {  // pad, then 'valid'
        s.pad_t = n.pads[0], s.pad_l = n.pads[1], s.pad_b = n.pads[2], s.pad_r = n.pads[3];
        const int ph = x.h + s.pad_t + s.pad_b, pw = x.w + s.pad_l + s.pad_r;
        s.h = ph >= n.kh ? (ph - n.kh) / n.sh + 1 : 0;
        s.w = pw >= n.kw ? (pw - n.kw) / n.sw + 1 : 0;
      } else {
        spatial(x.h, n.kh, n.sh, n.same, s.h, s.pad_t, s.pad_b);
        spatial(x.w, n.kw, n.sw, n.same, s.w, s.pad_l, s.pad_r);
      }
      s.c = n.op == "conv" ? n.filters : x.c;
      if (s.h < 1 || s.w < 1)
        throw Error("input " + std::to_string(h) + "x" + std::to_string(w) + " is too small: layer '" + n.name +
                    "' gets " + std::to_string(x.h) + "x" + std::to_string(x.w));
    }
    at[n.name] = (int)i;
  }
  return out;
}

double NetGraph::conv_macs(int h, int w) const {
  auto sh = shapes(h, w);
  std::map<std::string, int> at;
  double macs = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    at[nodes[i].name] = (int)i;
    if (nodes[i].op != "conv") continue;
    const NodeShape& in = sh[at.at(nodes[i].inputs[0])];
    macs += (double)sh[i].h * sh[i].w * sh[i].c * in.c * nodes[i].kh * nodes[i].kw;
  }
  return macs;
}

std::vector<std::string> NetGraph::cut_points() const {
  std::vector<std::string> out;
  for (auto& n : nodes)  // named by their aliases first (ResNet: "block3", then its units)
    for (auto& a : n.aliases) out.push_back(a);
  for (auto& n : nodes)
    if (!n.grid.empty()) out.push_back(n.name);
  if (!out.empty()) return out;
  for (auto& n : nodes)
    if (n.op == "concat" && n.name.rfind("mixed", 0) == 0 && n.name.find('_') == std::string::npos)
      out.push_back(n.name);
  if (out.empty())
    for (auto& n : nodes)
      if (n.op == "concat") out.push_back(n.name);
  if (out.empty() && !nodes.empty()) out.push_back(nodes.back().name);
  return out;
}

json NetGraph::to_json() const {
  json arr = json::array();
  for (auto& n : nodes) {
    json j = {{"name", n.name}, {"op", n.op}, {"inputs", n.inputs}};
    if (n.op == "conv" || n.op == "maxpool" || n.op == "avgpool") {
      j["kernel_size"] = {n.kh, n.kw};
      j["strides"] = {n.sh, n.sw};
      j["padding"] = n.explicit_pad ? "explicit" : n.same ? "same" : "valid";
      if (n.explicit_pad) j["pads"] = {n.pads[0], n.pads[1], n.pads[2], n.pads[3]};
    }
    if (n.op == "conv") {
      j["filters"] = n.filters;
      j["kernel"] = n.kernel;
      if (n.kernel_ohwi) j["kernel_layout"] = "OHWI";
      if (!n.bias.empty()) j["bias"] = n.bias;
      if (!n.bn.empty()) {
        j["batch_norm"] = n.bn;
        j["bn_scale"] = n.bn_scale;
        j["bn_epsilon"] = n.bn_epsilon;
      }
      j["relu"] = n.relu;
    }
    if (n.op == "affine") {
      j["scale"] = n.scale;
      j["offset"] = n.offset;
      j["relu"] = n.relu;
    }
    if (!n.aliases.empty()) j["aliases"] = n.aliases;
    if (!n.grid.empty()) j["grid"] = n.grid;
    arr.push_back(j);
  }
  return arr;
}

NetGraph NetGraph::from_json(const json& arr) {
  NetGraph g;
  std::set<std::string> defined;
  try {
    if (!arr.is_array() || arr.empty()) throw Error("network graph is empty or not a list");
    for (auto& j : arr) {
      NetNode n;
      n.name = j.at("name").get<std::string>();
      n.op = j.at("op").get<std::string>();
      n.inputs = j.at("inputs").get<std::vector<std::string>>();
      if (n.op != "input" && n.op != "conv" && n.op != "maxpool" && n.op != "avgpool" && n.op != "concat" &&
          n.op != "affine" && n.op != "add")
        throw Error("network layer '" + n.name + "' has unknown op '" + n.op + "'");
      if ((n.op == "input") != g.nodes.empty()) throw Error("network graph must start with its one input");
      const size_t arity = n.inputs.size();
      if (n.op == "input" ? arity != 0 : n.op == "concat" ? arity == 0 : n.op == "add" ? arity != 2 : arity != 1)
        throw Error("network layer '" + n.name + "' has the wrong number of inputs");
      for (auto& in : n.inputs)
        if (!defined.count(in)) throw Error("network layer '" + n.name + "' reads '" + in + "' before it is defined");
      if (n.op == "conv" || n.op == "maxpool" || n.op == "avgpool") {
        auto k = j.at("kernel_size").get<std::vector<int>>(), s = j.at("strides").get<std::vector<int>>();
        if (k.size() != 2 || s.size() != 2 || k[0] < 1 || k[1] < 1 || s[0] < 1 || s[1] < 1)
          throw Error("network layer '" + n.name + "' has a bad kernel size or stride");
        n.kh = k[0], n.kw = k[1], n.sh = s[0], n.sw = s[1];
        std::string pad = j.at("padding").get<std::string>();
        if (pad != "same" && pad != "valid" && pad != "explicit")
          throw Error("network layer '" + n.name + "' has padding '" + pad + "'");
        n.same = pad == "same";
        n.explicit_pad = pad == "explicit";
        if (n.explicit_pad) {
          auto p = j.at("pads").get<std::vector<int>>();
          if (p.size() != 4) throw Error("network layer '" + n.name + "' needs 4 pads (top, left, bottom, right)");
          for (int k = 0; k < 4; ++k) {
            if (p[k] < 0 || p[k] >= (k % 2 ? n.kw : n.kh))
              throw Error("network layer '" + n.name + "' has a pad outside [0, kernel size)");
            n.pads[k] = p[k];
          }
        }
      }
      if (n.op == "conv") {
        n.filters = j.at("filters").get<int>();
        if (n.filters < 1) throw Error("network layer '" + n.name + "' has no filters");
        n.kernel = j.at("kernel").get<std::string>();
        n.bias = j.value("bias", std::string());
        n.bn = j.value("batch_norm", std::string());
        n.bn_scale = j.value("bn_scale", false);
        n.bn_epsilon = j.value("bn_epsilon", 1e-3f);
        n.relu = j.at("relu").get<bool>();
        std::string layout = j.value("kernel_layout", std::string("HWIO"));
        if (layout != "HWIO" && layout != "OHWI")
          throw Error("network layer '" + n.name + "' has kernel layout '" + layout + "' (HWIO or OHWI)");
        n.kernel_ohwi = layout == "OHWI";
      }
      if (n.op == "affine") {
        n.scale = j.at("scale").get<std::string>();
        n.offset = j.at("offset").get<std::string>();
        n.relu = j.at("relu").get<bool>();
      }
      n.aliases = j.value("aliases", std::vector<std::string>());
      n.grid = j.value("grid", std::string());
      if (!defined.insert(n.name).second) throw Error("network layer '" + n.name + "' is defined twice");
      g.nodes.push_back(std::move(n));
    }
    for (auto& n : g.nodes)  // the grid node comes later in the graph (it reads this one)
      if (!n.grid.empty() && !defined.count(n.grid))
        throw Error("network layer '" + n.name + "' names a grid node '" + n.grid + "' that is not in the graph");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(std::string("network graph is malformed (") + e.what() + ")");
  }
  return g;
}

}  // namespace sat
