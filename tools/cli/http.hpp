// HTTP/1.1 as sat serve speaks it: a strict request parser with stated limits, and responses. Pure functions over
// bytes (no sockets), so that the fuzz target (tests/fuzz/fuzz_http_request.cpp) runs exactly what the server runs.
//
// Strict on purpose: the server may sit behind a proxy, and every leniency two parsers do not share (a bare LF, a
// space before a header's colon, a folded header line, two Content-Lengths, Transfer-Encoding beside a length) is a
// way to hide one request inside another. Anything outside the plain form is refused and the connection closed.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sat::http {

struct Limits {
  size_t max_request_line = 8192;  // 414 beyond
  size_t max_header_bytes = 16384;  // the header lines together; 431 beyond
  size_t max_headers = 64;          // 431 beyond
  size_t max_body = 20u << 20;      // a declared Content-Length beyond: 413, the body never read
};

struct Request {
  std::string method, target, path, version;
  std::multimap<std::string, std::string> params;        // the query, decoded
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed
  size_t content_length = 0;  // 0 without a Content-Length header: a request without one has no body
  std::string body;
  bool keep_alive = true;

  const std::string* header(std::string_view lower_name) const;
};

// The outcome of parse_head over the bytes received so far.
struct HeadResult {
  enum Kind { need_more, done, error } kind = need_more;
  size_t head_bytes = 0;  // done: the request line and headers with their blank line
  int status = 0;         // error: the status to answer (400, 405, 411, 413, 414, 431, 501, 505), then close
  std::string message;    // error: one line
};

// Parses a request's line and headers from the start of `bytes` (which may hold less, or more: the body and what
// follows). `scanned` carries how far an earlier call looked for the blank line, so a head that arrives a byte at a
// time is not searched again from its start (start it at 0 for each request).
HeadResult parse_head(std::string_view bytes, const Limits& limits, Request& out, size_t& scanned);

// The query string (after '?') as name/value pairs: '+' is a space, %XX a byte. False on a malformed escape.
bool parse_query(std::string_view query, std::multimap<std::string, std::string>& out);
// A path's %XX escapes decoded. False on a malformed escape or a decoded NUL.
bool percent_decode(std::string_view in, std::string& out, bool plus_is_space);

// The first file part of a multipart/form-data body (the first part whose Content-Disposition names a filename,
// whatever its field name). "" when found (its bytes in `file`), else the message to answer 400 with.
std::string multipart_file(const std::string& body, const std::string& content_type, std::string& file);

struct Response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // beyond Content-Type, Content-Length, Connection
  std::string content_type = "application/json", body;
  bool close = false;  // close the connection once written (set for every error the parser answers)
};

// {"error": message} with that status.
Response error_response(int status, const std::string& message);
const char* reason_phrase(int status);
// Status line, headers and (unless head_only, for HEAD) the body.
std::string serialize(const Response& r, bool keep_alive, bool head_only);

}  // namespace sat::http
