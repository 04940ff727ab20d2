// A captioning model: encoder + decoder + vocabulary, and the model file that holds all three.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/safetensors.hpp"
#include "datasets/vocab.hpp"
#include "seq/decoder.hpp"
#include "seq/search.hpp"
#include "train/consensus.hpp"
#include "train/neighbour_words.hpp"
#include "train/search_policy.hpp"
#include "vision/cnn.hpp"
#include "vision/image.hpp"
#include "vision/detector.hpp"
#include "vision/objects_encoder.hpp"
#include "vision/pretrained.hpp"
#include "vision/tunable.hpp"

namespace sat {

constexpr const char* kMemoryKeys = "memory.keys";  // the caption memory's vectors (train/consensus.hpp)
constexpr const char* kMemoryKeyCenter = "memory.key_center";  // its key projection, if any (train/key_projection.hpp)
constexpr const char* kMemoryKeyMap = "memory.key_map";
// The projection's word side, if any (KeyProjection::word_map, float16, and word_center, float32).
constexpr const char* kMemoryWordMap = "memory.word_map";
constexpr const char* kMemoryWordCenter = "memory.word_center";
// The object channels' standardization, if any (ObjectStandardization: 1 x object channels each, float32).
constexpr const char* kObjectCenter = "objects.center";
constexpr const char* kObjectGain = "objects.gain";

struct CaptionModel {
  EncoderConfig encoder_config;
  DecoderConfig decoder_config;
  Vocab vocab;
  int max_len = 20;          // longest caption (words) the model emits
  double length_norm = 1.0;  // beam search: captions compete by log p / words^length_norm (chosen on dev data)
  int beam = 3;              // the search's width when the user does not choose one (1: greedy; chosen on dev data)
  int no_repeat_ngram = 0;   // both searches: no caption repeats an n-word phrase (0: off; see seq/search.hpp)
  // Beam search in diverse groups (seq/search.hpp; sat model set --beam-groups --diversity). 1 group: plain.
  BeamDiversity beam_diversity;
  // Consensus reranking of the beam's candidates by the captions of the nearest training photos (train/consensus.hpp;
  // sat model memory builds the memory and stores the settings chosen on dev data). No memory or weight 0: off.
  std::shared_ptr<const CaptionMemory> memory;
  ConsensusSettings consensus;
  int memory_photos() const { return memory ? memory->photos() : 0; }
  // The nearest memory photos' words as the decoder's input (train/neighbour_words.hpp; sat train --neighbour-words):
  // their shares join the encoder's grid, so the decoder reads encoder_config.feature_dim() + neighbour_words.count()
  // features per location. Needs the memory. Off (no words): the decoder reads the encoder's grid as it is.
  NeighbourWords neighbour_words;
  // The grids the decoder reads, from the encoder's (F: N*L x D, as encode() gives them): F with each image's
  // neighbour word shares joined (leave_out: per image, a memory photo not counted among its neighbours, training's
  // own photo; empty: none), or a copy of F when the model reads none.
  Mat decoder_grid(const Mat& F, int n, const std::vector<int>& leave_out = {}) const;
  // A pretrained encoder's arithmetic (vision/onednn.hpp; sat model set --encoder-precision, chosen on dev data):
  // the CLI's --encoder-precision overrides it. Files written before it existed use f32.
  PrecisionChoice encoder_precision = PrecisionChoice::f32;
  // This process's choice for this model (the library's LoadOptions::encoder_precision): not saved; before the
  // CLI's --encoder-precision and the stored choice.
  std::optional<PrecisionChoice> encoder_precision_override;
  Precision encoder_precision_in_use() const;
  // int8 (vision/onednn.hpp): each 8-bit activation's range in the frozen part (fine-tuned units run in float32),
  // calibrated on training photos in float32 (sat model calibrate); empty when never calibrated, and then int8 is
  // refused.
  Int8Ranges encoder_int8_ranges;
  nlohmann::json info;              // provenance: training command, data, git commit, scores
  bool half_precision = false;      // decoder weights stored as float16 (sat model compact); computed in float32
  std::unique_ptr<CnnEncoder> cnn;  // kind "cnn": the small CNN trained with the decoder
  // kind "pretrained": the imported weights, as stored; shared with the encoder built from them (not copied).
  std::shared_ptr<const TensorFile> encoder_weights;
  std::string encoder_weights_path;  // where weights the model names (weights_file) were found
  // kind "pretrained": the network as far as it is frozen, in the chosen arithmetic (all of it; or, with tune_from,
  // up to that layer's raw output: what a feature cache for the model holds).
  std::unique_ptr<PretrainedEncoder> pretrained;
  std::unique_ptr<TunableBlocks> tuned;  // kind "pretrained" with tune_from: the layers trained after it (float32)
  // Object maps (EncoderConfig::object_channels): the COCO detector, found like the encoder weights (in
  // weights_dir first), and the encoder that joins its maps to the grid (what image_encoder() then gives).
  std::unique_ptr<ObjectDetector> detector;
  std::unique_ptr<EncoderWithObjects> with_objects;
  // The object channels' standardization on their way to the decoder (vision/objects_encoder.hpp; sat train computes
  // it from the training photos for the trunk's channels), stored in the model file. A cache's records and the frozen
  // part's output stay raw: it is applied after them (records_to_features, tuned_forward), on every path alike.
  // Empty: the object channels as the encoder gives them (models without trunk channels, files before it).
  ObjectStandardization object_standardization;
  // The grid's rows (N*L of feature_dim() values, object channels last) with object_standardization applied.
  void standardize_object_channels(float* grid, size_t rows) const;
  // With tuned layers or object channels: photos through the frozen part (and the detector), then on as a cache's
  // records go (records_to_features): one path from photos and from caches (what image_encoder() then gives).
  std::unique_ptr<ImageEncoder> photos_as_records;
  std::string weights_dir;
  std::unique_ptr<Decoder> decoder;
  // An ensemble (sat model ensemble): more decoders over the same encoder grid and vocabulary, each with its own
  // config and weights, stored as member2/..., member3/...; the searches average their word distributions with
  // `decoder`'s (seq/ensemble.hpp). Empty: one decoder. Training and averaging take single models only.
  std::vector<std::unique_ptr<Decoder>> more_members;
  int members() const { return 1 + (int)more_members.size(); }
  std::vector<Decoder*> member_decoders();  // decoder, then more_members
  // The arithmetic the decoder trained in (sat train --precision, seq/matmul.hpp), stored in the file; its searches
  // run their products in it too where bf16 is the faster arithmetic, else in float32. Files before it: f32.
  ProductPrecision decoder_precision = ProductPrecision::f32;
  // Sets every member decoder's products to decoder_precision: bf16 where it is the faster arithmetic here, or
  // (as_asked: a run's own --precision) wherever this CPU computes it natively; else f32.
  void apply_decoder_precision(bool as_asked = false);

  // Builds encoder and decoder from the configs (decoder sizes that depend on the encoder are filled in).
  // A pretrained encoder needs encoder_weights set first. photo_encoder false, with tuned layers: the tuned blocks
  // only, not yet the frozen network and the detector that encode photos (build_photo_encoder; loading a model file
  // calls it once its settings are read).
  void build(bool photo_encoder = true);
  void build_encoder(bool photo_encoder = true);
  // Identifies what made a feature cache this model can read (config and weights of the encoder, or of its frozen
  // part when tuned): caches record it, and a cache from another encoder is refused.
  std::string encoder_id() const;
  // Builds what encodes photos (pretrained, with_objects, photos_as_records) in the arithmetic chosen now, the
  // detector found when the model has object channels. The tuned blocks' weights may change after (training): they
  // run as they are.
  void build_photo_encoder();
  // Cached grids (N x L x D of cache_config()) -> the decoder's features (N*L' x D'): through the tuned blocks
  // (inference) when there are any, the object channels standardized (records_to_features).
  Mat features_from_cache(const float* grids, int n);
  // The same into grid (N x L' x D'): what photos (through the frozen part) and caches both go through.
  void records_to_features(const float* records, int n, std::vector<float>& grid);
  // A tuned encoder's cached records (N x cache L x cache D: the frozen part's raw output, then any object channels
  // pooled onto that grid) -> the grid the decoder reads (N x L x D): the tuned blocks' output, then the object
  // channels max-pooled onto it (the same numbers as pooling the detector's maps onto it directly, the pooling being
  // a max), standardized (object_standardization). training: keeps what tuned_backward needs (float32 only).
  // bf16: the tuned blocks in bf16 (inference).
  void tuned_forward(const float* cached, int n, bool training, std::vector<float>& grid, bool bf16 = false);
  // The same for inference, a few photos at a time: what photos (through the frozen part) and caches both go through.
  // In the encoder's arithmetic when that is bf16 (and the CPU computes it natively), else float32 (int8's ranges
  // describe the frozen part only).
  void tuned_inference(const float* cached, int n, std::vector<float>& grid);
  bool tuned_inference_in_bf16() const;
  // dgrid: N x L x D for the last training tuned_forward: the tuned blocks' gradients (object channels have none).
  void tuned_backward(const float* dgrid);
  struct TunedScratch {  // tuned_forward's and tuned_backward's buffers, kept between steps
    std::vector<float> raw, objects, out, pooled, dgrid;
  } tuned_scratch;
  void init(Rng& rng);
  std::vector<Param*> params();  // trainable encoder (cnn or tuned blocks) then decoder, buffers included

  TensorFile to_tensor_file() const;
  void save(const std::string& path) const;
  // weights_dir: where to look first for encoder weights the model names but does not hold (else --weights-dir's
  // folder, $SAT_WEIGHTS, the default; vision/pretrained.hpp).
  static std::unique_ptr<CaptionModel> from_tensor_file(const TensorFile& tf, const std::string& path,
                                                        const std::string& weights_dir = "",
                                                        std::optional<PrecisionChoice> encoder_precision = {});
  static std::unique_ptr<CaptionModel> load(const std::string& path, const std::string& weights_dir = "",
                                            std::optional<PrecisionChoice> encoder_precision = {});

  // Decodes and preprocesses images into N x 3 x S x S planes (mirror: each flipped left to right first).
  std::vector<float> load_planes(const std::vector<std::string>& paths, bool mirror = false) const;
  // One image into 3 x S x S planes at `out` (an unreadable or damaged image is an Error naming the file, a damaged
  // one read anyway with decode.allow_damaged).
  void load_plane(const std::string& path, float* out, const DecodeOptions& decode = {}) const;
  // The model's encoder, whichever kind it is (null before build()).
  ImageEncoder* image_encoder() const;
  // What a feature cache for the model holds comes from: image_encoder(), or with tuned layers the frozen part
  // (and the detector) before them.
  ImageEncoder* frozen_encoder() const;
  // The COCO detector at the model's input size: the model's own when it has object maps, else loaded now (found like
  // encoder weights). An input size that is not a multiple of 32 is an Error.
  ObjectDetector& object_detector();
  // Inference-mode encoder over n images' planes: N*L x D features.
  Mat encode(const float* planes, int n);
  Mat encode(const std::vector<float>& planes, int n) { return encode(planes.data(), n); }
  // The one entry point from grids to captions: n images' features (N*L x D, as encode() gives them) searched as
  // `settings` say (resolve_search, train/search_policy.hpp), each image's candidate list with the one kept. An image
  // whose required word no caption reaches within max_len words is an Error.
  std::vector<CandidateList> search(const Mat& F, int n, const SearchSettings& settings);
  // The same, the kept caption of each image only.
  std::vector<Hypothesis> search_kept(const Mat& F, int n, const SearchSettings& settings);
};

// A model holding only a pretrained encoder: the encoder file's network cut at `cut`, input size `size`
// (0: the file's default). What sat extract runs and sat train --encoder starts from. raw: the cut layer's own
// output, not normalized for attention (ResNet v2) — what the layers fine-tuned after it read.
// build=false leaves the encoder unbuilt for a caller that sets more of the model and builds it whole.
// object_scale > 0: the grid is joined by the COCO detector's object maps times that (EncoderConfig::object_channels).
std::unique_ptr<CaptionModel> pretrained_encoder_model(const std::string& encoder_file, const std::string& cut,
                                                       int size, bool raw = false, bool build = true,
                                                       float object_scale = 0.f,
                                                       const std::string& object_form = "maps");

}  // namespace sat
