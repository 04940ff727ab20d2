// The report's data: captions with their attention maps, scores, thumbnails. The page itself is report_html.cpp.
#include "train/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <opencv2/imgproc.hpp>

#include "datasets/stb_codecs.hpp"
#include "datasets/io.hpp"
#include "train/captioning.hpp"
#include "train/metrics.hpp"
#include "train/ptb_tokenizer.hpp"
#include "vision/image.hpp"

namespace sat {

namespace {

// The photo shrunk (or grown) so its long side is `side`, as JPEG bytes.
std::string jpeg_thumbnail(const cv::Mat& bgr, int side, int quality, int& width, int& height) {
  const double scale = (double)side / std::max(bgr.cols, bgr.rows);
  width = std::max(1, (int)std::lround(bgr.cols * scale));
  height = std::max(1, (int)std::lround(bgr.rows * scale));
  cv::Mat small;
  cv::resize(bgr, small, cv::Size(width, height), 0, 0, scale < 1 ? cv::INTER_AREA : cv::INTER_LINEAR);
  return encode_jpeg(small, quality);
}

std::string search_text(const CaptionModel& m, const SearchSettings& search) {
  char norm[32];
  std::snprintf(norm, sizeof norm, "%g", search.length_norm);
  const int beam = search.beam;
  std::string s = beam <= 1 ? "greedy" : "beam " + std::to_string(beam) + ", captions ranked by log p / words^" + norm;
  if (search.no_repeat_ngram > 0) s += "; no " + std::to_string(search.no_repeat_ngram) + "-word phrase repeated";
  if (beam > 1 && search.diversity.groups > 1) {
    char groups[64];
    std::snprintf(groups, sizeof groups, "; in %d diverse groups (penalty %g)", search.diversity.groups,
                  search.diversity.penalty);
    s += groups;
  }
  return s + "; captions up to " + std::to_string(m.max_len) + " words";
}

std::string encoder_text(const EncoderConfig& e) {
  std::string s = e.pretrained() ? "pretrained, cut at " + e.cut : "CNN trained with the decoder";
  if (e.tuned()) s += ", fine-tuned after " + e.tune_from;
  const std::string size = std::to_string(e.input_size);
  return s + "; " + size + "x" + size + " input (the photo squashed to a square) -> " + std::to_string(e.grid_h()) +
         "x" + std::to_string(e.grid_w()) + " grid of " + std::to_string(e.feature_dim()) + " features";
}

std::string decoder_text(const DecoderConfig& d) {
  std::string s = d.attention + " attention";
  if (d.attends()) s += " (" + d.score + " score, " + d.order + " order)";
  if (d.hard()) s += ", glimpse window " + std::to_string(d.hard_window) + "x" + std::to_string(d.hard_window);
  return s + "; embedding " + std::to_string(d.embed_dim) + ", hidden " + std::to_string(d.hidden_dim);
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint32_t)(unsigned char)bytes[i] << 16 | (uint32_t)(unsigned char)bytes[i + 1] << 8 |
                       (unsigned char)bytes[i + 2];
    out += {digits[v >> 18], digits[(v >> 12) & 63], digits[(v >> 6) & 63], digits[v & 63]};
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = (uint32_t)(unsigned char)bytes[i] << 16;
    out += {digits[v >> 18], digits[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint32_t)(unsigned char)bytes[i] << 16 | (uint32_t)(unsigned char)bytes[i + 1] << 8;
    out += {digits[v >> 18], digits[(v >> 12) & 63], digits[(v >> 6) & 63], '='};
  }
  return out;
}

Report build_report(CaptionModel& model, const CaptionSet& set, const FeatureCache* cache, const ReportOptions& opt) {
  const int n = (int)set.images.size();
  for (const ImageEntry& img : set.images)
    if (img.caption_indices.empty()) fail(set.json_path, "image '" + img.file_name + "' has no reference captions");
  if (cache) cache->require(model.encoder_id(), {});  // the encoder only: which photos it lacks is found below

  const SearchSettings search = opt.search ? *opt.search : stored_search(model, 1);
  const DecoderConfig& dc = model.decoder_config;
  Report report;
  report.attention = dc.attention;
  report.grid_h = dc.grid_h;
  report.grid_w = dc.grid_w;
  report.hard_window = dc.hard_window;
  report.settings = {
      {"encoder", encoder_text(model.encoder_config)},
      {"decoder", decoder_text(dc)},
      {"vocabulary", std::to_string(model.vocab.size()) + " words"},
      {"search", search_text(model, search)},
      {"captions from", cache ? "the feature cache " + cache->path() + " (photos read for thumbnails only)"
                              : "the photos, encoded by the model's encoder"}};

  // Each batch holds the encoder's input per readable photo: its planes, or its cached grid.
  const EncoderConfig cached = model.encoder_config.cache_config();
  const int S = model.encoder_config.input_size;
  const size_t per_photo = cache ? (size_t)cached.locations() * cached.feature_dim() : (size_t)3 * S * S;
  const int batch = std::max(1, opt.batch), L = dc.locations();
  std::vector<float> inputs;
  for (int start = 0; start < n; start += batch) {
    const int m = std::min(batch, n - start);
    inputs.resize((size_t)m * per_photo);
    int good = 0;
    for (int k = start; k < start + m; ++k) {
      const ImageEntry& img = set.images[k];
      cv::Mat bgr;
      try {
        bgr = load_image_bgr(set.image_path(img));
      } catch (const Error& e) {
        report.skipped.push_back({img.file_name, e.what()});
        if (opt.on_skip) opt.on_skip(report.skipped.back());
        continue;
      }
      float* input = inputs.data() + (size_t)good * per_photo;
      if (cache) {
        const int record = cache->index_of(img.file_name);
        if (record < 0) fail(cache->path(), "feature cache has no features for image '" + img.file_name + "'");
        cache->read(record, input);
      } else {
        image_to_planes(bgr, S, model.encoder_config.mean, model.encoder_config.stdev, input);
      }
      ReportPhoto photo;
      photo.file_name = img.file_name;
      photo.references = set.references(k);
      photo.jpeg = jpeg_thumbnail(bgr, opt.thumbnail_side, opt.jpeg_quality, photo.width, photo.height);
      report.photos.push_back(std::move(photo));
      ++good;
    }
    if (good > 0) {
      std::vector<CandidateList> lists = cache ? caption_cached(model, inputs.data(), good, search)
                                               : caption_planes(model, inputs.data(), good, search, good);
      for (int j = 0; j < good; ++j) {
        Hypothesis& h = lists[j].candidates[lists[j].chosen].hypothesis;
        ReportPhoto& photo = report.photos[report.photos.size() - good + j];
        photo.words = model.vocab.decode(h.tokens);
        if (dc.attends()) {
          for (auto& alpha : h.alphas)
            if ((int)alpha.size() != L) throw Error("report: an attention map does not match the decoder's grid");
          photo.alphas = std::move(h.alphas);
          photo.locations = std::move(h.locations);
        }
      }
    }
    if (opt.on_progress) opt.on_progress(start + m, n);
  }
  if (report.photos.empty()) {
    if (n == 1) throw Error(report.skipped[0].message);
    fail(set.image_dir, "none of the " + std::to_string(n) + " photos could be read (named above)");
  }

  std::vector<std::string> captions;
  std::vector<std::vector<std::string>> references;
  for (const ReportPhoto& p : report.photos) {
    captions.push_back(join_words(p.words));
    references.push_back(p.references);
  }
  report.scores = score_captions(captions, references);
  // Per photo, tokenized as score_captions does; CIDEr-D's per-image terms average to the corpus score above.
  const size_t count = report.photos.size();
  std::vector<Tokens> hyp_tokens(count);
  std::vector<std::vector<Tokens>> ref_tokens(count);
  for (size_t i = 0; i < count; ++i) {
    hyp_tokens[i] = ptb_tokenize(captions[i]);
    for (const std::string& ref : references[i]) ref_tokens[i].push_back(ptb_tokenize(ref));
  }
  const CiderResult cider = corpus_cider_d(hyp_tokens, ref_tokens);
  for (size_t i = 0; i < count; ++i) {
    ReportPhoto& p = report.photos[i];
    p.cider_d = cider.per_image[i];
    p.bleu_4 =
        corpus_bleu(std::vector<Tokens>(1, hyp_tokens[i]), std::vector<std::vector<Tokens>>(1, ref_tokens[i])).bleu[3];
    p.rouge_l = rouge_l(hyp_tokens[i], ref_tokens[i]);
  }
  return report;
}

}  // namespace sat
