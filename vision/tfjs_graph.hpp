// Reader for TensorFlow.js *graph* models (tfjs-converter's "graph-model" format): the JSON's modelTopology.node
// list of TensorFlow ops and its weightsManifest, whose tensors (the graph's Const nodes) are stored in binary shards
// in manifest order, float32 or quantized (float16, uint8, uint16), int32 as is. The layers-model reader, for Keras
// exports, is vision/tfjs.hpp.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/io.hpp"

namespace sat {

struct GraphConst {
  std::vector<int64_t> shape;
  FloatBuffer values;         // float tensors, widened to float32
  std::vector<int32_t> ints;  // int32 tensors
  bool is_int = false;
};

struct GraphOp {
  std::string name, op;
  std::vector<std::string> inputs;  // node names (":1"-style output suffixes kept)
  nlohmann::json attr = nlohmann::json::object();

  // Attribute readers; a missing or mistyped attribute is an Error naming `where` and the node.
  std::string string_attr(const std::string& key, const std::string& where) const;  // base64-decoded "s"
  std::vector<std::string> string_list_attr(const std::string& key, const std::string& where) const;
  std::vector<int64_t> int_list_attr(const std::string& key, const std::string& where) const;
  bool bool_attr(const std::string& key, bool fallback) const;
};

struct TfjsGraph {
  std::string path;          // the model JSON, for errors
  std::vector<GraphOp> ops;  // the ancestors of the output asked for, inputs before the ops that read them
  std::map<std::string, GraphConst> consts;  // by Const node name
  std::map<std::string, std::string> info;   // generatedBy, convertedBy, format

  const GraphConst& constant(const std::string& name, const std::string& reader) const;  // Error naming both
  bool is_const(const std::string& name) const { return consts.count(name) > 0; }
};

// Reads json_path (and the shards its manifest names, from the same folder) and keeps the ops `output` depends on,
// in an order where every op follows its inputs. A missing file, a short shard, a tensor the graph names that the
// manifest lacks, an input no node defines, a cycle: one Error naming the file (and the node).
TfjsGraph read_tfjs_graph(const std::string& json_path, const std::string& output);

}  // namespace sat
