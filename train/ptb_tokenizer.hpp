// The coco-caption toolkit's tokenization step: Stanford PTBTokenizer (lower-cased), then the toolkit's
// punctuation tokens are dropped. Written here as a rule-based scanner for caption text.
#pragma once
#include <string>
#include <vector>

namespace sat {

std::vector<std::string> ptb_tokenize(const std::string& text);
std::string ptb_tokenize_joined(const std::string& text);  // tokens joined by single spaces

}  // namespace sat
