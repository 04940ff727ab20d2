// _sat: the Python binding of libsat.so's public API (sat/captioner.hpp, sat/scores.hpp). The package sat
// (tools/python/sat) checks Python's arguments and wraps what this returns in its own classes; this layer only
// converts, and releases the GIL for every call into the library.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <opencv2/imgproc.hpp>

#include <sat/captioner.hpp>
#include <sat/scores.hpp>

namespace py = pybind11;

namespace {

// NumPy's H x W x 3 RGB (or x 4 RGBA, or H x W grey) uint8 pixels, read in place (the package passes C-contiguous
// arrays): checked and wrapped while the GIL is held.
cv::Mat view(const py::array& a, size_t index) {
  const std::string name = "image[" + std::to_string(index) + "]";
  if (!py::isinstance<py::array_t<uint8_t>>(a) || !(a.flags() & py::array::c_style))
    throw py::value_error(name + ": expected a C-contiguous uint8 array");
  const int channels = a.ndim() == 2 ? 1 : a.ndim() == 3 ? (int)a.shape(2) : 0;
  if (channels != 1 && channels != 3 && channels != 4)
    throw py::value_error(name + ": expected H x W x 3 (RGB), H x W x 4 (RGBA) or H x W (grey) pixels");
  return cv::Mat((int)a.shape(0), (int)a.shape(1), CV_8UC(channels), const_cast<void*>(a.data()),
                 (size_t)a.strides(0));
}

// The library reads BGR: RGB and RGBA pixels are swapped into a new image (the one copy), grey ones passed as they are.
std::vector<cv::Mat> as_bgr(const std::vector<cv::Mat>& views) {
  std::vector<cv::Mat> out(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].channels() == 1 || views[i].empty())  // the library names an empty image
      out[i] = views[i];
    else
      cv::cvtColor(views[i], out[i], views[i].channels() == 3 ? cv::COLOR_RGB2BGR : cv::COLOR_RGBA2BGR);
  }
  return out;
}

// Moves a vector into a NumPy array of `shape` without copying: the array owns it.
py::array_t<float> to_numpy(std::vector<float>&& values, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<float>(std::move(values));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>(shape, owned->data(), free_when_done);
}

py::dict to_python(sat::CaptionResult&& r, int rows, int cols) {
  py::dict d;
  d["text"] = r.text;
  d["words"] = r.words;
  d["logprob"] = r.logprob;
  if (!r.attention.empty()) {
    std::vector<float> weights;
    weights.reserve(r.attention.size() * rows * cols);
    for (const sat::AttentionGrid& g : r.attention) weights.insert(weights.end(), g.weights.begin(), g.weights.end());
    d["attention"] = to_numpy(std::move(weights), {(py::ssize_t)r.attention.size(), rows, cols});
  }
  if (!r.glimpses.empty()) {
    py::array_t<int32_t> g({(py::ssize_t)r.glimpses.size(), (py::ssize_t)2});
    auto out = g.mutable_unchecked<2>();
    for (size_t w = 0; w < r.glimpses.size(); ++w) out(w, 0) = r.glimpses[w].row, out(w, 1) = r.glimpses[w].col;
    d["glimpses"] = g;
  }
  py::list candidates;
  for (const sat::CaptionCandidate& c : r.candidates) {
    py::dict one;
    one["text"] = c.text;
    one["rank"] = c.rank;
    one["logprob"] = c.logprob;
    one["score"] = c.score;
    one["agreement"] = c.agreement;
    one["object_evidence"] = c.evidence;
    one["relevance"] = c.relevance;
    one["total"] = c.total;
    one["chosen"] = c.chosen;
    one["memory_photo"] = c.memory_photo;
    candidates.append(one);
  }
  d["candidates"] = candidates;
  py::list objects;
  for (const sat::FoundObject& o : r.objects) objects.append(py::make_tuple(o.name, o.score, o.x, o.y));
  d["objects"] = objects;
  return d;
}

py::dict to_python(const sat::Scores& s) {
  py::dict d;  // the keys `sat eval --json` prints
  d["images"] = s.images;
  for (int k = 0; k < 4; ++k) d[("Bleu_" + std::to_string(k + 1)).c_str()] = s.bleu[k];
  if (s.meteor >= 0) d["METEOR"] = s.meteor;
  d["ROUGE_L"] = s.rouge_l;
  d["CIDEr"] = s.cider_d;
  d["length_ratio"] = s.length_ratio;
  return d;
}

py::dict to_python(const sat::ChoiceCheck& c, const std::vector<std::string>& names) {
  py::dict d;  // the keys `sat eval --choose-among --json` prints
  d["metric"] = c.metric;
  d["images"] = c.images;
  d["splits"] = c.splits;
  d["seed"] = c.seed;
  d["best_on_all"] = names[c.best_on_all];
  d["median_on_all"] = c.median_on_all;
  d["chosen_own_half"] = c.chosen_own_half;
  d["chosen_other_half"] = c.chosen_other_half;
  d["median_other_half"] = c.median_other_half;
  py::dict overstated;
  overstated["mean"] = c.chosen_own_half - c.chosen_other_half;
  overstated["low"] = c.overstated_low;
  overstated["high"] = c.overstated_high;
  d["overstated"] = overstated;
  py::list systems;
  for (int k = 0; k < c.systems; ++k) {
    py::dict one;
    one["name"] = names[k];
    one["on_all"] = c.on_all[k];
    one["times_chosen"] = c.times_chosen[k];
    systems.append(one);
  }
  d["systems"] = systems;
  return d;
}

py::dict to_python(const sat::Comparison& c) {
  py::dict d;  // the keys `sat eval --baseline --json` prints
  d["images"] = c.images;
  d["resamples"] = c.resamples;
  d["seed"] = c.seed;
  d["confidence"] = c.confidence;
  d["cider_d_images_better"] = c.better;
  d["cider_d_images_worse"] = c.worse;
  d["cider_d_images_equal"] = c.equal;
  py::dict metrics;
  for (const sat::MetricDifference& m : c.metrics) {
    py::dict one;
    one["baseline"] = m.baseline;
    one["candidate"] = m.candidate;
    one["difference"] = m.difference;
    one["low"] = m.low;
    one["high"] = m.high;
    one["share_not_above_zero"] = m.share_not_above_zero;
    metrics[m.metric.c_str()] = one;
  }
  d["metrics"] = metrics;
  return d;
}

// Every call into the library: the arguments are C++ values already, so the GIL is released for all of it.
class PyCaptioner {
 public:
  PyCaptioner(const std::string& model, const std::string& weights_dir, const std::string& precision, int threads) {
    sat::LoadOptions o;
    o.weights_dir = weights_dir;
    o.encoder_precision = precision;
    o.threads = threads;
    py::gil_scoped_release release;
    captioner_ = std::make_unique<sat::Captioner>(model, o);
    info_ = captioner_->info();
  }

  py::list caption_files(const std::vector<std::string>& paths, const sat::CaptionOptions& options) const {
    std::vector<sat::CaptionResult> results;
    {
      py::gil_scoped_release release;
      results = captioner_->caption_files(paths, options);
    }
    return to_list(std::move(results));
  }

  py::list caption_arrays(const std::vector<py::array>& arrays, const sat::CaptionOptions& options) const {
    const std::vector<cv::Mat> views = wrap(arrays);
    std::vector<sat::CaptionResult> results;
    {
      py::gil_scoped_release release;
      results = captioner_->caption(as_bgr(views), options);
    }
    return to_list(std::move(results));
  }

  py::list encode_files(const std::vector<std::string>& paths) const {
    std::vector<sat::FeatureGrid> grids;
    {
      py::gil_scoped_release release;
      grids = captioner_->encode_files(paths);
    }
    return to_list(std::move(grids));
  }

  py::list encode_arrays(const std::vector<py::array>& arrays) const {
    const std::vector<cv::Mat> views = wrap(arrays);
    std::vector<sat::FeatureGrid> grids;
    {
      py::gil_scoped_release release;
      grids = captioner_->encode(as_bgr(views));
    }
    return to_list(std::move(grids));
  }

  py::dict info() const {
    const sat::ModelInfo& i = info_;
    py::dict d;
    d["path"] = i.path;
    d["encoder_weights"] = i.encoder_weights;
    d["input_size"] = i.input_size;
    d["grid_rows"] = i.grid_rows;
    d["grid_cols"] = i.grid_cols;
    d["vocabulary"] = i.vocabulary;
    d["beam"] = i.beam;
    d["length_norm"] = i.length_norm;
    d["no_repeat_ngram"] = i.no_repeat_ngram;
    d["memory_photos"] = i.memory_photos;
    d["consensus_weight"] = i.consensus_weight;
    d["memory_candidates"] = i.memory_candidates;
    d["object_evidence"] = i.object_evidence;
    d["evidence_threshold"] = i.evidence_threshold;
    d["neighbour_evidence"] = i.neighbour_evidence;
    d["beam_evidence"] = i.beam_evidence;
    d["relevance_weight"] = i.relevance_weight;
    d["beam_groups"] = i.beam_groups;
    d["diversity"] = i.diversity;
    d["attention"] = i.attention;
    d["encoder_precision"] = i.encoder_precision;
    return d;
  }

 private:
  // The arrays' pixels, viewed: the caller's references keep them alive while the GIL is released.
  static std::vector<cv::Mat> wrap(const std::vector<py::array>& arrays) {
    std::vector<cv::Mat> views;
    views.reserve(arrays.size());
    for (size_t i = 0; i < arrays.size(); ++i) views.push_back(view(arrays[i], i));
    return views;
  }
  py::list to_list(std::vector<sat::CaptionResult>&& results) const {
    py::list out;
    for (auto& r : results) out.append(to_python(std::move(r), info_.grid_rows, info_.grid_cols));
    return out;
  }
  static py::list to_list(std::vector<sat::FeatureGrid>&& grids) {
    py::list out;
    for (auto& g : grids) out.append(to_numpy(std::move(g.values), {g.rows, g.cols, g.depth}));
    return out;
  }

  std::unique_ptr<sat::Captioner> captioner_;
  sat::ModelInfo info_;
};

}  // namespace

PYBIND11_MODULE(_sat, m) {
  m.doc() = "sat's C++ library (libsat.so); use the package sat";
  // str(error) is the library's one-line message, the line `sat` prints after "sat: "
  py::register_exception<sat::Error>(m, "Error", PyExc_RuntimeError);

  py::class_<sat::CaptionOptions>(m, "CaptionOptions")
      .def(py::init<>())
      .def_readwrite("beam", &sat::CaptionOptions::beam)
      .def_readwrite("length_norm", &sat::CaptionOptions::length_norm)
      .def_readwrite("no_repeat_ngram", &sat::CaptionOptions::no_repeat_ngram)
      .def_readwrite("consensus_weight", &sat::CaptionOptions::consensus_weight)
      .def_readwrite("memory_candidates", &sat::CaptionOptions::memory_candidates)
      .def_readwrite("object_evidence", &sat::CaptionOptions::object_evidence)
      .def_readwrite("evidence_threshold", &sat::CaptionOptions::evidence_threshold)
      .def_readwrite("neighbour_evidence", &sat::CaptionOptions::neighbour_evidence)
      .def_readwrite("beam_evidence", &sat::CaptionOptions::beam_evidence)
      .def_readwrite("relevance_weight", &sat::CaptionOptions::relevance_weight)
      .def_readwrite("beam_groups", &sat::CaptionOptions::beam_groups)
      .def_readwrite("diversity", &sat::CaptionOptions::diversity)
      .def_readwrite("include", &sat::CaptionOptions::include)
      .def_readwrite("attention", &sat::CaptionOptions::attention)
      .def_readwrite("objects", &sat::CaptionOptions::objects)
      .def_readwrite("object_threshold", &sat::CaptionOptions::object_threshold)
      .def_readwrite("candidates", &sat::CaptionOptions::candidates)
      .def_readwrite("allow_damaged", &sat::CaptionOptions::allow_damaged);

  py::class_<PyCaptioner>(m, "Captioner")
      .def(py::init<const std::string&, const std::string&, const std::string&, int>(), py::arg("model"),
           py::arg("weights_dir"), py::arg("precision"), py::arg("threads"))
      .def("caption_files", &PyCaptioner::caption_files)
      .def("caption_arrays", &PyCaptioner::caption_arrays)
      .def("encode_files", &PyCaptioner::encode_files)
      .def("encode_arrays", &PyCaptioner::encode_arrays)
      .def("info", &PyCaptioner::info);

  m.def(
      "score",
      [](const std::vector<std::string>& captions, const std::vector<std::vector<std::string>>& references) {
        sat::Scores s;
        {
          py::gil_scoped_release release;
          s = sat::score(captions, references);
        }
        return to_python(s);
      },
      py::arg("captions"), py::arg("references"));
  m.def(
      "score_files",
      [](const std::string& results, const std::string& references) {
        sat::Scores s;
        {
          py::gil_scoped_release release;
          s = sat::score_files(results, references);
        }
        return to_python(s);
      },
      py::arg("results"), py::arg("references"));
  m.def(
      "score_images",
      [](const std::vector<std::string>& image_ids, const std::vector<std::string>& captions,
         const std::string& references) {
        sat::Scores s;
        {
          py::gil_scoped_release release;
          s = sat::score_files(image_ids, captions, references);
        }
        return to_python(s);
      },
      py::arg("image_ids"), py::arg("captions"), py::arg("references"));
  m.def(
      "compare_files",
      [](const std::string& results, const std::string& baseline, const std::string& references, int resamples,
         uint64_t seed) {
        sat::Comparison c;
        {
          py::gil_scoped_release release;
          c = sat::compare_files(results, baseline, references, resamples, seed);
        }
        return to_python(c);
      },
      py::arg("results"), py::arg("baseline"), py::arg("references"), py::arg("resamples"), py::arg("seed"));
  m.def(
      "check_choice_files",
      [](const std::vector<std::string>& results, const std::string& references, const std::string& metric,
         int splits, uint64_t seed) {
        sat::ChoiceCheck c;
        {
          py::gil_scoped_release release;
          c = sat::check_choice_files(results, references, metric, splits, seed);
        }
        return to_python(c, results);
      },
      py::arg("results"), py::arg("references"), py::arg("metric"), py::arg("splits"), py::arg("seed"));
  m.def("models_dir", &sat::Captioner::models_dir);
}
