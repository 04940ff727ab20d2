// sat serve's request parser (tools/cli/http.hpp): any bytes a client sends, as the server reads them, in pieces.
// Beyond the sanitizers, it checks what the server relies on: a head parsed whole or fed in two pieces gives the same
// verdict (the resumed search for the blank line misses nothing), an accepted head is within the limits and ends
// where the parser says, an error is one of the statuses the server answers, and a multipart body is read within it.
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "tools/cli/http.hpp"

using namespace sat::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes((const char*)data, size);
  Limits limits;
  limits.max_request_line = 256;
  limits.max_header_bytes = 1024;
  limits.max_headers = 16;
  limits.max_body = 4096;

  Request whole;
  size_t scanned = 0;
  const HeadResult r = parse_head(bytes, limits, whole, scanned);
  Request pieces;
  size_t scanned2 = 0;
  const size_t cut = size ? data[0] % size : 0;
  HeadResult first = parse_head(bytes.substr(0, cut), limits, pieces, scanned2);
  if (first.kind == HeadResult::need_more) {
    pieces = Request{};
    first = parse_head(bytes, limits, pieces, scanned2);
    if (first.kind != r.kind || first.status != r.status || first.head_bytes != r.head_bytes) abort();
  }
  static const std::set<int> statuses = {400, 411, 413, 414, 431, 505};
  if (r.kind == HeadResult::error && !statuses.count(r.status)) abort();
  if (r.kind == HeadResult::done) {
    if (r.head_bytes > size || bytes.substr(r.head_bytes - 4, 4) != "\r\n\r\n") abort();
    if (whole.content_length > limits.max_body || whole.headers.size() > limits.max_headers) abort();
    if (whole.path.empty() || whole.path[0] != '/') abort();
    for (const auto& [name, value] : whole.headers)
      for (char c : name)
        if (c >= 'A' && c <= 'Z') abort();
    const std::string body(bytes.substr(r.head_bytes));
    const std::string* type = whole.header("content-type");
    std::string file;
    if (type && multipart_file(body, *type, file).empty() && file.size() > body.size()) abort();
    (void)serialize(error_response(400, std::string(bytes.substr(0, 64))), whole.keep_alive, whole.method == "HEAD");
  }
  return 0;
}
