// COCO-style caption sets: {"images": [{id, file_name, ...}], "annotations": [{image_id, caption}]}.
// Synthetic sets add per-image "objects" (boxes) and per-caption "grounding" (token -> object).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sat {

struct ObjectBox {
  std::string shape, colour, size;
  float x = 0, y = 0, w = 0, h = 0;  // pixels, top-left origin
};

struct Caption {
  int64_t image_id = 0;
  std::string raw;
  std::vector<std::string> tokens;
  std::vector<std::pair<int, int>> grounding;  // (token index, object index in the image)
};

struct ImageEntry {
  int64_t id = 0;
  std::string file_name;
  int width = 0, height = 0;
  std::vector<ObjectBox> objects;
  std::vector<int> caption_indices;  // into CaptionSet::captions
};

struct CaptionSet {
  std::string json_path;
  std::string image_dir;
  std::vector<ImageEntry> images;
  std::vector<Caption> captions;
  std::map<int64_t, int> image_index;  // id -> position in images

  // image_dir joined with the entry's file name (one that leaves the folder is an Error: image_name_problem).
  std::string image_path(const ImageEntry& e) const;
  // The raw reference captions of images[i].
  std::vector<std::string> references(int i) const;
  // Keeps only images whose file name is listed (one per line); errors name unknown entries.
  CaptionSet subset(const std::vector<std::string>& file_names, const std::string& list_path) const;
};

// Why a caption file's image name is refused, or "" when it is not. Names are paths relative to the image folder:
// an absolute path, or one whose ".." components climb out of the folder ("../../secret/x.jpg", "a/../../x.jpg";
// "a/../x.jpg" stays inside and is allowed), is refused, so that a caption file from elsewhere cannot make `eval` or
// `report` read (and embed in a page) a file outside the folder it was given. Checked on the names alone: a
// symbolic link inside the folder is followed wherever it points (whoever can put one there chose the folder's
// contents; datasets are often folders of links).
std::string image_name_problem(const std::string& name);

// Reads a COCO captions JSON; image_dir holds the files named by "file_name".
CaptionSet load_coco_captions(const std::string& json_path, const std::string& image_dir);
// Flickr8k's captions.csv ("image,caption" rows, quoted fields allowed); image ids are assigned in file order.
CaptionSet load_flickr_captions_csv(const std::string& csv_path, const std::string& image_dir);
// Karpathy's split files (dataset_coco.json, dataset_flickr8k.json, ...): {"images": [{"filename", "filepath"?,
// "split", "sentences": [{"raw", "tokens"}]}]}. split: keep only images of this split ("" = all; "train" also
// takes "restval", as is customary). Image paths are image_dir/filepath/filename.
CaptionSet load_karpathy_split(const std::string& path, const std::string& image_dir, const std::string& split);
// Flickr8k.token.txt / Flickr30k results_20130124.token: "<file>#<n>\t<caption>" per line.
CaptionSet load_flickr_token_txt(const std::string& path, const std::string& image_dir);
// What format a caption file is: "coco", "karpathy", "flickr-token", "flickr-csv" (by content, not only name).
std::string detect_caption_format(const std::string& path);
// Loads any of the formats above (format "" or "auto": detected).
CaptionSet load_captions_any(const std::string& path, const std::string& image_dir, const std::string& format,
                             const std::string& karpathy_split = "");
// The caption texts of a file, tokenized (tokenize_caption), without images: any format load_captions_any reads, or
// coco-caption's reference files ({"<image id>": [["caption", ...]]} or {"<image id>": ["caption", ...]}, such as
// val2014_refs4_codalab.json). Empty captions are left out; a file with none, or of another form, is an Error naming it.
std::vector<std::vector<std::string>> load_caption_texts(const std::string& path);
// COCO captions JSON of a set: {"images": [{id, file_name}], "annotations": [{id, image_id, caption}]}.
std::string coco_captions_json(const CaptionSet& set);
// A data directory holds captions.json and images/ (what `sat synth` writes).
CaptionSet load_data_dir(const std::string& dir);
std::vector<std::string> read_name_list(const std::string& path);

}  // namespace sat
