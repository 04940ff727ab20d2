// sat import-tfjs: a tfjs Layers model -> the project's encoder file.
#include <cstdio>

#include "tools/cli/commands.hpp"
#include "train/extract.hpp"
#include "train/trainer.hpp"
#include "vision/pretrained.hpp"
#include "vision/tfjs.hpp"

namespace sat {

static std::vector<float> parse_triple(const std::string& s, const std::string& flag) {
  std::vector<float> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      v.push_back(std::stof(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error(flag + ": '" + s + "' is not three comma-separated numbers");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (v.size() != 3) throw Error(flag + ": '" + s + "' is not three comma-separated numbers");
  return v;
}

void add_encoder_commands(CLI::App& app) {
  struct Args {
    std::string in, out, mean = "0,0,0", stdev = "1,1,1", source, licence, cut;
    int input_size = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("import-tfjs",
                                 "Import a TensorFlow.js Layers model (model.json + .bin shards, or the UMD .min.js "
                                 "files nsfwjs ships) as a sat encoder file");
  cmd->add_option("model", a->in, "model.json / model.min.js, or the directory holding it")->required();
  cmd->add_option("--out", a->out, "Encoder file to write")->required();
  cmd->add_option("--mean", a->mean, "Per-channel mean subtracted from RGB/255 (e.g. 0.5,0.5,0.5 for Keras' [-1,1])")
      ->capture_default_str();
  cmd->add_option("--std", a->stdev, "Per-channel divisor after the mean")->capture_default_str();
  cmd->add_option("--input-size", a->input_size, "Default input side (0: the model's declared size, else 299)");
  cmd->add_option("--cut", a->cut, "Keep the network only up to this layer (e.g. mixed7); default: the whole trunk");
  cmd->add_option("--source", a->source, "Where the model came from (recorded in the file)");
  cmd->add_option("--licence", a->licence, "Licence of the weights (recorded in the file)");
  cmd->callback([a] {
    ImportedNet imp = import_tfjs(a->in);
    PretrainedNet net;
    net.graph = a->cut.empty() ? imp.graph : imp.graph.cut(a->cut);
    net.weights = select_tensors(net.graph, imp.weights, a->in);
    net.input_size = a->input_size > 0 ? a->input_size : imp.input_h > 0 ? imp.input_h : 299;
    auto m = parse_triple(a->mean, "--mean"), s = parse_triple(a->stdev, "--std");
    for (int i = 0; i < 3; ++i) {
      if (s[i] == 0) throw Error("--std: values must not be zero");
      net.mean[i] = m[i], net.stdev[i] = s[i];
    }
    net.info = {{"source", a->source.empty() ? a->in : a->source},
                {"licence", a->licence},
                {"command", command_line()},
                {"dropped_head_layers", imp.dropped},
                {"frozen_through", imp.frozen_through},
                {"first_trained_layer", imp.first_trained}};
    // Builds the network once: a graph or weight problem surfaces now, not when the file is first used.
    PretrainedEncoder check(net.graph, net.weights, net.input_size, a->in);
    save_pretrained_net(a->out, net);
    size_t convs = 0;
    for (auto& n : net.graph.nodes) convs += n.op == "conv";
    std::printf(
        "imported %zu layers (%zu convolutions with batch norm and ReLU folded in), %zu uint8 + %zu float32 "
        "tensors; dropped the head: %zu layers\n",
        net.graph.nodes.size(), convs, net.weights.quantized.size(), net.weights.tensors.size(), imp.dropped.size());
    std::printf("cut points: ");
    for (auto& c : net.graph.cut_points()) std::printf("%s ", c.c_str());
    if (!imp.first_trained.empty())
      std::printf(
          "\nwhen the source model was last trained, layers from %s on were trained and every convolution "
          "up to %s was frozen (still the weights it started from)",
          imp.first_trained.c_str(), imp.frozen_through.empty() ? "(none)" : imp.frozen_through.c_str());
    std::printf("\nat %dx%d the last layer gives %dx%dx%d; wrote %s\n", net.input_size, net.input_size, check.grid_h(),
                check.grid_w(), check.channels(), a->out.c_str());
  });

  struct ExArgs {
    std::string data, image_dir, images, out, encoder, cut = "mixed5", model;
    int size = 0;
    bool raw = false;
    float objects = 0.f;
    std::string objects_as = "maps";
    ExtractOptions opt;
  };
  auto x = std::make_shared<ExArgs>();
  auto* ex = app.add_subcommand("extract",
                                "Encode a dataset's images once into a feature cache (resumable) that "
                                "training and evaluation read instead of images");
  ex->add_option("--data", x->data, "Data dir, COCO captions JSON or captions.csv")->required();
  ex->add_option("--image-dir", x->image_dir, "Image folder when --data is a file (default: next to it)");
  ex->add_option("--images", x->images, "List of image file names to encode, one per line (default: all)");
  ex->add_option("--out", x->out, "Feature cache to write")->required();
  ex->add_option("--encoder", x->encoder,
                 "Encoder file: a sat encoder or a ResNet v2 safetensors (default: the bundled InceptionV3)");
  ex->add_option("--cut", x->cut,
                 "Layer that gives the grid (mixed0..mixed7 in the bundled file; ResNet v2: block1..block3, "
                 "block3/unit_22, ...)")
      ->capture_default_str();
  ex->add_option("--size", x->size, "Input side (0: the encoder file's default, 299)")->capture_default_str();
  ex->add_option("--model", x->model, "Use this caption model's encoder instead of --encoder/--cut/--size (a fine-tuned one's frozen part: the cache it reads)");
  ex->add_flag("--raw", x->raw,
               "The cut layer's output as it is, not normalized for attention by the next unit's "
               "pre-activation (ResNet v2): the cache sat train --tune-from CUT reads");
  ex->add_option("--objects", x->objects,
                 "Join the COCO detector's class maps (sat detect) to the grid, times this (0: no); the cache then "
                 "feeds models trained with sat train --objects (with --raw: a fine-tuned one's, the maps pooled onto "
                 "the cut layer's grid)")
      ->check(CLI::Range(0.0, 1000.0));
  ex->add_option("--objects-as", x->objects_as,
                 "With --objects: maps (each class's heat pooled onto the grid), tags (each class's peak over the "
                 "photo, the same at every location), both, or tags+trunk (the tags, then the detector's trunk "
                 "output averaged over the photo)")
      ->check(CLI::IsMember({"maps", "tags", "both", "tags+trunk"}))
      ->capture_default_str();
  ex->add_option("--batch", x->opt.batch, "Images per encoder call")->check(CLI::Range(1, 256))->capture_default_str();
  ex->add_flag("--skip-bad", x->opt.skip_bad,
               "Leave out images that cannot be read (each named on stderr, all listed "
               "in the cache header) instead of stopping at the first");
  ex->add_flag("--mirror", x->opt.mirror,
               "Encode each photo mirrored left to right: the augmentation cache that "
               "sat train --mirror-features reads (its header says so)");
  ex->add_option("--dtype", x->opt.dtype, "Stored precision: f16 (half the size) or f32")->capture_default_str();
  ex->callback([x] {
    std::unique_ptr<CaptionModel> model;
    if (x->model.empty()) {
      model = pretrained_encoder_model(x->encoder.empty() ? default_encoder_path() : x->encoder, x->cut, x->size,
                                       x->raw, false, x->objects, x->objects_as);
      // auto unless told (bf16 where it is the faster arithmetic; sat --encoder-precision; the cache's header
      // records what ran): a model trained from the encoder stores the same choice
      model->build_encoder();
    } else {
      model = CaptionModel::load(x->model);
    }
    CaptionSet set = load_caption_set(x->data, x->image_dir, x->images);
    std::vector<std::string> paths, names;
    for (auto& img : set.images) paths.push_back(set.image_path(img)), names.push_back(img.file_name);
    extract_features(*model, paths, names, x->out, x->opt);
  });
}

}  // namespace sat
