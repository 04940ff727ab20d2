// Caption tokenizer and vocabulary (built from the training split, saved inside the model file).
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

namespace sat {

// Lower-case, split on anything that is not a letter, digit or apostrophe; punctuation is dropped.
std::vector<std::string> tokenize_caption(const std::string& text);

struct Vocab {
  static constexpr int kPad = 0, kStart = 1, kEnd = 2, kUnk = 3;
  std::vector<std::string> words;  // index -> word; the first four are the specials above
  std::unordered_map<std::string, int> index;

  Vocab();  // specials only
  static Vocab build(const std::vector<std::vector<std::string>>& captions, int min_count);
  static Vocab from_words(const std::vector<std::string>& words, const std::string& file_for_errors);
  int size() const { return (int)words.size(); }
  int id(const std::string& w) const;  // kUnk when absent
  bool contains(const std::string& w) const { return index.count(w) > 0; }
  std::vector<int> encode(const std::vector<std::string>& tokens) const;
  // Stops at <end>; skips <start> and <pad>.
  std::vector<std::string> decode(const std::vector<int>& ids) const;
};

std::string join_words(const std::vector<std::string>& words);

}  // namespace sat
