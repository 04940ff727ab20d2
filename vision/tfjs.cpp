#include "vision/tfjs.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sys/stat.h>

#include "datasets/features.hpp"
#include "datasets/io.hpp"
#include "datasets/json_checks.hpp"

namespace sat {

using nlohmann::json;

// ---------------------------------------------------------------- JavaScript literal and base64

namespace {

struct JsParser {
  const std::string& s;
  size_t& i;
  const std::string& where;

  [[noreturn]] void bad(const std::string& what) {
    fail(where, "cannot read the model's JavaScript object at byte " + std::to_string(i) + " (" + what + ")");
  }
  void skip_ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool starts(const char* w) { return s.compare(i, std::strlen(w), w) == 0; }

  std::string string_lit() {
    char q = s[i++];
    std::string out;
    while (i < s.size() && s[i] != q) {
      char c = s[i++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) break;
      char e = s[i++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (i + 4 > s.size()) bad("short \\u escape");
          const int32_t cp = json_hex4(s.data() + i);
          if (cp < 0) bad("bad \\u escape (needs 4 hex digits)");
          i += 4;
          append_utf8(out, (uint32_t)cp);
          break;
        }
        default:
          out += e;
      }
    }
    if (i >= s.size()) bad("unterminated string");
    ++i;
    return out;
  }

  json value() {
    skip_ws();
    if (i >= s.size()) bad("unexpected end");
    char c = s[i];
    if (c == '{') {
      ++i;
      json obj = json::object();
      skip_ws();
      if (i < s.size() && s[i] == '}') return ++i, obj;
      while (true) {
        skip_ws();
        std::string key;
        if (i < s.size() && (s[i] == '"' || s[i] == '\'')) {
          key = string_lit();
        } else {
          size_t b = i;
          while (i < s.size() && (std::isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '$')) ++i;
          if (b == i) bad("expected a key");
          key = s.substr(b, i - b);
        }
        skip_ws();
        if (i >= s.size() || s[i] != ':') bad("expected ':'");
        ++i;
        obj[key] = value();
        skip_ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == '}') return ++i, obj;
        bad("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++i;
      json arr = json::array();
      skip_ws();
      if (i < s.size() && s[i] == ']') return ++i, arr;
      while (true) {
        arr.push_back(value());
        skip_ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == ']') return ++i, arr;
        bad("expected ',' or ']'");
      }
    }
    if (c == '"' || c == '\'') return string_lit();
    if (starts("!0")) return i += 2, json(true);
    if (starts("!1")) return i += 2, json(false);
    if (starts("true")) return i += 4, json(true);
    if (starts("false")) return i += 5, json(false);
    if (starts("null")) return i += 4, json(nullptr);
    if (starts("void 0")) return i += 6, json(nullptr);
    if (c == '-' || c == '+' || c == '.' || std::isdigit((unsigned char)c)) {
      size_t b = i;
      ++i;
      while (i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
                              ((s[i] == '-' || s[i] == '+') && (s[i - 1] == 'e' || s[i - 1] == 'E'))))
        ++i;
      std::string num = s.substr(b, i - b);
      bool integral = num.find_first_of(".eE") == std::string::npos;
      try {
        if (integral) return json(std::stoll(num));
        return json(std::stod(num));
      } catch (const std::exception&) {
        bad("bad number '" + num + "'");
      }
    }
    bad(std::string("unexpected character '") + c + "'");
  }
};

}  // namespace

json parse_js_literal(const std::string& text, size_t& pos, const std::string& where) {
  JsParser p{text, pos, where};
  return p.value();
}

std::string decode_base64(const std::string& s, size_t begin, size_t end, const std::string& where) {
  static int8_t table[256];
  static bool ready = false;
  if (!ready) {
    std::memset(table, -1, sizeof(table));
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int k = 0; k < 64; ++k) table[(unsigned char)a[k]] = (int8_t)k;
    ready = true;
  }
  std::string out;
  out.reserve((end - begin) / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t k = begin; k < end; ++k) {
    unsigned char c = (unsigned char)s[k];
    if (c == '=') break;
    int v = table[c];
    if (v < 0) fail(where, "bad base64 character at byte " + std::to_string(k));
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += (char)((acc >> bits) & 0xFF);
    }
  }
  return out;
}

// ---------------------------------------------------------------- files

static bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

static std::string dir_of(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The export of a UMD bundle: the text after "exports=" that starts a value we want ('{' or '"').
static size_t find_umd_export(const std::string& text, char opener) {
  size_t pos = 0;
  while ((pos = text.find("exports=", pos)) != std::string::npos) {
    pos += 8;
    if (pos < text.size() && text[pos] == opener) return pos;
  }
  return std::string::npos;
}

static json read_model_json(const std::string& path) {
  std::string text = read_file(path);
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) fail(path, "empty file, not a tfjs model");
  if (text[first] == '{') {
    try {
      json j = json::parse(text);
      require_json_numbers_in_range(j, path);
      return j;
    } catch (const std::exception& e) {
      fail(path, std::string("model JSON is malformed (") + e.what() + ")");
    }
  }
  size_t pos = find_umd_export(text, '{');
  if (pos == std::string::npos) fail(path, "neither JSON nor a JavaScript bundle exporting a tfjs model");
  json j = parse_js_literal(text, pos, path);
  require_json_numbers_in_range(j, path);
  return j;
}

static std::string read_shard(const std::string& dir, const std::string& name) {
  for (const char* suffix : {"", ".bin", ".min.js", ".js"}) {
    std::string p = join_path(dir, name + suffix);
    if (!file_exists(p) || is_dir(p)) continue;
    std::string bytes = read_file(p);
    if (!ends_with(p, ".js")) return bytes;
    size_t pos = find_umd_export(bytes, '"');
    if (pos == std::string::npos) fail(p, "JavaScript shard does not export a base64 string");
    size_t end = bytes.find('"', pos + 1);
    if (end == std::string::npos) fail(p, "unterminated base64 string (truncated file?)");
    return decode_base64(bytes, pos + 1, end, p);
  }
  fail(join_path(dir, name), "weight shard not found (also tried .bin and .min.js)");
}

// ---------------------------------------------------------------- Keras topology

static std::vector<std::string> inbound_names(const json& layer, const std::string& where) {
  std::vector<std::string> out;
  const json& nodes = layer.at("inbound_nodes");
  if (nodes.empty()) return out;
  if (nodes.size() != 1)
    fail(where, "layer '" + layer.value("name", "?") + "' is used more than once (shared layers are not supported)");
  for (auto& in : nodes[0]) {
    if (!in.is_array() || in.empty() || !in[0].is_string())
      fail(where, "layer '" + layer.value("name", "?") + "' has inbound nodes in an unsupported format");
    out.push_back(in[0].get<std::string>());
  }
  return out;
}

static std::pair<int, int> pair_of(const json& j) {
  if (j.is_number()) return {j.get<int>(), j.get<int>()};
  return {j.at(0).get<int>(), j.at(1).get<int>()};
}

// The model file `given` names: the file itself, or a folder's model.json (or model.min.js, model.js).
static std::string model_file_in(const std::string& given) {
  std::string path = given;
  if (is_dir(given)) {
    path = "";
    for (const char* name : {"model.json", "model.min.js", "model.js"})
      if (file_exists(join_path(given, name))) {
        path = join_path(given, name);
        break;
      }
    if (path.empty()) fail(given, "no model.json or model.min.js in this directory");
  }
  return path;
}

// The Keras functional model's layers as a graph of the ops sat runs (convolutions with their batch norm and ReLU
// folded in, pooling, concatenation) up to the first layer it cannot run (the head: listed in net.dropped); the
// names of the layers that were trainable go to `trained`.
static void import_layers(const json& layers, const std::string& path, ImportedNet& net,
                          std::set<std::string>& trained) {
  std::map<std::string, int> consumers;
  for (auto& l : layers) {
    for (auto& in : inbound_names(l, path)) consumers[in]++;
    const json& cfg = l.at("config");
    if (!cfg.contains("trainable") || cfg["trainable"] != false) trained.insert(l.at("name").get<std::string>());
  }

  std::map<std::string, int> node_of;       // Keras layer name -> node index producing its output
  std::map<std::string, std::string> head;  // dropped layer -> its class
  NetGraph& g = net.graph;
  for (auto& l : layers) {
    std::string name = l.at("name").get<std::string>(), kind = l.at("class_name").get<std::string>();
    const json& cfg = l.at("config");
    auto ins = inbound_names(l, path);
    std::vector<int> in_nodes;
    bool from_head = false;
    std::string unsupported_input;  // the first input that could not be imported, as "name (Class)"
    for (auto& in : ins) {
      if (head.count(in)) {
        from_head = true;
        if (unsupported_input.empty()) unsupported_input = "'" + in + "' (" + head[in] + ")";
      } else if (!node_of.count(in))
        fail(path, "layer '" + name + "' reads unknown layer '" + in + "'");
      else
        in_nodes.push_back(node_of[in]);
    }
    auto new_node = [&](const std::string& op) -> NetNode& {
      NetNode n;
      n.name = name;
      n.op = op;
      for (int k : in_nodes) n.inputs.push_back(g.nodes[k].name);
      node_of[name] = (int)g.nodes.size();
      g.nodes.push_back(n);
      return g.nodes.back();
    };
    // The single conv node a BatchNormalization/ReLU can fold into, or -1.
    auto foldable_conv = [&]() -> int {
      if (in_nodes.size() != 1 || consumers[ins[0]] != 1) return -1;
      return g.nodes[in_nodes[0]].op == "conv" ? in_nodes[0] : -1;
    };
    bool spatial = kind == "InputLayer" || kind == "Conv2D" || kind == "BatchNormalization" || kind == "Activation" ||
                   kind == "ReLU" || kind == "MaxPooling2D" || kind == "AveragePooling2D" || kind == "Concatenate";
    if (from_head || !spatial) {
      if (spatial && from_head)
        fail(path, "layer '" + name + "' (" + kind + ") reads layer " + unsupported_input +
                       ", which is not supported (supported: Conv2D, BatchNormalization, ReLU, MaxPooling2D, "
                       "AveragePooling2D, Concatenate, InputLayer; Activation relu)");
      head[name] = kind;
      net.dropped.push_back(name + " (" + kind + ")");
      continue;
    }
    if (kind == "InputLayer") {
      if (!g.nodes.empty()) fail(path, "models with more than one input are not supported");
      auto shape = cfg.at("batch_input_shape");
      if (shape.size() != 4) fail(path, "input '" + name + "' is not an image (batch_input_shape of 4 dims needed)");
      if (shape[3].is_number() && shape[3].get<int>() != 3) fail(path, "input '" + name + "' does not have 3 channels");
      net.input_h = shape[1].is_number() ? shape[1].get<int>() : 0;
      net.input_w = shape[2].is_number() ? shape[2].get<int>() : 0;
      new_node("input");
    } else if (kind == "Conv2D") {
      if (cfg.value("data_format", "channels_last") != "channels_last")
        fail(path, "layer '" + name + "' is channels_first (not supported)");
      if (pair_of(cfg.value("dilation_rate", json::array({1, 1}))) != std::make_pair(1, 1) ||
          cfg.value("groups", 1) != 1)
        fail(path, "layer '" + name + "' uses dilation or groups (not supported)");
      std::string act = cfg.value("activation", "linear");
      if (act != "linear" && act != "relu")
        fail(path, "layer '" + name + "' has activation '" + act + "' (not supported)");
      NetNode& n = new_node("conv");
      std::tie(n.kh, n.kw) = pair_of(cfg.at("kernel_size"));
      std::tie(n.sh, n.sw) = pair_of(cfg.at("strides"));
      n.same = cfg.at("padding").get<std::string>() == "same";
      n.filters = cfg.at("filters").get<int>();
      n.kernel = name + "/kernel";
      if (cfg.value("use_bias", true)) n.bias = name + "/bias";
      n.relu = act == "relu";
    } else if (kind == "BatchNormalization") {
      int c = foldable_conv();
      int axis = cfg.value("axis", -1);
      if (axis != 3 && axis != -1) fail(path, "layer '" + name + "' normalizes axis " + std::to_string(axis));
      if (c < 0 || !g.nodes[c].bn.empty() || g.nodes[c].relu)
        fail(path,
             "layer '" + name + "' does not directly follow a convolution (only conv -> batch norm is supported)");
      if (!cfg.value("center", true)) fail(path, "layer '" + name + "' has center=false (not supported)");
      NetNode& n = g.nodes[c];
      n.bn = name;
      n.bn_scale = cfg.value("scale", true);
      n.bn_epsilon = cfg.value("epsilon", 1e-3f);
      n.name = name;
      node_of[name] = c;
    } else if (kind == "Activation" || kind == "ReLU") {
      std::string act = kind == "ReLU" ? "relu" : cfg.at("activation").get<std::string>();
      if (kind == "ReLU" && (!cfg.value("max_value", json()).is_null() || cfg.value("negative_slope", 0.0) != 0.0 ||
                             cfg.value("threshold", 0.0) != 0.0))
        fail(path, "layer '" + name + "' is a clipped or leaky ReLU (not supported)");
      if (act == "linear") {
        if (in_nodes.size() != 1) fail(path, "layer '" + name + "' needs one input");
        node_of[name] = in_nodes[0];
        continue;
      }
      if (act != "relu") fail(path, "layer '" + name + "' has activation '" + act + "' (only relu is supported)");
      int c = foldable_conv();
      if (c < 0 || g.nodes[c].relu)
        fail(path, "layer '" + name + "' does not directly follow a convolution (only conv -> relu is supported)");
      g.nodes[c].relu = true;
      g.nodes[c].name = name;
      node_of[name] = c;
    } else if (kind == "MaxPooling2D" || kind == "AveragePooling2D") {
      NetNode& n = new_node(kind == "MaxPooling2D" ? "maxpool" : "avgpool");
      std::tie(n.kh, n.kw) = pair_of(cfg.at("pool_size"));
      auto st = cfg.value("strides", json());
      std::tie(n.sh, n.sw) = st.is_null() ? std::make_pair(n.kh, n.kw) : pair_of(st);
      n.same = cfg.value("padding", "valid") == "same";
    } else if (kind == "Concatenate") {
      int axis = cfg.value("axis", -1);
      if (axis != 3 && axis != -1) fail(path, "layer '" + name + "' concatenates along axis " + std::to_string(axis));
      new_node("concat");
    }
  }
  // Folding renamed nodes: point every input at the final name of the node that produces it.
  std::map<std::string, std::string> renamed;
  for (auto& [keras, idx] : node_of) renamed[keras] = g.nodes[idx].name;
  for (auto& n : g.nodes)
    for (auto& in : n.inputs) in = renamed.count(in) ? renamed[in] : in;
  if (g.nodes.empty() || g.nodes[0].op != "input") fail(path, "model has no image input");
  g = NetGraph::from_json(g.to_json());  // validates the result
}

// Which convolutions were trained last time (the conv layer or its batch norm trainable): the first of them, and
// the last cut point before any.
static void find_trained_part(const std::set<std::string>& trained, ImportedNet& net) {
  const NetGraph& g = net.graph;
  auto conv_trained = [&](const NetNode& n) {
    std::string conv_layer = n.kernel.substr(0, n.kernel.rfind("/kernel"));
    return trained.count(conv_layer) > 0 || (!n.bn.empty() && trained.count(n.bn) > 0);
  };
  for (auto& n : g.nodes)
    if (n.op == "conv" && conv_trained(n)) {
      net.first_trained = n.name;
      break;
    }
  for (auto& point : g.cut_points()) {
    bool frozen = true;
    for (auto& n : g.cut(point).nodes) frozen = frozen && (n.op != "conv" || !conv_trained(n));
    if (!frozen) break;
    net.frozen_through = point;
  }
}

// The tensors the graph's convolutions name, read from the weight shards the manifest lists (float32, int32, or
// quantized to uint8, uint16 or float16); a short shard or a missing tensor is an Error naming the file.
static void read_trunk_weights(const json& manifest, const std::string& path, ImportedNet& net) {
  const NetGraph& g = net.graph;
  std::set<std::string> wanted;
  for (auto& n : g.nodes) {
    if (n.op != "conv") continue;
    wanted.insert(n.kernel);
    if (!n.bias.empty()) wanted.insert(n.bias);
    if (!n.bn.empty()) {
      for (const char* s : {"/beta", "/moving_mean", "/moving_variance"}) wanted.insert(n.bn + s);
      if (n.bn_scale) wanted.insert(n.bn + "/gamma");
    }
  }
  const std::string dir = dir_of(path);
  for (auto& group : manifest) {
    std::string data;
    for (auto& p : group.at("paths")) data += read_shard(dir, p.get<std::string>());
    size_t offset = 0;
    for (auto& w : group.at("weights")) {
      std::string wname = w.at("name").get<std::string>();
      auto shape = w.at("shape").get<std::vector<int64_t>>();
      std::string dtype = w.value("dtype", "float32");
      int64_t count = shape_size(shape);
      std::string qdtype;
      float qmin = 0, qscale = 1;
      if (w.contains("quantization")) {
        auto& q = w["quantization"];
        qdtype = q.at("dtype").get<std::string>();
        qmin = q.value("min", 0.f);
        qscale = q.value("scale", 1.f);
      }
      size_t elem = qdtype == "uint8" ? 1 : (qdtype == "uint16" || qdtype == "float16") ? 2 : 4;
      if (!qdtype.empty() && qdtype != "uint8" && qdtype != "uint16" && qdtype != "float16")
        fail(path, "weight '" + wname + "' has quantization dtype '" + qdtype + "' (not supported)");
      if (qdtype.empty() && dtype != "float32" && dtype != "int32")
        fail(path, "weight '" + wname + "' has dtype '" + dtype + "' (not supported)");
      size_t bytes = (size_t)count * elem;
      if (offset + bytes > data.size())
        fail(path, "weight shards end before weight '" + wname + "' (truncated or missing shard)");
      const unsigned char* src = (const unsigned char*)data.data() + offset;
      offset += bytes;
      if (!wanted.count(wname)) continue;
      wanted.erase(wname);
      if (qdtype == "uint8") {
        QuantizedTensor t;
        t.shape = shape;
        t.min = qmin, t.scale = qscale;
        t.data.assign(src, src + bytes);
        net.weights.quantized.emplace(wname, std::move(t));
        continue;
      }
      Param p(wname, shape, false);
      for (int64_t k = 0; k < count; ++k) {
        if (qdtype == "uint16") {
          uint16_t q;
          std::memcpy(&q, src + 2 * k, 2);
          p.value[k] = q * qscale + qmin;
        } else if (qdtype == "float16") {
          uint16_t h;
          std::memcpy(&h, src + 2 * k, 2);
          half_to_floats(&h, &p.value[k], 1);
        } else {
          std::memcpy(&p.value[k], src + 4 * k, 4);
        }
      }
      net.weights.tensors.emplace(wname, std::move(p));
    }
    if (offset != data.size())
      fail(path, "weight shards hold " + std::to_string(data.size()) + " bytes but the manifest describes " +
                     std::to_string(offset));
  }
  if (!wanted.empty()) fail(path, "weight '" + *wanted.begin() + "' is not in the weights manifest");
}

ImportedNet import_tfjs(const std::string& given) {
  const std::string path = model_file_in(given);
  json model = read_model_json(path);
  ImportedNet net;
  try {
    json topo = model.at("modelTopology");
    json mc = topo.contains("model_config") ? topo["model_config"] : topo;
    std::string cls = mc.at("class_name").get<std::string>();
    if (cls != "Model" && cls != "Functional")
      fail(path, "model class '" + cls + "' is not supported (a Keras functional model is needed)");
    std::set<std::string> trained;  // layers with trainable != false
    import_layers(mc.at("config").at("layers"), path, net, trained);
    find_trained_part(trained, net);
    read_trunk_weights(model.at("weightsManifest"), path, net);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(path, std::string("tfjs model is malformed (") + e.what() + ")");
  }
  return net;
}

}  // namespace sat
