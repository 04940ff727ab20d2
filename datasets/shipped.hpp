// Where the files sat ships are found at run time. An installed `sat` (or libsat.so) finds them under its own
// prefix, <prefix>/share/sat/models; one run from the build tree finds them in the source checkout it was built
// from, as before installing existed. Nothing absolute about an installation is compiled in.
#pragma once
#include <string>

namespace sat {

// The folder of the bundled models (flickr8k.sat, flickr8k-inception.sat, inception_v3.sat, synth.sat).
std::string shipped_models_dir();
// The last place encoder weights that a model names but does not hold (ResNet v2) are looked for: the installed
// models folder, or ../shared/models beside the source checkout.
std::string shipped_weights_dir();

}  // namespace sat
