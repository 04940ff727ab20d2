// COCO captions JSON (`sat train --data captions.json`, `sat eval --refs`): images, annotations, ids, and the
// synthetic sets' objects and grounding; then the format detection every --data goes through.
#include "datasets/coco.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = fuzz::write_input("captions.json", data, size);
  fuzz::expect_clean([&] {
    sat::CaptionSet set = sat::load_coco_captions(path, "images");
    for (size_t i = 0; i < set.images.size(); ++i) (void)set.references((int)i);
    (void)sat::coco_captions_json(set);
  });
  fuzz::expect_clean([&] { sat::load_captions_any(path, "images", "auto"); });
  return 0;
}
