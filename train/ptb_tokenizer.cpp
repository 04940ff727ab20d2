#include "train/ptb_tokenizer.hpp"

#include <algorithm>
#include <cctype>
#include <set>

namespace sat {

namespace {

// Dropped by the toolkit after tokenization (pycocoevalcap/tokenizer/ptbtokenizer.py).
const std::set<std::string> kDropped = {"''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".",
                                        "?",  "!", ",",  ":", "-",     "--",    "...",   ";"};
const std::set<std::string> kAbbreviations = {
    "mr",  "mrs", "ms",   "dr",  "st",  "jr",  "sr",   "vs",  "etc", "inc",  "co", "ltd", "mt",  "ft", "no",  "jan",
    "feb", "aug", "sept", "oct", "nov", "dec", "prof", "gen", "sgt", "capt", "lt", "col", "ave", "rd", "blvd"};

std::string lower(std::string s) {
  for (auto& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

bool is_word_char(unsigned char c) {
  return std::isalnum(c) || c >= 0x80;
}

// Normalizes typographic quotes and apostrophes to ASCII, as the PTB tokenizer's output does for text.
std::string normalize(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    unsigned char c = in[i];
    if (c == 0xE2 && i + 2 < in.size() && (unsigned char)in[i + 1] == 0x80) {
      unsigned char d = in[i + 2];
      if (d == 0x98 || d == 0x99) {
        out += '\'';
        i += 2;
        continue;
      }  // ‘ ’
      if (d == 0x9C || d == 0x9D) {
        out += '"';
        i += 2;
        continue;
      }  // “ ”
      if (d == 0x93 || d == 0x94) {
        out += " -- ";
        i += 2;
        continue;
      }  // – —
      if (d == 0xA6) {
        out += "...";
        i += 2;
        continue;
      }  // …
    }
    out += (char)c;
  }
  return out;
}

void split_word(const std::string& w, std::vector<std::string>& out);

// Splits a whitespace-free chunk: leading and trailing punctuation, then the word in the middle.
void split_chunk(std::string chunk, std::vector<std::string>& out) {
  std::vector<std::string> lead, trail;
  while (!chunk.empty()) {
    char c = chunk[0];
    if (c == '(' || c == '[' || c == '{' || c == '"' || c == '`' || c == '$' || c == '#') {
      lead.push_back(std::string(1, c));
      chunk.erase(0, 1);
    } else if (c == '\'' &&
               (chunk.size() == 1 || !is_word_char(chunk[1]) ||
                !(chunk.size() >= 2 && (lower(chunk.substr(1)) == "s" || lower(chunk.substr(1)) == "re" ||
                                        lower(chunk.substr(1)) == "ve" || lower(chunk.substr(1)) == "ll" ||
                                        lower(chunk.substr(1)) == "d" || lower(chunk.substr(1)) == "m")))) {
      lead.push_back("'");
      chunk.erase(0, 1);
    } else if (c == '-' && chunk.size() > 1 && chunk[1] == '-') {
      lead.push_back("--");
      chunk.erase(0, 2);
    } else {
      break;
    }
  }
  while (!chunk.empty()) {
    if (chunk.size() >= 3 && chunk.compare(chunk.size() - 3, 3, "...") == 0) {
      trail.push_back("...");
      chunk.resize(chunk.size() - 3);
      continue;
    }
    char c = chunk.back();
    if (c == '.') {
      std::string stem = chunk.substr(0, chunk.size() - 1);
      // Abbreviations keep their period: "u.s.", "mr."
      if (!stem.empty() && stem.back() != '.' &&
          (stem.find('.') != std::string::npos || kAbbreviations.count(lower(stem))) &&
          std::all_of(stem.begin(), stem.end(), [](unsigned char x) { return std::isalpha(x) || x == '.'; }))
        break;
      trail.push_back(".");
      chunk.pop_back();
    } else if (c == ',' || c == '!' || c == '?' || c == ';' || c == ':' || c == ')' || c == ']' || c == '}' ||
               c == '"' || c == '`' || c == '%') {
      trail.push_back(std::string(1, c));
      chunk.pop_back();
    } else if (c == '\'' && chunk.size() > 1 && std::tolower((unsigned char)chunk[chunk.size() - 2]) != 'n') {
      trail.push_back("'");  // plural possessive or closing quote: "players'" -> players '
      chunk.pop_back();
    } else if (c == '-' && chunk.size() > 1 && chunk[chunk.size() - 2] == '-') {
      trail.push_back("--");
      chunk.resize(chunk.size() - 2);
    } else {
      break;
    }
  }
  for (auto& t : lead) out.push_back(t);
  if (!chunk.empty()) split_word(chunk, out);
  for (auto it = trail.rbegin(); it != trail.rend(); ++it) out.push_back(*it);
}

// The middle of a chunk: internal commas, '--', and clitics ('s, n't, ...).
void split_word(const std::string& w, std::vector<std::string>& out) {
  // Internal separators: a comma not between digits, "--", "..." and brackets split the word.
  for (size_t i = 1; i + 1 < w.size(); ++i) {
    bool digits = std::isdigit((unsigned char)w[i - 1]) && std::isdigit((unsigned char)w[i + 1]);
    if ((w[i] == ',' && !digits) || w[i] == ';' || w[i] == '(' || w[i] == ')' || w[i] == '"' || w[i] == '!' ||
        w[i] == '?' || (w[i] == ':' && !digits)) {
      split_chunk(w.substr(0, i), out);
      out.push_back(std::string(1, w[i]));
      split_chunk(w.substr(i + 1), out);
      return;
    }
    if (w.compare(i, 2, "--") == 0 || w.compare(i, 3, "...") == 0) {
      size_t len = w.compare(i, 3, "...") == 0 ? 3 : 2;
      split_chunk(w.substr(0, i), out);
      out.push_back(w.substr(i, len));
      split_chunk(w.substr(i + len), out);
      return;
    }
  }
  std::string lw = lower(w);
  if (lw == "cannot") {
    out.push_back("can");
    out.push_back("not");
    return;
  }
  for (const char* special : {"gonna", "gotta", "wanna", "lemme", "gimme"}) {
    if (lw == special) {
      out.push_back(lw.substr(0, 3));
      out.push_back(lw.substr(3));
      return;
    }
  }
  if (lw.size() > 3 && lw.compare(lw.size() - 3, 3, "n't") == 0) {
    out.push_back(lw.substr(0, lw.size() - 3));
    out.push_back("n't");
    return;
  }
  for (const char* clitic : {"'s", "'re", "'ve", "'ll", "'d", "'m"}) {
    size_t n = std::string(clitic).size();
    if (lw.size() > n && lw.compare(lw.size() - n, n, clitic) == 0) {
      out.push_back(lw.substr(0, lw.size() - n));
      out.push_back(clitic);
      return;
    }
  }
  out.push_back(lw);
}

}  // namespace

std::vector<std::string> ptb_tokenize(const std::string& text) {
  std::string t = normalize(text);
  std::vector<std::string> raw;
  std::string chunk;
  for (size_t i = 0; i <= t.size(); ++i) {
    if (i == t.size() || std::isspace((unsigned char)t[i])) {
      if (!chunk.empty()) split_chunk(chunk, raw);
      chunk.clear();
    } else {
      chunk += t[i];
    }
  }
  std::vector<std::string> out;
  for (auto& tok : raw) {
    std::string l = lower(tok);
    if (tok == "(" || tok == ")" || tok == "[" || tok == "]" || tok == "{" || tok == "}" || tok == "\"") continue;
    if (kDropped.count(l)) continue;
    out.push_back(l);
  }
  return out;
}

std::string ptb_tokenize_joined(const std::string& text) {
  std::string s;
  for (auto& t : ptb_tokenize(text)) s += (s.empty() ? "" : " ") + t;
  return s;
}

}  // namespace sat
