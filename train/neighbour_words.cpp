#include "train/neighbour_words.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <unordered_map>

#include "datasets/io.hpp"
#include "train/metrics.hpp"

namespace sat {

using nlohmann::json;

json NeighbourWords::to_json() const {
  return json{{"words", words}, {"neighbours", neighbours}, {"scale", scale}};
}

NeighbourWords NeighbourWords::from_json(const json& j, const std::string& source) {
  NeighbourWords nw;
  try {
    nw.words = j.at("words").get<std::vector<std::string>>();
    nw.neighbours = j.at("neighbours").get<int>();
    nw.scale = j.at("scale").get<float>();
  } catch (const json::exception& e) {
    fail(source, std::string("its neighbour words are malformed (") + e.what() + ")");
  }
  if (nw.count() < 1 || nw.count() > kMaxNeighbourWords)
    fail(source, "it reads " + std::to_string(nw.count()) + " neighbour words: from 1 to " +
                     std::to_string(kMaxNeighbourWords) + " expected");
  if (nw.neighbours < 1 || nw.neighbours > kMaxNeighbourWordPhotos)
    fail(source, "its neighbour words come from " + std::to_string(nw.neighbours) + " photos: from 1 to " +
                     std::to_string(kMaxNeighbourWordPhotos) + " expected");
  if (!(nw.scale > 0 && nw.scale <= kMaxNeighbourWordScale))
    fail(source, "its neighbour words' scale must be in (0, " + std::to_string((int)kMaxNeighbourWordScale) + "]");
  std::set<std::string> seen;
  for (const std::string& w : nw.words)
    if (w.empty() || w.find(' ') != std::string::npos || !seen.insert(w).second)
      fail(source, "its neighbour word '" + w + "' is empty, holds a space or comes twice");
  return nw;
}

std::vector<std::string> most_said_words(const CaptionMemory& memory, const Vocab& vocab, int count) {
  std::vector<int64_t> said(vocab.size(), 0);  // per vocabulary word, the captions that say it
  for (int p = 0; p < memory.photos(); ++p)
    for (const Tokens& words : memory.caption_words(p)) {
      std::set<int> ids;
      for (const std::string& w : words) {
        const int id = vocab.contains(w) ? vocab.id(w) : -1;
        if (id > Vocab::kUnk) ids.insert(id);
      }
      for (int id : ids) ++said[id];
    }
  std::vector<int> order;
  for (int id = Vocab::kUnk + 1; id < vocab.size(); ++id)
    if (said[id] > 0) order.push_back(id);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return said[a] > said[b]; });
  order.resize(std::min<size_t>(order.size(), (size_t)std::max(0, count)));
  std::vector<std::string> out;
  for (int id : order) out.push_back(vocab.words[id]);
  return out;
}

void neighbour_word_shares(const CaptionMemory& memory, const std::vector<int>& photos,
                           const std::vector<std::string>& words, float scale, float* out) {
  std::unordered_map<std::string, int> channel;
  for (size_t k = 0; k < words.size(); ++k) channel.emplace(words[k], (int)k);
  std::fill(out, out + words.size(), 0.f);
  int captions = 0;
  std::vector<int> said_in(words.size(), -1);  // the last caption that said each word: a word counts once a caption
  for (int p : photos)
    for (const Tokens& caption : memory.caption_words(p)) {
      for (const std::string& w : caption) {
        auto it = channel.find(w);
        if (it == channel.end() || said_in[it->second] == captions) continue;
        said_in[it->second] = captions;
        out[it->second] += 1.f;
      }
      ++captions;
    }
  if (captions > 0)
    for (size_t k = 0; k < words.size(); ++k) out[k] *= scale / (float)captions;
}

std::vector<std::vector<int>> neighbour_photos(const CaptionMemory& memory, const Mat& F, int n, int neighbours,
                                               const std::vector<int>& leave_out) {
  if (!leave_out.empty() && (int)leave_out.size() != n)
    throw Error("neighbour words: " + std::to_string(leave_out.size()) + " photos to leave out for " +
                std::to_string(n) + " images");
  const Mat keys = memory.key_vectors(F, n);
  std::vector<std::vector<int>> out(n);
  for (int i = 0; i < n; ++i) {
    const int skip = leave_out.empty() ? -1 : leave_out[i];
    std::vector<int> found = memory.nearest(keys.row(i).data(), neighbours + (skip >= 0 ? 1 : 0));
    found.erase(std::remove(found.begin(), found.end(), skip), found.end());
    found.resize(std::min<size_t>(found.size(), (size_t)neighbours));
    out[i] = std::move(found);
  }
  return out;
}

Mat join_neighbour_words(const Mat& F, int n, const CaptionMemory& memory, const NeighbourWords& nw,
                         const std::vector<int>& leave_out) {
  if (n <= 0) return Mat(0, F.cols() + nw.count());
  if (F.rows() % n != 0)
    throw Error("neighbour words: a grid of " + std::to_string(F.rows()) + " rows for " + std::to_string(n) +
                " images");
  const int64_t L = F.rows() / n, D = F.cols(), K = nw.count();
  const std::vector<std::vector<int>> photos = neighbour_photos(memory, F, n, nw.neighbours, leave_out);
  Mat out(F.rows(), D + K);
  out.leftCols(D) = F;
  std::vector<float> shares(K);
  for (int i = 0; i < n; ++i) {
    neighbour_word_shares(memory, photos[i], nw.words, nw.scale, shares.data());
    const Eigen::Map<const Eigen::RowVectorXf> row(shares.data(), K);
    out.block(i * L, D, L, K).rowwise() = row;
  }
  return out;
}

std::vector<int> own_memory_photos(const CaptionMemory& memory,
                                   const std::vector<std::vector<std::string>>& images_captions) {
  auto joined = [](const std::vector<std::string>& captions) {
    std::string s;
    for (const std::string& c : captions) s += c + '\n';
    return s;
  };
  std::unordered_map<std::string, int> photo_of;
  for (int p = 0; p < memory.photos(); ++p) photo_of.emplace(joined(memory.captions[p]), p);
  std::vector<int> out;
  out.reserve(images_captions.size());
  for (const auto& raw : images_captions) {
    std::vector<std::string> kept;
    for (const std::string& c : raw) kept.push_back(memory_caption(c));
    auto it = photo_of.find(joined(kept));
    out.push_back(it == photo_of.end() ? -1 : it->second);
  }
  return out;
}

}  // namespace sat
