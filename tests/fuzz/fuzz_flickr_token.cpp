// Flickr8k.token.txt / Flickr30k's results_20130124.token: "<file>#<n>\t<caption>" per line.
#include "datasets/coco.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::write_input("Flickr8k.token.txt", data, size);
  fuzz::expect_clean([&] {
    sat::CaptionSet set = sat::load_flickr_token_txt(path, "images");
    for (size_t i = 0; i < set.images.size(); ++i) (void)set.references((int)i);
  });
  return 0;
}
