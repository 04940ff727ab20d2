// sat data convert: any caption format people have -> COCO-style captions JSON.
#include <cstdio>

#include "datasets/coco.hpp"
#include "datasets/io.hpp"
#include "tools/cli/commands.hpp"

namespace sat {

void add_data_commands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Caption dataset tools");
  data->require_subcommand(1);
  struct Args {
    std::string in, out, format = "auto", split, images;
  };
  auto a = std::make_shared<Args>();
  auto* conv =
      data->add_subcommand("convert",
                           "Write COCO captions JSON, Karpathy split files (dataset_*.json), Flickr8k.token.txt or "
                           "captions.csv as COCO-style captions JSON (what sat train/eval read fastest)");
  conv->add_option("input", a->in, "Caption file")->required();
  conv->add_option("--out", a->out, "COCO-style JSON to write")->required();
  conv->add_option("--format", a->format, "auto, coco, karpathy, flickr-token or flickr-csv")->capture_default_str();
  conv->add_option("--split", a->split, "Karpathy files: keep one split (train takes restval too, val, test)");
  conv->add_option("--images", a->images, "Keep only the images listed in this file (one file name per line)");
  conv->callback([a] {
    CaptionSet set = load_captions_any(a->in, "", a->format, a->split);
    if (!a->images.empty()) set = set.subset(read_name_list(a->images), a->images);
    write_file_atomic(a->out, coco_captions_json(set));
    std::printf("%s: %zu images, %zu captions -> %s\n", a->in.c_str(), set.images.size(), set.captions.size(),
                a->out.c_str());
  });
}

}  // namespace sat
