// Karpathy's split files (dataset_coco.json, dataset_flickr8k.json): images with split, filepath, filename and
// sentences (raw and tokens); every split kept, then only "train" (which takes "restval" too).
#include "datasets/coco.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::write_input("dataset_flickr8k.json", data, size);
  fuzz::expect_clean([&] {
    sat::CaptionSet set = sat::load_karpathy_split(path, "images", "");
    for (size_t i = 0; i < set.images.size(); ++i) (void)set.references((int)i);
  });
  fuzz::expect_clean([&] { sat::load_karpathy_split(path, "images", "train"); });
  return 0;
}
