// sat serve's HTTP parser (tools/cli/http.hpp): what it accepts, and every way of hiding or bloating a request it
// refuses. The attack suite (tests/attack_test.py) runs the same against a live server.
#include <doctest/doctest.h>

#include <string>

#include "tools/cli/http.hpp"

using namespace sat::http;

namespace {
HeadResult parse(const std::string& bytes, Request& req, const Limits& limits = Limits{}) {
  size_t scanned = 0;
  return parse_head(bytes, limits, req, scanned);
}
int status_of(const std::string& bytes, const Limits& limits = Limits{}) {
  Request req;
  const HeadResult r = parse(bytes, req, limits);
  return r.kind == HeadResult::error ? r.status : r.kind == HeadResult::done ? 200 : 0;
}
}  // namespace

TEST_CASE("http: a request's head, its query decoded, its body's length; more bytes wait") {
  Request req;
  const std::string head = "POST /caption?beam=3&include=hot+dog&x=%41%2b HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
  const HeadResult r = parse(head + "hello", req);
  REQUIRE(r.kind == HeadResult::done);
  CHECK(r.head_bytes == head.size());
  CHECK(req.method == "POST");
  CHECK(req.path == "/caption");
  CHECK(req.content_length == 5);
  CHECK(req.keep_alive);
  CHECK(req.params.find("beam")->second == "3");
  CHECK(req.params.find("include")->second == "hot dog");
  CHECK(req.params.find("x")->second == "A+");
  CHECK(*req.header("host") == "a");
  Request partial;
  CHECK(parse(head.substr(0, head.size() - 1), partial).kind == HeadResult::need_more);
  // byte by byte, the blank line is found once, where it ends
  Request dripped;
  size_t scanned = 0;
  HeadResult last;
  for (size_t n = 1; n <= head.size(); ++n) last = parse_head(std::string_view(head).substr(0, n), Limits{}, dripped, scanned);
  CHECK(last.kind == HeadResult::done);
  CHECK(last.head_bytes == head.size());
  CHECK(status_of("GET / HTTP/1.0\r\n\r\n") == 200);
  Request old;
  parse("GET / HTTP/1.0\r\n\r\n", old);
  CHECK_FALSE(old.keep_alive);
  Request closing;
  parse("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n", closing);
  CHECK_FALSE(closing.keep_alive);
}

TEST_CASE("http: heads that could hide or smuggle a request are refused") {
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n") == 400);
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length : 1\r\n\r\n") == 400);
  CHECK(status_of("POST / HTTP/1.1\r\nX: 1\r\n Content-Length: 1\r\n\r\n") == 400);
  CHECK(status_of("POST / HTTP/1.1\nContent-Length: 1\r\n\r\n") == 400);
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: 1\rX: 2\r\n\r\n") == 400);
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n") == 400);
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n") == 400);
  CHECK(status_of("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") == 411);
  CHECK(status_of("GET http://a/ HTTP/1.1\r\n\r\n") == 400);
  CHECK(status_of("GET /a b HTTP/1.1\r\n\r\n") == 400);
  CHECK(status_of("GET /%zz HTTP/1.1\r\n\r\n") == 400);
  CHECK(status_of("GET /%00 HTTP/1.1\r\n\r\n") == 400);
  CHECK(status_of("GET / HTTP/2.0\r\n\r\n") == 505);
  CHECK(status_of("GET / HTTP/1.1\r\nX: a\x01\r\n\r\n") == 400);
  // negative control: the same heads written plainly are accepted
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: 1\r\n\r\n") == 200);
  CHECK(status_of("POST / HTTP/1.1\r\nX: 1\r\nContent-Length: 1\r\n\r\n") == 200);
}

TEST_CASE("http: limits on the request line, the headers and the body, checked before the head ends") {
  Limits small;
  small.max_request_line = 64;
  small.max_header_bytes = 128;
  small.max_headers = 4;
  small.max_body = 1000;
  CHECK(status_of("GET /" + std::string(100, 'a'), small) == 414);  // no line end yet: refused already
  CHECK(status_of("GET /" + std::string(100, 'a') + " HTTP/1.1\r\n\r\n", small) == 414);
  CHECK(status_of("GET / HTTP/1.1\r\nX: " + std::string(200, 'a'), small) == 431);  // no blank line yet
  CHECK(status_of("GET / HTTP/1.1\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\ne: 1\r\n\r\n", small) == 431);
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", small) == 413);
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", small) == 400);
  // at the limits: accepted
  CHECK(status_of("GET / HTTP/1.1\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\n\r\n", small) == 200);
  CHECK(status_of("POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n", small) == 200);
}

TEST_CASE("http: the first file part of a multipart body") {
  const std::string type = "multipart/form-data; boundary=\"XyZ\"";
  const std::string body =
      "--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nx\r\n"
      "--XyZ\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.jpg\"\r\nContent-Type: image/jpeg\r\n\r\n"
      "\xFF\xD8--XyZ not a boundary\r\n\r\n--XyZ--\r\n";
  std::string file;
  CHECK(multipart_file(body, type, file) == "");
  CHECK(file == "\xFF\xD8--XyZ not a boundary\r\n");
  CHECK(multipart_file(body, "multipart/form-data", file) == "multipart request without a usable boundary");
  CHECK(multipart_file("--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nx\r\n--XyZ--\r\n", type, file) ==
        "multipart request without a file part");
  CHECK(multipart_file("--XyZ\r\nContent-Disposition: form-data; filename=\"a\"\r\n\r\nunfinished", type, file) ==
        "malformed multipart body (no closing boundary)");
}

TEST_CASE("http: answers carry their length and whether the connection stays") {
  Response r = error_response(503, "busy \"now\"");
  r.headers.emplace_back("Retry-After", "1");
  const std::string text = serialize(r, true, false);
  CHECK(text.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0) == 0);
  CHECK(text.find("Content-Length: 24\r\n") != std::string::npos);
  CHECK(text.find("Connection: keep-alive\r\n") != std::string::npos);
  CHECK(text.find("Retry-After: 1\r\n") != std::string::npos);
  CHECK(text.substr(text.size() - 24) == "{\"error\":\"busy \\\"now\\\"\"}");
  r.close = true;
  const std::string head = serialize(r, true, true);
  CHECK(head.find("Connection: close\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");  // HEAD: the length, no body
}
