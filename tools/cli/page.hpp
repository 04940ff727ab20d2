// The page `sat serve` answers GET / with (tools/cli/page/index.html, compiled into the binary) and the
// Content-Security-Policy it is served under.
#pragma once
#include <string>

namespace sat {

const std::string& serve_page();
// Everything from the page's own origin only, no plugins, frames or form posts; inline code only the page's own
// <script> and <style> blocks, by their sha256 (so markup injected into the page could run nothing).
std::string page_security_policy(const std::string& html);

}  // namespace sat
