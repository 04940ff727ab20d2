#include "tools/cli/http.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <nlohmann/json.hpp>

namespace sat::http {

const std::string* Request::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return &value;
  return nullptr;
}

namespace {

// RFC 9110's token characters: what a method and a header name are made of.
bool tchar(unsigned char c) {
  return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

HeadResult fail(int status, std::string message) {
  HeadResult r;
  r.kind = HeadResult::error;
  r.status = status;
  r.message = std::move(message);
  return r;
}

// Whether the comma-separated header value holds `token` (case-insensitive), as Connection lists its options.
bool has_token(const std::string& value, std::string_view token) {
  size_t at = 0;
  while (at <= value.size()) {
    size_t comma = value.find(',', at);
    if (comma == std::string::npos) comma = value.size();
    if (lower(trim(std::string_view(value).substr(at, comma - at))) == token) return true;
    at = comma + 1;
  }
  return false;
}

}  // namespace

bool percent_decode(std::string_view in, std::string& out, bool plus_is_space) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      const char c = (char)(hi * 16 + lo);
      if (c == '\0') return false;
      out += c;
      i += 2;
    } else if (plus_is_space && in[i] == '+') {
      out += ' ';
    } else {
      out += in[i];
    }
  }
  return true;
}

bool parse_query(std::string_view query, std::multimap<std::string, std::string>& out) {
  size_t at = 0;
  while (at < query.size()) {
    size_t amp = query.find('&', at);
    if (amp == std::string_view::npos) amp = query.size();
    const std::string_view pair = query.substr(at, amp - at);
    at = amp + 1;
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    std::string key, value;
    if (!percent_decode(pair.substr(0, eq), key, true)) return false;
    if (eq != std::string_view::npos && !percent_decode(pair.substr(eq + 1), value, true)) return false;
    out.emplace(std::move(key), std::move(value));
  }
  return true;
}

HeadResult parse_head(std::string_view bytes, const Limits& limits, Request& out, size_t& scanned) {
  const size_t from = scanned < 3 ? 0 : scanned - 3;
  const size_t end = bytes.find("\r\n\r\n", from);
  const size_t line_end = bytes.find("\r\n");
  if (line_end == std::string_view::npos ? bytes.size() > limits.max_request_line : line_end > limits.max_request_line)
    return fail(414, "request line over " + std::to_string(limits.max_request_line) + " bytes");
  if (end == std::string_view::npos) {
    scanned = bytes.size();
    if (line_end != std::string_view::npos && bytes.size() - (line_end + 2) > limits.max_header_bytes)
      return fail(431, "headers over " + std::to_string(limits.max_header_bytes) + " bytes");
    return HeadResult{};
  }
  const size_t head_bytes = end + 4;
  const std::string_view head = bytes.substr(0, head_bytes);
  if (head_bytes - (line_end + 2) - 2 > limits.max_header_bytes)
    return fail(431, "headers over " + std::to_string(limits.max_header_bytes) + " bytes");
  // CR and LF only as CRLF: a bare one is where two parsers disagree about where a line ends
  for (size_t i = 0; i < head.size(); ++i) {
    if (head[i] == '\r' && (i + 1 >= head.size() || head[i + 1] != '\n')) return fail(400, "bare CR in the head");
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) return fail(400, "bare LF in the head");
  }

  // The request line: METHOD SP target SP HTTP/1.x
  const std::string_view line = head.substr(0, line_end);
  const size_t sp1 = line.find(' '), sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line");
  out.method = std::string(line.substr(0, sp1));
  out.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  out.version = std::string(line.substr(sp2 + 1));
  if (out.method.empty() || !std::all_of(out.method.begin(), out.method.end(), [](char c) { return tchar(c); }))
    return fail(400, "malformed method");
  if (out.version != "HTTP/1.1" && out.version != "HTTP/1.0") {
    if (out.version.rfind("HTTP/", 0) == 0) return fail(505, "HTTP version " + out.version.substr(5) + " not served");
    return fail(400, "malformed request line");
  }
  if (out.target.empty() || out.target[0] != '/') return fail(400, "request target must be a path starting with /");
  for (char c : out.target)
    if ((unsigned char)c <= 0x20 || (unsigned char)c >= 0x7F || c == '#') return fail(400, "malformed request target");
  const size_t q = out.target.find('?');
  if (!percent_decode(std::string_view(out.target).substr(0, q), out.path, false))
    return fail(400, "malformed escape in the path");
  if (q != std::string::npos && !parse_query(std::string_view(out.target).substr(q + 1), out.params))
    return fail(400, "malformed escape in the query");

  // Header lines: name ":" OWS value OWS
  size_t at = line_end + 2;
  bool has_length = false;
  while (at < end + 2) {
    const size_t eol = head.find("\r\n", at);
    const std::string_view h = head.substr(at, eol - at);
    at = eol + 2;
    if (out.headers.size() == limits.max_headers)
      return fail(431, "more than " + std::to_string(limits.max_headers) + " header lines");
    if (h.empty() || h[0] == ' ' || h[0] == '\t') return fail(400, "folded or empty header line");
    const size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return fail(400, "header line without a name");
    const std::string_view name = h.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), [](char c) { return tchar((unsigned char)c); }))
      return fail(400, "malformed header name");  // a space before the colon included
    const std::string_view value = trim(h.substr(colon + 1));
    for (char c : value)
      if (((unsigned char)c < 0x20 && c != '\t') || c == 0x7F) return fail(400, "control character in a header");
    out.headers.emplace_back(lower(name), std::string(value));
    const std::string& key = out.headers.back().first;
    if (key == "transfer-encoding")
      return fail(411, "Transfer-Encoding is not accepted: send the body with a Content-Length");
    if (key == "content-length") {
      if (has_length) return fail(400, "more than one Content-Length");
      has_length = true;
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return fail(400, "malformed Content-Length");
      out.content_length = std::stoull(std::string(value));
    }
  }
  if (out.content_length > limits.max_body)
    return fail(413, "body over the limit of " + std::to_string(limits.max_body) + " bytes");
  const std::string* connection = out.header("connection");
  out.keep_alive = out.version == "HTTP/1.1" ? !(connection && has_token(*connection, "close"))
                                             : connection && has_token(*connection, "keep-alive");
  HeadResult r;
  r.kind = HeadResult::done;
  r.head_bytes = head_bytes;
  return r;
}

namespace {

// A header value's parameters (`; name=value` or `; name="quoted"`), names lower-cased.
std::map<std::string, std::string> header_params(std::string_view value) {
  std::map<std::string, std::string> params;
  size_t at = value.find(';');
  while (at != std::string_view::npos && at < value.size()) {
    ++at;
    const size_t eq = value.find('=', at);
    if (eq == std::string_view::npos) break;
    const std::string name = lower(trim(value.substr(at, eq - at)));
    size_t v = eq + 1;
    while (v < value.size() && (value[v] == ' ' || value[v] == '\t')) ++v;
    std::string param;
    if (v < value.size() && value[v] == '"') {
      for (++v; v < value.size() && value[v] != '"'; ++v) {
        if (value[v] == '\\' && v + 1 < value.size()) ++v;
        param += value[v];
      }
      at = value.find(';', v);
    } else {
      at = value.find(';', v);
      param = std::string(trim(value.substr(v, at == std::string_view::npos ? std::string_view::npos : at - v)));
    }
    params.emplace(name, std::move(param));
  }
  return params;
}

}  // namespace

std::string multipart_file(const std::string& body, const std::string& content_type, std::string& file) {
  const auto params = header_params(content_type);
  const auto b = params.find("boundary");
  if (b == params.end() || b->second.empty() || b->second.size() > 70)
    return "multipart request without a usable boundary";
  const std::string delimiter = "--" + b->second;
  size_t at = body.rfind(delimiter, 0) == 0 ? 0 : body.find("\r\n" + delimiter);
  if (at == std::string::npos) return "multipart request without a file part";
  at += at == 0 ? delimiter.size() : delimiter.size() + 2;
  for (;;) {
    if (body.compare(at, 2, "--") == 0) return "multipart request without a file part";  // the closing delimiter
    while (at < body.size() && (body[at] == ' ' || body[at] == '\t')) ++at;
    if (body.compare(at, 2, "\r\n") != 0) return "malformed multipart body (a boundary line)";
    at += 2;
    const size_t head_end = body.find("\r\n\r\n", at);
    const size_t next = body.find("\r\n" + delimiter, at);
    if (next == std::string::npos) return "malformed multipart body (no closing boundary)";
    bool is_file = false;
    if (head_end != std::string::npos && head_end < next) {
      for (size_t h = at; h < head_end + 2;) {
        const size_t eol = body.find("\r\n", h);
        const std::string_view line = std::string_view(body).substr(h, eol - h);
        h = eol + 2;
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos || lower(trim(line.substr(0, colon))) != "content-disposition") continue;
        const auto disposition = header_params(line.substr(colon + 1));
        const auto name = disposition.find("filename"), star = disposition.find("filename*");
        is_file = (name != disposition.end() && !name->second.empty()) || star != disposition.end();
      }
    } else if (body.compare(at, 2, "\r\n") != 0) {
      return "malformed multipart body (a part without its blank line)";
    }
    if (is_file) {
      const size_t start = head_end + 4;
      file = body.substr(start, next - start);
      return "";
    }
    at = next + 2 + delimiter.size();
  }
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

Response error_response(int status, const std::string& message) {
  Response r;
  r.status = status;
  r.body = nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

std::string serialize(const Response& r, bool keep_alive, bool head_only) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += keep_alive && !r.close ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [name, value] : r.headers) out += name + ": " + value + "\r\n";
  out += "\r\n";
  if (!head_only) out += r.body;
  return out;
}

}  // namespace sat::http
