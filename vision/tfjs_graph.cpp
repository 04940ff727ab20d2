#include "vision/tfjs_graph.hpp"

#include <cstring>
#include <functional>
#include <set>

#include "datasets/features.hpp"
#include "vision/tfjs.hpp"

namespace sat {

using json = nlohmann::json;

static std::string node_problem(const GraphOp& op, const std::string& problem) {
  return "node " + op.name + " (" + op.op + "): " + problem;
}

std::string GraphOp::string_attr(const std::string& key, const std::string& where) const {
  if (!attr.contains(key) || !attr[key].is_object() || !attr[key].contains("s") || !attr[key]["s"].is_string())
    fail(where, node_problem(*this, "no string attribute '" + key + "'"));
  const std::string s = attr[key]["s"].get<std::string>();
  return decode_base64(s, 0, s.size(), where);
}

std::vector<std::string> GraphOp::string_list_attr(const std::string& key, const std::string& where) const {
  std::vector<std::string> out;
  if (!attr.contains(key)) return out;
  const json& a = attr[key];
  const json* list = a.is_object() && a.contains("list") ? &a["list"] : &a;
  if (!list->is_object() || !list->contains("s") || !(*list)["s"].is_array())
    fail(where, node_problem(*this, "attribute '" + key + "' is not a list of strings"));
  for (const json& s : (*list)["s"]) {
    if (!s.is_string()) fail(where, node_problem(*this, "attribute '" + key + "' holds a non-string"));
    const std::string b64 = s.get<std::string>();
    out.push_back(decode_base64(b64, 0, b64.size(), where));
  }
  return out;
}

std::vector<int64_t> GraphOp::int_list_attr(const std::string& key, const std::string& where) const {
  const json* list = nullptr;
  if (attr.contains(key) && attr[key].is_object()) list = attr[key].contains("list") ? &attr[key]["list"] : &attr[key];
  if (!list || !list->is_object() || !list->contains("i") || !(*list)["i"].is_array())
    fail(where, node_problem(*this, "no integer list attribute '" + key + "'"));
  std::vector<int64_t> out;
  for (const json& v : (*list)["i"]) {
    // TF.js writes 64-bit integers as decimal strings
    try {
      out.push_back(v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>());
    } catch (const std::exception&) {
      fail(where, node_problem(*this, "attribute '" + key + "' holds a non-integer"));
    }
  }
  return out;
}

bool GraphOp::bool_attr(const std::string& key, bool fallback) const {
  if (!attr.contains(key) || !attr[key].is_object() || !attr[key].contains("b") || !attr[key]["b"].is_boolean())
    return fallback;
  return attr[key]["b"].get<bool>();
}

const GraphConst& TfjsGraph::constant(const std::string& name, const std::string& reader) const {
  auto it = consts.find(name);
  if (it == consts.end()) fail(path, "node " + reader + " reads " + name + ", which is not a constant of the model");
  return it->second;
}

static GraphOp op_from_json(const json& node, const std::string& path) {
  if (!node.is_object() || !node.contains("name") || !node["name"].is_string() || !node.contains("op") ||
      !node["op"].is_string())
    fail(path, "a node of modelTopology.node has no name or op");
  GraphOp op;
  op.name = node["name"].get<std::string>();
  op.op = node["op"].get<std::string>();
  if (node.contains("input")) {
    if (!node["input"].is_array()) fail(path, node_problem(op, "'input' is not a list"));
    for (const json& in : node["input"]) {
      if (!in.is_string()) fail(path, node_problem(op, "an input is not a name"));
      std::string name = in.get<std::string>();
      if (!name.empty() && name[0] == '^') continue;  // a control dependency: no data flows
      op.inputs.push_back(name);
    }
  }
  if (node.contains("attr") && node["attr"].is_object()) op.attr = node["attr"];
  return op;
}

// The node a (possibly ":1"-suffixed) input names.
static std::string producer_of(const std::string& input) {
  const size_t colon = input.rfind(':');
  return colon == std::string::npos ? input : input.substr(0, colon);
}

// The ops `output` depends on, each after its inputs (depth-first from the output; a cycle is an Error).
static std::vector<GraphOp> ancestors_in_order(const std::map<std::string, GraphOp>& by_name, const std::string& output,
                                               const std::string& path) {
  std::vector<GraphOp> order;
  std::map<std::string, int> state;  // 1: being visited, 2: done
  std::vector<std::pair<std::string, size_t>> stack;
  if (!by_name.count(output)) fail(path, "has no node " + output);
  stack.push_back({output, 0});
  state[output] = 1;
  while (!stack.empty()) {
    auto& [name, next] = stack.back();
    const GraphOp& op = by_name.at(name);
    if (next < op.inputs.size()) {
      const std::string in = producer_of(op.inputs[next++]);
      if (!by_name.count(in)) fail(path, node_problem(op, "reads " + in + ", which no node defines"));
      if (state[in] == 1) fail(path, node_problem(op, "is part of a cycle through " + in));
      if (state[in] == 0) {
        state[in] = 1;
        stack.push_back({in, 0});
      }
      continue;
    }
    state[name] = 2;
    order.push_back(op);
    stack.pop_back();
  }
  return order;
}

// The manifest's tensors that `wanted` names, read from its shards (in the JSON's folder).
static void read_consts(const json& manifest, const std::set<std::string>& wanted, TfjsGraph& g) {
  const std::string dir = [&] {
    const size_t slash = g.path.rfind('/');
    return slash == std::string::npos ? std::string(".") : g.path.substr(0, slash);
  }();
  if (!manifest.is_array()) fail(g.path, "weightsManifest is not a list");
  for (const json& group : manifest) {
    if (!group.is_object() || !group.contains("paths") || !group["paths"].is_array() || !group.contains("weights") ||
        !group["weights"].is_array())
      fail(g.path, "a weightsManifest group has no paths or weights");
    std::string data;
    std::string shard_names;
    for (const json& p : group["paths"]) {
      if (!p.is_string()) fail(g.path, "a weightsManifest path is not a string");
      const std::string shard = join_path(dir, p.get<std::string>());
      if (!file_exists(shard)) fail(shard, "weights shard not found (named by " + g.path + ")");
      data += read_file(shard);
      shard_names += (shard_names.empty() ? "" : ", ") + shard;
    }
    size_t offset = 0;
    for (const json& w : group["weights"]) {
      if (!w.is_object() || !w.contains("name") || !w["name"].is_string() || !w.contains("shape") ||
          !w["shape"].is_array())
        fail(g.path, "a weightsManifest entry has no name or shape");
      const std::string name = w["name"].get<std::string>();
      std::vector<int64_t> shape;
      for (const json& d : w["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (1 << 24))
          fail(g.path, "weight " + name + " has an impossible shape");
        shape.push_back(d.get<int64_t>());
      }
      const int64_t count = shape_size(shape);
      if (count > (int64_t(1) << 28)) fail(g.path, "weight " + name + " is absurdly large");
      const std::string dtype = w.value("dtype", "float32");
      std::string stored = dtype;
      if (w.contains("quantization") && w["quantization"].is_object()) stored = w["quantization"].value("dtype", dtype);
      const size_t elem = stored == "float16" || stored == "uint16" ? 2 : stored == "uint8" ? 1 : 4;
      if (stored != "float32" && stored != "int32" && stored != "float16" && stored != "uint8" && stored != "uint16")
        fail(g.path, "weight " + name + " is stored as " + stored + ", which sat does not read");
      const size_t bytes = (size_t)count * elem;
      if (offset + bytes > data.size())
        fail(shard_names, "too short: weight " + name + " needs bytes " + std::to_string(offset) + ".." +
                              std::to_string(offset + bytes) + " of " + std::to_string(data.size()) +
                              " (truncated file?)");
      if (wanted.count(name)) {
        GraphConst c;
        c.shape = shape;
        const char* p = data.data() + offset;
        if (dtype == "int32") {
          if (stored != "int32") fail(g.path, "int32 weight " + name + " is stored quantized");
          c.is_int = true;
          c.ints.resize(count);
          std::memcpy(c.ints.data(), p, bytes);
        } else {
          c.values.resize(count);
          if (stored == "float32") {
            std::memcpy(c.values.data(), p, bytes);
          } else if (stored == "float16") {
            std::vector<uint16_t> h(count);
            std::memcpy(h.data(), p, bytes);
            half_to_floats(h.data(), c.values.data(), count);
          } else {
            const json& q = w["quantization"];
            const float qmin = q.value("min", 0.f), qscale = q.value("scale", 1.f);
            for (int64_t k = 0; k < count; ++k) {
              uint32_t v = 0;
              std::memcpy(&v, p + k * elem, elem);
              c.values[k] = qmin + qscale * (float)v;
            }
          }
        }
        g.consts[name] = std::move(c);
      }
      offset += bytes;
    }
  }
}

TfjsGraph read_tfjs_graph(const std::string& json_path, const std::string& output) {
  TfjsGraph g;
  g.path = json_path;
  if (!file_exists(json_path)) fail(json_path, "no such file");
  json model;
  try {
    model = json::parse(read_file(json_path));
  } catch (const json::exception& e) {
    fail(json_path, std::string("is not JSON: ") + e.what());
  }
  if (!model.is_object() || !model.contains("modelTopology") || !model["modelTopology"].is_object() ||
      !model["modelTopology"].contains("node") || !model["modelTopology"]["node"].is_array())
    fail(json_path, "is not a TF.js graph model (no modelTopology.node list)");
  if (model.value("format", "graph-model") != "graph-model")
    fail(json_path, "is a TF.js " + model.value("format", std::string("?")) + ", not a graph model");
  for (const char* key : {"format", "generatedBy", "convertedBy"})
    if (model.contains(key) && model[key].is_string()) g.info[key] = model[key].get<std::string>();
  std::map<std::string, GraphOp> by_name;
  for (const json& node : model["modelTopology"]["node"]) {
    GraphOp op = op_from_json(node, json_path);
    const std::string name = op.name;
    if (!by_name.emplace(name, std::move(op)).second) fail(json_path, "two nodes are named " + name);
  }
  g.ops = ancestors_in_order(by_name, output, json_path);
  std::set<std::string> wanted;
  for (const GraphOp& op : g.ops)
    if (op.op == "Const") wanted.insert(op.name);
  if (!model.contains("weightsManifest")) fail(json_path, "has no weightsManifest");
  read_consts(model["weightsManifest"], wanted, g);
  for (const std::string& name : wanted)
    if (!g.consts.count(name)) fail(json_path, "constant " + name + " is not in the weights manifest");
  return g;
}

}  // namespace sat
