// Captions photos with sat's library, as a program of your own would: built against an installed sat
// (find_package(sat), target sat::sat; see CMakeLists.txt here).
//   caption_example [--model M] photo...   (default: the installed default model, flickr8k.sat)
#include <cstdio>
#include <string>
#include <vector>

#include <sat/captioner.hpp>

int main(int argc, char** argv) {
  std::string model = sat::Captioner::models_dir() + "/flickr8k.sat";
  std::vector<std::string> photos;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--model" && i + 1 < argc)
      model = argv[++i];
    else
      photos.push_back(argv[i]);
  }
  try {
    const sat::Captioner captioner(model);
    for (const std::string& photo : photos) {
      const sat::CaptionResult c = captioner.caption_file(photo);
      std::printf("%s: %s (log p %.2f)\n", photo.c_str(), c.text.c_str(), c.logprob);
    }
  } catch (const sat::Error& e) {
    std::fprintf(stderr, "caption_example: %s\n", e.what());
    return 1;
  }
  return photos.empty() ? 2 : 0;
}
