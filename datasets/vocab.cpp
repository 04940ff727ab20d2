#include "datasets/vocab.hpp"

#include <algorithm>
#include <cctype>
#include <map>

#include "datasets/io.hpp"

namespace sat {

std::vector<std::string> tokenize_caption(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (unsigned char ch : text) {
    if (std::isalnum(ch) || ch == '\'' || ch >= 0x80) {
      cur += (char)std::tolower(ch);
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  // A lone apostrophe is punctuation, not a word.
  out.erase(std::remove(out.begin(), out.end(), std::string("'")), out.end());
  return out;
}

Vocab::Vocab() : words{"<pad>", "<start>", "<end>", "<unk>"} {
  for (int i = 0; i < (int)words.size(); ++i) index[words[i]] = i;
}

Vocab Vocab::build(const std::vector<std::vector<std::string>>& captions, int min_count) {
  std::map<std::string, int64_t> counts;
  for (auto& c : captions)
    for (auto& w : c) counts[w]++;
  std::vector<std::pair<std::string, int64_t>> kept;
  for (auto& [w, n] : counts)
    if (n >= min_count) kept.push_back({w, n});
  // Most frequent first, ties alphabetical: the same data always gives the same ids.
  std::stable_sort(kept.begin(), kept.end(), [](auto& a, auto& b) { return a.second > b.second; });
  Vocab v;
  for (auto& [w, n] : kept) {
    if (v.index.count(w)) continue;
    v.index[w] = (int)v.words.size();
    v.words.push_back(w);
  }
  return v;
}

Vocab Vocab::from_words(const std::vector<std::string>& words, const std::string& file) {
  Vocab v;
  if (words.size() < 4 || words[0] != "<pad>" || words[1] != "<start>" || words[2] != "<end>" || words[3] != "<unk>")
    fail(file, "vocabulary does not start with <pad> <start> <end> <unk>");
  v.words = words;
  v.index.clear();
  for (int i = 0; i < (int)words.size(); ++i)
    if (!v.index.emplace(words[i], i).second) fail(file, "vocabulary repeats the word '" + words[i] + "'");
  return v;
}

int Vocab::id(const std::string& w) const {
  auto it = index.find(w);
  return it == index.end() ? kUnk : it->second;
}

std::vector<int> Vocab::encode(const std::vector<std::string>& tokens) const {
  std::vector<int> ids;
  ids.reserve(tokens.size());
  for (auto& t : tokens) ids.push_back(id(t));
  return ids;
}

std::vector<std::string> Vocab::decode(const std::vector<int>& ids) const {
  std::vector<std::string> out;
  for (int id : ids) {
    if (id == kEnd) break;
    if (id == kStart || id == kPad) continue;
    out.push_back(id >= 0 && id < size() ? words[id] : "<unk>");
  }
  return out;
}

std::string join_words(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) s += (i ? " " : "") + words[i];
  return s;
}

}  // namespace sat
