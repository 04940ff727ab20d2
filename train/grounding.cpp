#include "train/grounding.hpp"

#include <algorithm>

namespace sat {

bool cell_overlaps_box(int cell, int gh, int gw, int W, int H, const ObjectBox& box) {
  int r = cell / gw, c = cell % gw;
  double x0 = (double)c * W / gw, x1 = (double)(c + 1) * W / gw;
  double y0 = (double)r * H / gh, y1 = (double)(r + 1) * H / gh;
  return x0 < box.x + box.w && box.x < x1 && y0 < box.y + box.h && box.y < y1;
}

GroundingResult eval_grounding(CaptionModel& model, const CaptionSet& set, int batch_images) {
  GroundingResult res;
  const int gh = model.encoder_config.grid_h(), gw = model.encoder_config.grid_w();
  bool any = false;
  for (auto& c : set.captions) any |= !c.grounding.empty();
  if (!any) fail(set.json_path, "has no grounding annotations (only `sat synth` data has them)");
  for (size_t s = 0; s < set.images.size(); s += batch_images) {
    size_t e = std::min(set.images.size(), s + batch_images);
    std::vector<std::string> paths;
    for (size_t i = s; i < e; ++i) paths.push_back(set.image_path(set.images[i]));
    auto planes = model.load_planes(paths);
    const Mat grid = model.decoder_grid(model.encode(planes, (int)paths.size()), (int)paths.size());
    std::vector<std::vector<int>> caps;
    std::vector<const Caption*> which;
    std::vector<int> image_of;
    for (size_t i = s; i < e; ++i)
      for (int ci : set.images[i].caption_indices) {
        const Caption& c = set.captions[ci];
        if (c.grounding.empty()) continue;
        caps.push_back(model.vocab.encode(c.tokens));
        which.push_back(&c);
        image_of.push_back((int)i);
      }
    if (caps.empty()) continue;
    const int B = (int)caps.size();
    CaptionBatch cb = CaptionBatch::from_ids(caps, model.max_len);
    for (int b = 0; b < B; ++b) cb.grid.push_back(image_of[b] - (int)s);  // the captions of an image share its grid
    // The attention the caption gets (an ensemble's: the mean of its members')
    DecoderCache cache;
    model.decoder->forward(grid, cb, 0.f, false, nullptr, cache);
    for (auto& member : model.more_members) {
      DecoderCache theirs;
      member->forward(grid, cb, 0.f, false, nullptr, theirs);
      for (size_t t = 0; t < cache.alpha.size(); ++t) cache.alpha[t] += theirs.alpha[t];
    }
    for (int b = 0; b < B; ++b) {
      const ImageEntry& img = set.images[image_of[b]];
      int W = img.width > 0 ? img.width : model.encoder_config.input_size;
      int H = img.height > 0 ? img.height : model.encoder_config.input_size;
      for (auto& [tok, obj] : which[b]->grounding) {
        if (tok >= cb.T) continue;  // beyond the model's caption length
        int cell;
        cache.alpha[tok].row(b).maxCoeff(&cell);
        bool hit = cell_overlaps_box(cell, gh, gw, W, H, img.objects[obj]);
        res.words++;
        res.hits += hit;
        auto& w = res.by_word[which[b]->tokens[tok]];
        w.first += hit;
        w.second++;
      }
    }
  }
  return res;
}

}  // namespace sat
