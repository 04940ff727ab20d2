// Flickr8k's captions.csv: "image,caption" rows with quoted fields (commas and doubled quotes inside).
#include "datasets/coco.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::write_input("captions.csv", data, size);
  fuzz::expect_clean([&] {
    sat::CaptionSet set = sat::load_flickr_captions_csv(path, "images");
    for (size_t i = 0; i < set.images.size(); ++i) (void)set.references((int)i);
  });
  return 0;
}
