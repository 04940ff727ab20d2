#include "datasets/synth.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "datasets/stb_codecs.hpp"
#include "datasets/io.hpp"
#include "datasets/vocab.hpp"

namespace sat {

const std::vector<std::string> kSynthShapes = {"circle", "square", "triangle", "star", "cross"};
const std::vector<std::string> kSynthColours = {"red", "green", "blue", "yellow", "purple", "orange"};
const std::vector<std::string> kSynthSizes = {"small", "large"};

namespace {

const int kColourRGB[6][3] = {{215, 40, 40},  {40, 170, 60},  {40, 80, 215},
                              {235, 215, 40}, {140, 60, 190}, {245, 140, 30}};

struct Placed {
  int shape, colour, size;
  float cx, cy, extent;
};

void draw_background(cv::Mat& img, Rng& rng) {
  const int n = img.rows;
  double base = rng.uniform(95, 155);
  double tint[3] = {rng.uniform(-8, 8), rng.uniform(-8, 8), rng.uniform(-8, 8)};
  struct Wave {
    double fx, fy, phase, amp;
  };
  Wave waves[3];
  for (auto& w : waves) {
    double theta = rng.uniform(0, 3.14159265), freq = rng.uniform(0.03, 0.25);
    w = {freq * std::cos(theta), freq * std::sin(theta), rng.uniform(0, 6.2832), rng.uniform(4, 14)};
  }
  for (int y = 0; y < n; ++y)
    for (int x = 0; x < n; ++x) {
      double v = base;
      for (auto& w : waves) v += w.amp * std::sin(w.fx * x + w.fy * y + w.phase);
      double noise = 9.0 * rng.normal();
      auto* px = img.ptr<cv::Vec3b>(y) + x;
      for (int c = 0; c < 3; ++c) (*px)[c] = cv::saturate_cast<uchar>(v + tint[c] + noise);
    }
}

void draw_shape(cv::Mat& img, const Placed& p, Rng& rng) {
  const int* rgb = kColourRGB[p.colour];
  double shade = rng.uniform(-18, 18);
  cv::Scalar bgr(rgb[2] + shade, rgb[1] + shade, rgb[0] + shade);
  const int S = 16;  // fixed-point sub-pixel bits for smooth edges
  auto pt = [&](double x, double y) { return cv::Point((int)std::lround(x * S), (int)std::lround(y * S)); };
  double r = p.extent / 2, cx = p.cx, cy = p.cy;
  std::vector<cv::Point> poly;
  switch (p.shape) {
    case 0:
      cv::circle(img, pt(cx, cy), (int)std::lround(r * S), bgr, cv::FILLED, cv::LINE_AA, 4);
      return;
    case 1: {
      double h = r * 0.88;
      poly = {pt(cx - h, cy - h), pt(cx + h, cy - h), pt(cx + h, cy + h), pt(cx - h, cy + h)};
      break;
    }
    case 2:
      poly = {pt(cx, cy - r), pt(cx + r, cy + r * 0.8), pt(cx - r, cy + r * 0.8)};
      break;
    case 3:
      for (int k = 0; k < 10; ++k) {
        double a = -1.5707963 + k * 3.14159265 / 5, rr = (k % 2) ? r * 0.42 : r;
        poly.push_back(pt(cx + rr * std::cos(a), cy + rr * std::sin(a)));
      }
      break;
    default: {
      double t = r * 0.34;
      poly = {pt(cx - t, cy - r), pt(cx + t, cy - r), pt(cx + t, cy - t), pt(cx + r, cy - t),
              pt(cx + r, cy + t), pt(cx + t, cy + t), pt(cx + t, cy + r), pt(cx - t, cy + r),
              pt(cx - t, cy + t), pt(cx - r, cy + t), pt(cx - r, cy - t), pt(cx - t, cy - t)};
    }
  }
  cv::fillPoly(img, std::vector<std::vector<cv::Point>>{poly}, bgr, cv::LINE_AA, 4);
}

// The relation of a to b ("a is above b"), from the dominant axis of their displacement.
std::vector<std::string> relation(const Placed& a, const Placed& b) {
  double dx = b.cx - a.cx, dy = b.cy - a.cy;
  if (std::fabs(dy) > std::fabs(dx)) return {dy > 0 ? "above" : "below"};
  return dx > 0 ? std::vector<std::string>{"to", "the", "left", "of"}
                : std::vector<std::string>{"to", "the", "right", "of"};
}

bool unambiguous(const Placed& a, const Placed& b) {
  double dx = std::fabs(b.cx - a.cx), dy = std::fabs(b.cy - a.cy);
  return std::max(dx, dy) >= 1.6 * std::min(dx, dy) && dx >= 10;  // clear axis, clear left-to-right order
}

std::string region(const Placed& p, int n) {
  const char* rows[3] = {"top", "", "bottom"};
  const char* cols[3] = {"left", "", "right"};
  int r = std::min(2, (int)(p.cy * 3 / n)), c = std::min(2, (int)(p.cx * 3 / n));
  if (r == 1 && c == 1) return "in the middle";
  if (r == 1) return std::string("on the ") + cols[c];
  if (c == 1) return std::string("at the ") + rows[r];
  return std::string("in the ") + rows[r] + " " + cols[c] + " corner";
}

// A caption assembled from pieces; words of a piece with object >= 0 name that object.
struct Builder {
  std::vector<std::pair<std::string, int>> pieces;
  Builder& w(const std::string& s) {
    pieces.push_back({s, -1});
    return *this;
  }
  Builder& ws(const std::vector<std::string>& v) {
    for (auto& s : v) w(s);
    return *this;
  }
  Builder& obj(const Placed& p, int k) {
    pieces.push_back({kSynthSizes[p.size], k});
    pieces.push_back({kSynthColours[p.colour], k});
    pieces.push_back({kSynthShapes[p.shape], k});
    return *this;
  }
  Caption done() const {
    Caption c;
    for (auto& [s, k] : pieces) {
      if (!c.raw.empty() && s != ",") c.raw += ' ';  // "a, b" but "shapes : a"
      c.raw += s;
      for (auto& t : tokenize_caption(s)) {
        if (k >= 0) c.grounding.push_back({(int)c.tokens.size(), k});
        c.tokens.push_back(t);
      }
    }
    return c;
  }
};

std::vector<Caption> make_captions(const std::vector<Placed>& o, int n) {
  std::vector<Builder> b(5);
  if (o.size() == 1) {
    b[0].w("a").obj(o[0], 0);
    b[1].w("a").obj(o[0], 0).w(region(o[0], n));
    b[2].ws({"there", "is", "one", "shape", ":", "a"}).obj(o[0], 0);
    b[3].w("a").obj(o[0], 0).ws({"on", "a", "textured", "background"});
    b[4].ws({"a", "picture", "of", "a"}).obj(o[0], 0);
  } else if (o.size() == 2) {
    b[0].w("a").obj(o[0], 0).ws(relation(o[0], o[1])).w("a").obj(o[1], 1);
    b[1].w("a").obj(o[0], 0).ws({"and", "a"}).obj(o[1], 1);
    b[2].ws({"there", "are", "two", "shapes", ":", "a"}).obj(o[0], 0).ws({"and", "a"}).obj(o[1], 1);
    b[3].w("a").obj(o[1], 1).ws(relation(o[1], o[0])).w("a").obj(o[0], 0);
    b[4].w("a").obj(o[0], 0).w("is").ws(relation(o[0], o[1])).w("a").obj(o[1], 1);
  } else {
    b[0].w("a").obj(o[0], 0).ws(relation(o[0], o[1])).w("a").obj(o[1], 1).ws({"and", "a"}).obj(o[2], 2);
    b[1].w("a").obj(o[0], 0).ws({"and", "a"}).obj(o[1], 1).ws({"and", "a"}).obj(o[2], 2);
    b[2].ws({"there", "are", "three", "shapes", ":", "a"})
        .obj(o[0], 0)
        .ws({",", "a"})
        .obj(o[1], 1)
        .ws({"and", "a"})
        .obj(o[2], 2);
    b[3].w("a").obj(o[1], 1).ws(relation(o[1], o[2])).w("a").obj(o[2], 2).ws({"and", "a"}).obj(o[0], 0);
    b[4].w("a").obj(o[0], 0).ws({",", "a"}).obj(o[1], 1).ws({"and", "a"}).obj(o[2], 2);
  }
  std::vector<Caption> caps;
  for (auto& x : b) caps.push_back(x.done());
  return caps;
}

}  // namespace

SynthScene make_synth_scene(uint64_t seed, int index, int n) {
  Rng rng(seed * 0x9E3779B97F4A7C15ull + (uint64_t)index * 0xBF58476D1CE4E5B9ull + 12345);
  std::vector<Placed> placed;
  int want = (int)rng.integer(1, 3);
  for (int attempt = 0; attempt < 400 && (int)placed.size() < want; ++attempt) {
    if (attempt > 0 && attempt % 100 == 0) placed.clear();  // a crowded start: begin again
    Placed p;
    p.shape = (int)rng.integer(0, (int)kSynthShapes.size() - 1);
    p.colour = (int)rng.integer(0, (int)kSynthColours.size() - 1);
    p.size = (int)rng.integer(0, 1);
    p.extent = (float)(p.size ? rng.uniform(0.27, 0.33) * n : rng.uniform(0.14, 0.18) * n);
    double m = p.extent / 2 + 3;
    p.cx = (float)rng.uniform(m, n - m);
    p.cy = (float)rng.uniform(m, n - m);
    bool ok = true;
    for (auto& q : placed) {
      double gap = (p.extent + q.extent) / 2 + 4;
      if (std::fabs(p.cx - q.cx) < gap && std::fabs(p.cy - q.cy) < gap) ok = false;
      if (!unambiguous(p, q)) ok = false;
    }
    if (want == 1) {  // keep the centre clear of the 3x3 region borders, so "top left" is never a guess
      for (double edge : {n / 3.0, 2 * n / 3.0})
        if (std::fabs(p.cx - edge) < 5 || std::fabs(p.cy - edge) < 5) ok = false;
    }
    if (ok) placed.push_back(p);
  }
  if (placed.empty()) throw Error("synth: could not place an object (image too small?)");
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) { return a.cx < b.cx; });

  cv::Mat img(n, n, CV_8UC3);
  draw_background(img, rng);
  for (auto& p : placed) draw_shape(img, p, rng);

  SynthScene scene;
  for (auto& p : placed) {
    ObjectBox b;
    b.shape = kSynthShapes[p.shape];
    b.colour = kSynthColours[p.colour];
    b.size = kSynthSizes[p.size];
    b.x = std::floor(p.cx - p.extent / 2);
    b.y = std::floor(p.cy - p.extent / 2);
    b.w = std::ceil(p.cx + p.extent / 2) - b.x;
    b.h = std::ceil(p.cy + p.extent / 2) - b.y;
    scene.objects.push_back(b);
  }
  scene.bgr.assign(img.data, img.data + (size_t)n * n * 3);
  scene.captions = make_captions(placed, n);
  return scene;
}

void write_synth_dataset(const std::string& dir, const SynthOptions& opt) {
  if (opt.images <= 0) throw Error("synth: --images must be positive");
  if (opt.size < 48) throw Error("synth: --size must be at least 48");
  std::string img_dir = join_path(dir, "images");
  make_dirs(img_dir);
  std::vector<SynthScene> scenes(opt.images);
  std::string first_error;
#pragma omp parallel for schedule(dynamic, 16)
  for (int i = 0; i < opt.images; ++i) {
    try {
      scenes[i] = make_synth_scene(opt.seed, i, opt.size);
      cv::Mat img(opt.size, opt.size, CV_8UC3, scenes[i].bgr.data());
      const std::string png = encode_png(img);
      char name[32];
      std::snprintf(name, sizeof name, "%06d.png", i + 1);
      write_file_atomic(join_path(img_dir, name), png);
      scenes[i].bgr.clear();
      scenes[i].bgr.shrink_to_fit();
    } catch (const std::exception& e) {
#pragma omp critical
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw Error(first_error);

  nlohmann::json j;
  j["info"] = {
      {"description", "sat synthetic grounded scenes"}, {"seed", opt.seed}, {"images", opt.images}, {"size", opt.size}};
  j["images"] = nlohmann::json::array();
  j["annotations"] = nlohmann::json::array();
  int64_t ann_id = 1;
  for (int i = 0; i < opt.images; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "%06d.png", i + 1);
    nlohmann::json objs = nlohmann::json::array();
    for (auto& b : scenes[i].objects)
      objs.push_back({{"shape", b.shape},
                      {"colour", b.colour},
                      {"size", b.size},
                      {"bbox", {(int)b.x, (int)b.y, (int)b.w, (int)b.h}}});
    j["images"].push_back(
        {{"id", i + 1}, {"file_name", name}, {"width", opt.size}, {"height", opt.size}, {"objects", objs}});
    for (auto& c : scenes[i].captions) {
      nlohmann::json g = nlohmann::json::array();
      for (auto& [t, k] : c.grounding) g.push_back({{"token", t}, {"object", k}});
      j["annotations"].push_back({{"id", ann_id++}, {"image_id", i + 1}, {"caption", c.raw}, {"grounding", g}});
    }
  }
  write_file_atomic(join_path(dir, "captions.json"), j.dump() + "\n");
}

}  // namespace sat
