// sat's public C++ API: caption images with a trained Show, Attend and Tell model.
//
//   sat::Captioner captioner("flickr8k-inception.sat");
//   sat::CaptionResult c = captioner.caption_file("photo.jpg");  // c.text: "a dog runs through the grass"
//
// Link the `sat::sat` CMake target (find_package(sat)); the library is libsat.so, the only other thing a program
// needs is OpenCV's core. Every problem with an input (a missing, corrupt or unsupported image or model file,
// encoder weights a model names but that cannot be found, a bad argument) throws sat::Error with the one-line
// message the `sat` command prints after "sat: " for the same problem.
//
// Threads: a Captioner may be shared by any number of threads, and every const member function may be called from
// several at once. Decoding and resizing the images of a call run in the calling thread, concurrently with other
// calls; the network (encoder and caption search, which use all the cores they are given) runs one call at a time,
// the others wait for it. A batch call encodes its images together and is faster per image than single calls.
// Constructing, moving and destroying a Captioner are not thread-safe with respect to calls on the same object.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include <sat/error.hpp>  // in this checkout: datasets/sat/error.hpp (the errors live at the bottom)

namespace sat {

struct LoadOptions {
  // Folder holding encoder weights the model names but does not contain (ResNet v2 models:
  // resnet_v2_101.safetensors, or a resnet_v2_101/ folder with it). Looked in first, then $SAT_WEIGHTS, then the
  // installed models folder (Captioner::models_dir()), then ~/.cache/sat/weights (where tools/fetch-weights.sh puts
  // them).
  std::string weights_dir;
  // Threads the encoder and the search use (OpenMP); 0: OpenMP's default (every core, or $OMP_NUM_THREADS).
  int threads = 0;
  // A pretrained encoder's arithmetic: "f32", "bf16" (bfloat16 with float32 accumulation), "int8" (8-bit
  // activations and weights; the model needs calibrated ranges, sat model calibrate) or "auto" (bf16 where it is the
  // CPU's faster arithmetic: AMX, or AVX512-BF16 on AMD); "" takes the model's stored choice. Anything else throws
  // sat::Error.
  std::string encoder_precision;
};

// How to search for a caption. Unset fields take the model's stored settings (chosen on dev data; see ModelInfo).
struct CaptionOptions {
  std::optional<int> beam;             // 1: greedy; at most 100
  std::optional<double> length_norm;   // beam search ranks captions by log p / words^length_norm; in [0, 2]
  std::optional<int> no_repeat_ngram;  // never repeat an n-word phrase (0: off); at most 9
  // Consensus reranking of the beam's candidates by the captions of the nearest training photos (0: off; the model
  // needs a caption memory for more, see `sat model memory`); at most 1000
  std::optional<double> consensus_weight;
  // Consensus reranking: the captions of the M nearest training photos join the beam's candidates (0: the beam's
  // alone); at most the memory's photos
  std::optional<int> memory_candidates;
  // A model that reads the object detector: each beam candidate's total also gains object_evidence x (sum over the
  // objects it names of the detector's peak for them minus evidence_threshold) (0: off; at most 100; the threshold
  // in [0, 1]); see `sat model set --object-evidence`
  std::optional<double> object_evidence;
  std::optional<double> evidence_threshold;
  // With the detector's evidence on and a caption memory: each object's evidence is (1 - neighbour_evidence) x the
  // detector's peak + neighbour_evidence x the share of the nearest memory photos' captions that name it (in [0, 1];
  // 0: the peak alone); see `sat model set --neighbour-evidence`
  std::optional<double> neighbour_evidence;
  // A model that reads the object detector: the same evidence steers the beam, each row's rank gaining beam_evidence x
  // (the object's evidence minus evidence_threshold) the first time it names the object, so the beam finds more
  // captions naming what the photo likely holds (0: off; at most 100); see `sat model set --beam-evidence`
  std::optional<double> beam_evidence;
  // Each beam candidate's total also gains relevance_weight x the caption's relevance to the image: the cosine of
  // the two in the caption memory's CCA space (0: off; at most 100; the model's memory needs the word side of its key
  // projection, see `sat model memory --cca`); see `sat model set --relevance-weight`
  std::optional<double> relevance_weight;
  // Diverse beam search: the beam in beam_groups groups (dividing the beam; 1: plain beam search), a later group
  // paying diversity (log p units, in [0, 100]) for each earlier group's row that took the same word at that step
  std::optional<int> beam_groups;
  std::optional<double> diversity;
  // A word every caption must say (constrained beam search: the best caption with it, chosen among those as the model
  // chooses among a beam's); "": none. A word the model does not know throws sat::Error.
  std::string include;
  bool attention = false;  // fill CaptionResult::attention (and ::glimpses for hard attention)
  // Fill CaptionResult::objects: the COCO objects a detector finds in the image (CenterNet, found like encoder
  // weights: LoadOptions::weights_dir, $SAT_WEIGHTS; the model's input side must be a multiple of 32), each class
  // whose heat peaks at or above object_threshold (in [0, 1]).
  bool objects = false;
  double object_threshold = 0.3;
  int candidates = 0;  // fill CaptionResult::candidates with the N best (and the kept one); at most 100
  // A JPEG or PNG that is damaged (cut short, corrupt data, a failed checksum) throws sat::Error naming it; true
  // captions it anyway, its missing part grey.
  bool allow_damaged = false;
};

// Where the model looked while emitting one word: weights over the encoder's grid, row-major rows x cols, summing
// to 1 (the grid covers the whole image, resized to a square: cell (r, c) is rows r/rows..(r+1)/rows of its height).
struct AttentionGrid {
  int rows = 0, cols = 0;
  std::vector<float> weights;
  float at(int row, int col) const { return weights[(size_t)row * cols + col]; }
};

// Hard attention (Xu et al. section 4.1): the one grid cell the word was read from.
struct Glimpse {
  int row = 0, col = 0;
};

// A caption the search considered (CaptionOptions::candidates): why the kept one was kept.
struct CaptionCandidate {
  std::string text;
  int rank = 0;           // 1: the best score
  double logprob = 0;     // as CaptionResult::logprob
  double score = 0;       // what the beam ranks by: logprob / (words + 1)^length_norm
  double agreement = 0;   // consensus reranking: CIDEr-D against the nearest training photos' captions (else 0)
  double evidence = 0;    // the detector's evidence for the objects it names (CaptionOptions::object_evidence)
  double relevance = 0;   // its words' relevance to the image (CaptionOptions::relevance_weight; else 0)
  // score + consensus weight x agreement + object_evidence x evidence + relevance_weight x relevance: the kept one's
  // is highest
  double total = 0;
  bool chosen = false;    // the caption returned
  int memory_photo = -1;  // a caption of this memory photo (CaptionOptions::memory_candidates); -1: the beam's
};
// A COCO object found in the image (CaptionOptions::objects): its class, its peak heat, and where that peak is
// (x, y: fractions of the image's width and height).
struct FoundObject {
  std::string name;
  double score = 0, x = 0, y = 0;
};
struct CaptionResult {
  std::vector<std::string> words;
  std::string text;                          // the words joined by single spaces
  double logprob = 0;                        // natural log of the caption's probability, its end included
  std::vector<AttentionGrid> attention;      // with CaptionOptions::attention: one per word (none: attention "none")
  std::vector<Glimpse> glimpses;             // with CaptionOptions::attention and a hard-attention model: one per word
  std::vector<CaptionCandidate> candidates;  // with CaptionOptions::candidates: best score first
  std::vector<FoundObject> objects;          // with CaptionOptions::objects: highest peak first
};

// What the caption search reads: the encoder's grid for one image (a model with object maps: the maps joined), rows x
// cols cells covering the whole image as AttentionGrid's do, each a depth-long feature vector; row-major,
// values[(row * cols + col) * depth + d].
struct FeatureGrid {
  int rows = 0, cols = 0, depth = 0;
  std::vector<float> values;
  float at(int row, int col, int d) const { return values[((size_t)row * cols + col) * depth + d]; }
};

struct ModelInfo {
  std::string path;             // the model file
  std::string encoder_weights;  // where weights it names were found ("" when the model holds its encoder)
  int input_size = 0;           // images are resized to input_size x input_size
  int grid_rows = 0, grid_cols = 0;
  int vocabulary = 0;  // words it knows
  int beam = 0;        // the stored search settings CaptionOptions falls back to
  double length_norm = 0;
  int no_repeat_ngram = 0;
  int memory_photos = 0;          // the caption memory's photos (0: none)
  double consensus_weight = 0;    // consensus reranking's stored weight (0: off)
  int memory_candidates = 0;      // how many nearest memory photos' captions join the beam's candidates (0: none)
  double object_evidence = 0;     // the detector's evidence in reranking: its weight (0: off) and threshold
  double evidence_threshold = 0;
  double neighbour_evidence = 0;  // and the nearest memory photos' captions' share in it (0: the peak alone)
  double beam_evidence = 0;       // the same evidence steering the beam: its weight (0: off)
  double relevance_weight = 0;    // the captions' relevance in reranking: its weight (0: off)
  int beam_groups = 1;            // diverse beam search's groups (1: plain beam search)
  double diversity = 0;           // and its penalty
  std::string attention;          // "soft", "local", "hard" or "none"
  std::string encoder_precision;  // what the encoder computes in: "f32", "bf16" or "int8" ("f32" for a model's own CNN)
};

class SAT_API Captioner {
 public:
  // Loads and checks the model file (and the encoder weights it names): a file that is missing, corrupt or not a
  // caption model, or weights not found, throw sat::Error.
  explicit Captioner(const std::string& model_path, const LoadOptions& options = {});
  ~Captioner();
  Captioner(Captioner&&) noexcept;
  Captioner& operator=(Captioner&&) noexcept;
  Captioner(const Captioner&) = delete;
  Captioner& operator=(const Captioner&) = delete;

  // image: 8-bit BGR as cv::imread gives it (grey and BGRA are converted), any size.
  CaptionResult caption(const cv::Mat& image, const CaptionOptions& options = {}) const;
  // An image file: JPEG, PNG, BMP, GIF (its first frame) and 8-bit binary PNM through stb; WebP, TIFF and other PNM
  // through OpenCV's codecs. EXIF orientation is applied (JPEG, PNG).
  CaptionResult caption_file(const std::string& path, const CaptionOptions& options = {}) const;
  // An encoded image in memory (the bytes of such a file).
  CaptionResult caption_bytes(const uint8_t* data, size_t size, const CaptionOptions& options = {}) const;
  CaptionResult caption_bytes(const std::vector<uint8_t>& bytes, const CaptionOptions& options = {}) const;

  // Batches: one caption per image, in order. If any image cannot be read, sat::Error names the first such (a file
  // by its path, others as "image[i]" or "image bytes[i]") and no captions are returned.
  std::vector<CaptionResult> caption(const std::vector<cv::Mat>& images, const CaptionOptions& options = {}) const;
  std::vector<CaptionResult> caption_files(const std::vector<std::string>& paths,
                                           const CaptionOptions& options = {}) const;
  std::vector<CaptionResult> caption_bytes(const std::vector<std::vector<uint8_t>>& images,
                                           const CaptionOptions& options = {}) const;

  // The encoder's grid the captions of the same images are searched over; images as caption() takes them, a batch
  // refused as a whole as caption()'s is.
  FeatureGrid encode(const cv::Mat& image) const;
  FeatureGrid encode_file(const std::string& path) const;
  std::vector<FeatureGrid> encode(const std::vector<cv::Mat>& images) const;
  std::vector<FeatureGrid> encode_files(const std::vector<std::string>& paths) const;

  ModelInfo info() const;
  // Throws sat::Error saying what is wrong with `options` (a value out of range, a setting the model cannot use, a
  // word to include it does not know) when caption() would refuse them: a server checks a request before queueing it.
  void check(const CaptionOptions& options) const;

  // The folder of the models sat ships (flickr8k.sat, the default, which needs ResNet-101 v2 weights;
  // flickr8k-inception.sat; synth.sat): <prefix>/share/sat/models for an installed library.
  static std::string models_dir();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sat
