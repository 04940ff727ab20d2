#include "datasets/coco.hpp"

#include "datasets/json_checks.hpp"
#include <nlohmann/json.hpp>
#include <algorithm>
#include <set>
#include <sstream>
#include <string_view>

#include "datasets/io.hpp"
#include "datasets/vocab.hpp"

namespace sat {

using nlohmann::json;

std::string image_name_problem(const std::string& name) {
  if (name.empty()) return "is an empty file name";
  if (name.find('\0') != std::string::npos) return "holds a NUL byte";
  if (name[0] == '/') return "is an absolute path (image names are relative to the image folder)";
  int depth = 0;
  for (size_t at = 0; at <= name.size();) {
    const size_t slash = std::min(name.find('/', at), name.size());
    const std::string_view part = std::string_view(name).substr(at, slash - at);
    if (part == "..") {
      if (--depth < 0) return "leaves the image folder";
    } else if (!part.empty() && part != ".") {
      ++depth;
    }
    at = slash + 1;
  }
  return "";
}

// A caption file's image name, refused with where it is when it is not one (image_name_problem).
static void check_image_name(const std::string& file, const std::string& where, const std::string& name) {
  const std::string problem = image_name_problem(name);
  if (!problem.empty()) fail(file, (where.empty() ? "" : where + ": ") + "image '" + name + "' " + problem);
}

std::string CaptionSet::image_path(const ImageEntry& e) const {
  check_image_name(image_dir, "", e.file_name);  // a set built by code rather than by a loader
  return join_path(image_dir, e.file_name);
}

std::vector<std::string> CaptionSet::references(int i) const {
  std::vector<std::string> refs;
  for (int ci : images[i].caption_indices) refs.push_back(captions[ci].raw);
  return refs;
}

CaptionSet CaptionSet::subset(const std::vector<std::string>& names, const std::string& list_path) const {
  std::map<std::string, int> by_name;
  for (int i = 0; i < (int)images.size(); ++i) by_name[images[i].file_name] = i;
  CaptionSet out;
  out.json_path = json_path;
  out.image_dir = image_dir;
  std::set<std::string> seen;
  for (size_t line = 0; line < names.size(); ++line) {
    auto it = by_name.find(names[line]);
    if (it == by_name.end())
      fail(list_path, "line " + std::to_string(line + 1) + ": image '" + names[line] + "' is not in " + json_path);
    if (!seen.insert(names[line]).second) continue;
    ImageEntry e = images[it->second];
    e.caption_indices.clear();
    for (int ci : images[it->second].caption_indices) {
      e.caption_indices.push_back((int)out.captions.size());
      out.captions.push_back(captions[ci]);
    }
    out.image_index[e.id] = (int)out.images.size();
    out.images.push_back(std::move(e));
  }
  return out;
}

static std::string where(const std::string& what, size_t i) {
  return what + "[" + std::to_string(i) + "]";
}

CaptionSet load_coco_captions(const std::string& json_path, const std::string& image_dir) {
  json j;
  try {
    j = json::parse(read_file(json_path));
  } catch (const json::exception& e) {
    fail(json_path, std::string("malformed JSON (") + e.what() + ")");
  }
  require_json_numbers_in_range(j, json_path);
  if (!j.is_object() || !j.contains("images") || !j.contains("annotations") || !j["images"].is_array() ||
      !j["annotations"].is_array())
    fail(json_path, "not a COCO captions file (needs arrays \"images\" and \"annotations\")");
  CaptionSet set;
  set.json_path = json_path;
  set.image_dir = image_dir;
  auto& imgs = j["images"];
  for (size_t i = 0; i < imgs.size(); ++i) {
    auto& o = imgs[i];
    ImageEntry e;
    try {
      e.id = o.at("id").get<int64_t>();
      e.file_name = o.at("file_name").get<std::string>();
      e.width = o.value("width", 0);
      e.height = o.value("height", 0);
      if (o.contains("objects"))
        for (auto& b : o["objects"]) {
          ObjectBox box;
          box.shape = b.at("shape").get<std::string>();
          box.colour = b.at("colour").get<std::string>();
          box.size = b.at("size").get<std::string>();
          auto bb = b.at("bbox").get<std::vector<float>>();
          if (bb.size() != 4) throw std::runtime_error("bbox");
          box.x = bb[0], box.y = bb[1], box.w = bb[2], box.h = bb[3];
          e.objects.push_back(box);
        }
    } catch (const std::exception&) {
      fail(json_path, where("images", i) + " is malformed (needs integer id and string file_name)");
    }
    check_image_name(json_path, where("images", i), e.file_name);
    if (set.image_index.count(e.id)) fail(json_path, where("images", i) + " repeats image id " + std::to_string(e.id));
    set.image_index[e.id] = (int)set.images.size();
    set.images.push_back(std::move(e));
  }
  auto& anns = j["annotations"];
  for (size_t i = 0; i < anns.size(); ++i) {
    auto& o = anns[i];
    Caption c;
    try {
      c.image_id = o.at("image_id").get<int64_t>();
      c.raw = o.at("caption").get<std::string>();
      if (o.contains("grounding"))
        for (auto& g : o["grounding"]) c.grounding.push_back({g.at("token").get<int>(), g.at("object").get<int>()});
    } catch (const std::exception&) {
      fail(json_path, where("annotations", i) + " is malformed (needs integer image_id and string caption)");
    }
    auto it = set.image_index.find(c.image_id);
    if (it == set.image_index.end())
      fail(json_path, where("annotations", i) + " names image_id " + std::to_string(c.image_id) + " not in images");
    c.tokens = tokenize_caption(c.raw);
    auto& img = set.images[it->second];
    for (auto& [tok, obj] : c.grounding)
      if (tok < 0 || tok >= (int)c.tokens.size() || obj < 0 || obj >= (int)img.objects.size())
        fail(json_path, where("annotations", i) + " has a grounding entry out of range");
    img.caption_indices.push_back((int)set.captions.size());
    set.captions.push_back(std::move(c));
  }
  return set;
}

CaptionSet load_data_dir(const std::string& dir) {
  std::string json_path = join_path(dir, "captions.json");
  std::string images = join_path(dir, "images");
  if (!file_exists(json_path) && file_exists(join_path(dir, "captions.csv")))
    return load_flickr_captions_csv(join_path(dir, "captions.csv"), file_exists(images) ? images : dir);
  if (!file_exists(json_path)) fail(dir, "no captions.json (or captions.csv) in this data directory");
  return load_coco_captions(json_path, file_exists(images) ? images : dir);
}

std::vector<std::string> read_name_list(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t s = line.find_first_not_of(" \t");
    if (s == std::string::npos) continue;
    names.push_back(line.substr(s));
  }
  if (names.empty()) fail(path, "split list is empty");
  return names;
}

namespace {
// One CSV record: fields split on commas, double-quoted fields may hold commas and "" for a quote.
std::vector<std::string> parse_csv_line(const std::string& line, const std::string& path, size_t lineno) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"')
        fields.back() += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        fields.back() += c;
    } else if (c == '"' && fields.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  if (quoted) fail(path, "line " + std::to_string(lineno) + ": unterminated quoted field");
  return fields;
}
}  // namespace

static ImageEntry& image_named(CaptionSet& set, std::map<std::string, int>& by_name, const std::string& name) {
  auto it = by_name.find(name);
  if (it == by_name.end()) {
    ImageEntry e;
    e.id = (int64_t)set.images.size() + 1;
    e.file_name = name;
    it = by_name.emplace(name, (int)set.images.size()).first;
    set.image_index[e.id] = (int)set.images.size();
    set.images.push_back(e);
  }
  return set.images[it->second];
}

static void add_caption(CaptionSet& set, ImageEntry& img, const std::string& raw, std::vector<std::string> tokens) {
  Caption c;
  c.image_id = img.id;
  c.raw = raw;
  c.tokens = tokens.empty() ? tokenize_caption(raw) : std::move(tokens);
  img.caption_indices.push_back((int)set.captions.size());
  set.captions.push_back(std::move(c));
}

// Calls fn(line, line_number) for every non-blank line of a text file (CR of CRLF endings removed).
template <typename Fn>
static void for_each_line(const std::string& path, Fn fn) {
  std::istringstream in(read_file(path));
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    fn(line, lineno);
  }
}

CaptionSet load_flickr_captions_csv(const std::string& path, const std::string& image_dir) {
  CaptionSet set;
  set.json_path = path;
  set.image_dir = image_dir;
  std::map<std::string, int> by_name;
  for_each_line(path, [&](const std::string& line, size_t lineno) {
    auto f = parse_csv_line(line, path, lineno);
    if (lineno == 1 && f.size() == 2 && f[0] == "image" && f[1] == "caption") return;  // header
    if (f.size() < 2 || f[0].empty()) fail(path, "line " + std::to_string(lineno) + ": expected \"image,caption\"");
    check_image_name(path, "line " + std::to_string(lineno), f[0]);
    std::string caption = f[1];
    for (size_t k = 2; k < f.size(); ++k) caption += "," + f[k];  // unquoted commas belong to the caption
    add_caption(set, image_named(set, by_name, f[0]), caption, {});
  });
  if (set.captions.empty()) fail(path, "no captions in this file");
  return set;
}

CaptionSet load_karpathy_split(const std::string& path, const std::string& image_dir, const std::string& split) {
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail(path, std::string("malformed JSON (") + e.what() + ")");
  }
  require_json_numbers_in_range(j, path);
  if (!j.is_object() || !j.contains("images") || !j["images"].is_array())
    fail(path, "not a Karpathy split file (needs an array \"images\")");
  CaptionSet set;
  set.json_path = path;
  set.image_dir = image_dir;
  std::map<std::string, int> by_name;
  const json& images = j["images"];
  for (size_t i = 0; i < images.size(); ++i) {
    const json& im = images[i];
    try {
      std::string sp = im.at("split").get<std::string>();
      if (!split.empty() && sp != split && !(split == "train" && sp == "restval")) continue;
      std::string name = im.at("filename").get<std::string>();
      if (im.contains("filepath") && im["filepath"].is_string() && !im["filepath"].get<std::string>().empty())
        name = join_path(im["filepath"].get<std::string>(), name);
      if (name.empty()) fail(path, where("images", i) + " has an empty filename");
      check_image_name(path, where("images", i), name);
      if (by_name.count(name)) fail(path, where("images", i) + ": image '" + name + "' appears twice");
      ImageEntry& img = image_named(set, by_name, name);
      if (im.contains("cocoid") && im["cocoid"].is_number_integer()) {
        set.image_index.erase(img.id);
        img.id = im["cocoid"].get<int64_t>();
        if (set.image_index.count(img.id))
          fail(path, where("images", i) + ": cocoid " + std::to_string(img.id) + " appears twice");
        set.image_index[img.id] = (int)set.images.size() - 1;
      }
      const json& sents = im.at("sentences");
      if (!sents.is_array() || sents.empty()) fail(path, where("images", i) + " has no sentences");
      for (size_t k = 0; k < sents.size(); ++k) {
        const json& st = sents[k];
        std::vector<std::string> tokens;
        if (st.contains("tokens")) tokens = st["tokens"].get<std::vector<std::string>>();
        std::string raw = st.contains("raw") ? st["raw"].get<std::string>() : "";
        if (raw.empty()) {
          for (auto& t : tokens) raw += (raw.empty() ? "" : " ") + t;
        }
        if (raw.empty()) fail(path, where("images", i) + where(".sentences", k) + " is empty");
        add_caption(set, img, raw, tokens);
        set.captions.back().image_id = img.id;
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(path, where("images", i) + " is malformed (" + e.what() + ")");
    }
  }
  if (set.images.empty()) fail(path, split.empty() ? "no images" : "no images in split '" + split + "'");
  return set;
}

CaptionSet load_flickr_token_txt(const std::string& path, const std::string& image_dir) {
  CaptionSet set;
  set.json_path = path;
  set.image_dir = image_dir;
  std::map<std::string, int> by_name;
  for_each_line(path, [&](const std::string& line, size_t lineno) {
    size_t tab = line.find('\t'), hash = line.find('#');
    if (tab == std::string::npos || hash == std::string::npos || hash > tab || hash == 0)
      fail(path, "line " + std::to_string(lineno) + ": expected \"<image>#<n><TAB><caption>\"");
    std::string name = line.substr(0, hash), caption = line.substr(tab + 1);
    check_image_name(path, "line " + std::to_string(lineno), name);
    if (caption.find_first_not_of(" \t") == std::string::npos)
      fail(path, "line " + std::to_string(lineno) + ": empty caption");
    add_caption(set, image_named(set, by_name, name), caption, {});
  });
  if (set.captions.empty()) fail(path, "no captions in this file");
  return set;
}

std::string detect_caption_format(const std::string& path) {
  std::string bytes = read_file(path);
  size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) fail(path, "empty file, not a caption file");
  if (bytes[first] == '{') {
    json j;
    try {
      j = json::parse(bytes);
    } catch (const json::exception& e) {
      fail(path, std::string("malformed JSON (") + e.what() + ")");
    }
    if (j.contains("annotations")) return "coco";
    if (j.contains("images") && j["images"].is_array() && !j["images"].empty() && j["images"][0].contains("sentences"))
      return "karpathy";
    fail(path,
         "JSON is neither COCO captions (\"annotations\") nor a Karpathy split file (\"images\" with \"sentences\")");
  }
  std::string line1 = bytes.substr(first, bytes.find('\n', first) - first);
  if (line1.find('\t') != std::string::npos && line1.find('#') < line1.find('\t')) return "flickr-token";
  if (line1.find(',') != std::string::npos) return "flickr-csv";
  fail(path, "unknown caption file format (expected COCO/Karpathy JSON, Flickr8k.token.txt or captions.csv)");
}

CaptionSet load_captions_any(const std::string& path, const std::string& image_dir, const std::string& format,
                             const std::string& karpathy_split) {
  std::string f = format.empty() || format == "auto" ? detect_caption_format(path) : format;
  if (f == "coco") return load_coco_captions(path, image_dir);
  if (f == "karpathy") return load_karpathy_split(path, image_dir, karpathy_split);
  if (f == "flickr-token") return load_flickr_token_txt(path, image_dir);
  if (f == "flickr-csv") return load_flickr_captions_csv(path, image_dir);
  throw Error("unknown caption format '" + f + "' (coco, karpathy, flickr-token, flickr-csv)");
}

namespace {

// coco-caption's reference form: each value an array of caption strings, or an array of such arrays.
bool is_reference_texts(const json& j) {
  if (!j.is_object() || j.empty() || j.contains("annotations") || j.contains("images")) return false;
  const json& first = j.begin().value();
  return first.is_array();
}

void add_reference_texts(const json& value, const std::string& key, const std::string& path,
                         std::vector<std::vector<std::string>>& out) {
  if (!value.is_array()) fail(path, "\"" + key + "\" is not an array of captions");
  auto add = [&](const json& text) {
    if (!text.is_string()) fail(path, "\"" + key + "\" holds a caption that is not a string");
    std::vector<std::string> tokens = tokenize_caption(text.get<std::string>());
    if (!tokens.empty()) out.push_back(std::move(tokens));
  };
  for (const json& v : value) {
    if (v.is_array())
      for (const json& text : v) add(text);
    else
      add(v);
  }
}

}  // namespace

std::vector<std::vector<std::string>> load_caption_texts(const std::string& path) {
  std::vector<std::vector<std::string>> out;
  const std::string bytes = read_file(path);
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  json j;
  if (first != std::string::npos && bytes[first] == '{') {
    try {
      j = json::parse(bytes);
    } catch (const json::exception& e) {
      fail(path, std::string("malformed JSON (") + e.what() + ")");
    }
  }
  if (is_reference_texts(j)) {
    for (auto it = j.begin(); it != j.end(); ++it) add_reference_texts(it.value(), it.key(), path, out);
  } else {
    const CaptionSet set = load_captions_any(path, "", "auto");
    for (const Caption& c : set.captions)
      if (!c.tokens.empty()) out.push_back(c.tokens);
  }
  if (out.empty()) fail(path, "holds no captions");
  return out;
}

std::string coco_captions_json(const CaptionSet& set) {
  json images = json::array(), anns = json::array();
  int64_t ann_id = 1;
  for (auto& img : set.images) {
    json e = {{"id", img.id}, {"file_name", img.file_name}};
    if (img.width > 0) e["width"] = img.width, e["height"] = img.height;
    images.push_back(e);
    for (int ci : img.caption_indices)
      anns.push_back({{"id", ann_id++}, {"image_id", img.id}, {"caption", set.captions[ci].raw}});
  }
  return json{{"images", images}, {"annotations", anns}}.dump(1) + "\n";
}

}  // namespace sat
