// Split lists (`--train-split`, `--images` of sat extract: one file name per line), then the subset of a small
// caption set they select (unknown names are an error naming the list).
#include "datasets/coco.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string captions = fuzz::write_input(
      "captions.csv", std::string("image,caption\na.jpg,a dog runs\na.jpg,a brown dog\nb.jpg,\"a man, standing\"\n"));
  std::string path = fuzz::write_input("split.txt", data, size);
  fuzz::expect_clean([&] {
    std::vector<std::string> names = sat::read_name_list(path);
    sat::CaptionSet set = sat::load_flickr_captions_csv(captions, "images");
    (void)set.subset(names, path);
  });
  return 0;
}
