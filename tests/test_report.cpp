#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "train/report.hpp"

using namespace sat;
using nlohmann::json;

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The JSON the page's script parses: the text of <script type="application/json" id="report-data">.
json embedded_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const size_t start = html.find(open);
  REQUIRE(start != std::string::npos);
  const size_t end = html.find("</script>", start);
  REQUIRE(end != std::string::npos);
  return json::parse(html.substr(start + open.size(), end - start - open.size()));
}

const std::string kHostile = "<script>alert(\"x\")</script> & 'quoted' <img src=x onerror=\"alert(1)\">";
const std::string kHostileEscaped =
    "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;quoted&#39; &lt;img src=x "
    "onerror=&quot;alert(1)&quot;&gt;";

Report hostile_report(const std::string& attention) {
  Report r;
  r.title = "models/<b>\"m\".sat";
  r.settings = {{"data", "d</td><script>x</script>"}};
  r.attention = attention;
  r.grid_h = 2;
  r.grid_w = 3;
  r.hard_window = 3;
  r.scores.images = 2;
  for (int i = 0; i < 2; ++i) {
    ReportPhoto p;
    p.file_name = i == 0 ? "a\"b<i>'c.png" : "plain.png";
    p.words = {"a", "<script>", "dog"};
    if (attention != "none") {
      p.alphas = {
          {0.5f, 0.25f, 0.25f, 0, 0, 0}, {0, 0, 0, 0, 0, 1}, {0.1f, 0.2f, 0.3f, 0.2f, 0.1f, 0.1f}, {0, 0, 0, 0, 0, 0}};
      if (attention == "hard") p.locations = {0, 5, 2, 1};
    }
    p.references = {kHostile, "a dog runs"};
    p.cider_d = 1.25 - i;
    p.jpeg = "\xff\xd8\xff";
    p.width = 224;
    p.height = 168;
    r.photos.push_back(p);
  }
  r.skipped.push_back({"bad<1>.png", "images/bad<1>.png: cannot decode image (corrupt or not an image)"});
  return r;
}

}  // namespace

TEST_CASE("report: html_escape escapes markup, ampersands and both quotes") {
  CHECK(html_escape(kHostile) == kHostileEscaped);
  CHECK(html_escape("a dog runs") == "a dog runs");
  CHECK(html_escape("") == "");
  CHECK(html_escape("&amp;") == "&amp;amp;");  // escaping twice shows the text, not the entity
  CHECK(html_escape("caf\xc3\xa9 \xe2\x80\x9cq\xe2\x80\x9d") == "caf\xc3\xa9 \xe2\x80\x9cq\xe2\x80\x9d");  // UTF-8 kept
}

TEST_CASE("report: script_safe_json cannot end its script element and reads back unchanged") {
  const json value = {{"caption", "</script><script>alert(1)</script><!-- x -->"},
                      {"numbers", {1, 2.5, -3}},
                      {"nested", {{"<key>", "a<b"}}}};
  const std::string text = script_safe_json(value);
  CHECK(text.find('<') == std::string::npos);
  CHECK(text.find("\\u003c/script>") != std::string::npos);
  CHECK(json::parse(text) == value);
  // invalid UTF-8 (a file name from a foreign system) does not throw; it becomes U+FFFD
  const std::string bad = script_safe_json(json{{"file", std::string("a\xff.png")}});
  CHECK(json::parse(bad)["file"] == "a\xef\xbf\xbd.png");
}

TEST_CASE("report: attention maps are embedded as thousandths of their peak") {
  json m = attention_map_json({0.1f, 0.5f, 0.25f, 0.0f, 0.15f, 0.0004f});
  CHECK(m["peak"].get<double>() == doctest::Approx(0.5));
  CHECK(m["map"] == json({200, 1000, 500, 0, 300, 1}));
  // the peak keeps 4 significant digits, so the numbers stay short in the page
  m = attention_map_json({0.123456f, 0.0123456f});
  CHECK(m["peak"].get<double>() == 0.1235);
  CHECK(m["map"] == json({1000, 100}));
  CHECK(m.dump() == "{\"map\":[1000,100],\"peak\":0.1235}");
  // no attention: all zeros, no division by zero
  m = attention_map_json({0, 0, 0, 0});
  CHECK(m["peak"].get<double>() == 0);
  CHECK(m["map"] == json({0, 0, 0, 0}));
  CHECK(attention_map_json({})["map"].empty());
  // a uniform 14x14 map, the longest there is: every cell 1000, at most 5 bytes a cell
  m = attention_map_json(std::vector<float>(196, 1.f / 196));
  CHECK(m["map"].size() == 196);
  CHECK(m["map"][17] == 1000);
  CHECK(m.dump().size() <= 5 * 196 + 40);
}

TEST_CASE("report: base64 as RFC 4648") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("foob") == "Zm9vYg==");
  CHECK(base64_encode("fooba") == "Zm9vYmE=");
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  CHECK(base64_encode(std::string("\xff\xd8\xff\x00", 4)) == "/9j/AA==");
}

TEST_CASE("report: the page escapes every text and embeds each word's map as numbers") {
  const Report r = hostile_report("soft");
  const std::string html = report_html(r);
  // the only script elements are the page's own three: error banner, data, main
  CHECK(count(html, "<script") == 3);
  CHECK(count(html, "</script>") == 3);
  CHECK(html.find("onerror=\"alert") == std::string::npos);
  CHECK(html.find("<img src=x") == std::string::npos);
  CHECK(html.find("models/<b>") == std::string::npos);
  CHECK(count(html, "<li>" + kHostileEscaped + "</li>") == 2);  // each photo's reference
  CHECK(html.find("data-file=\"a&quot;b&lt;i&gt;&#39;c.png\"") != std::string::npos);
  CHECK(html.find("<h2>a&quot;b&lt;i&gt;&#39;c.png</h2>") != std::string::npos);
  CHECK(html.find("data-caption=\"a &lt;script&gt; dog\"") != std::string::npos);
  CHECK(html.find(">&lt;script&gt;</span>") != std::string::npos);  // the word chip
  CHECK(html.find("<code>models/&lt;b&gt;&quot;m&quot;.sat</code>") != std::string::npos);
  CHECK(html.find("d&lt;/td&gt;&lt;script&gt;x&lt;/script&gt;") != std::string::npos);
  CHECK(html.find("images/bad&lt;1&gt;.png: cannot decode image") != std::string::npos);
  CHECK(html.find("http://") == std::string::npos);  // self-contained: nothing to fetch
  CHECK(html.find("https://") == std::string::npos);
  CHECK(count(html, "<article class=\"card\"") == 2);
  CHECK(count(html, "<canvas width=\"224\" height=\"168\">") == 2);
  CHECK(count(html, "src=\"data:image/jpeg;base64,/9j/\"") == 2);
  CHECK(html.find("data-cider=\"1.25\"") != std::string::npos);
  // 3 words and <end>, each a chip with its map's index
  CHECK(count(html, "class=\"word\" tabindex=\"0\"") == 2 * 3);
  CHECK(count(html, "class=\"word end\" tabindex=\"0\" data-k=\"3\">&lt;end&gt;</span>") == 2);

  const json data = embedded_data(html);
  CHECK(data["grid"] == json({2, 3}));
  CHECK(data["attention"] == "soft");
  REQUIRE(data["photos"].size() == 2);
  const json& maps = data["photos"][0]["maps"];
  REQUIRE(maps.size() == 4);
  for (size_t k = 0; k < 4; ++k) CHECK(maps[k] == attention_map_json(r.photos[0].alphas[k]));
  CHECK(maps[0]["map"] == json({1000, 500, 500, 0, 0, 0}));
  CHECK(maps[1]["map"] == json({0, 0, 0, 0, 0, 1000}));
  CHECK(!data["photos"][0].contains("loc"));
}

TEST_CASE("report: hard attention embeds the glimpse locations") {
  const json data = embedded_data(report_html(hostile_report("hard")));
  CHECK(data["attention"] == "hard");
  CHECK(data["window"] == 3);
  CHECK(data["photos"][1]["loc"] == json({0, 5, 2, 1}));
}

TEST_CASE("report: without attention the page says there is no map and embeds none") {
  const std::string html = report_html(hostile_report("none"));
  CHECK(html.find("<canvas") == std::string::npos);
  CHECK(html.find("id=\"draw-as\"") == std::string::npos);
  CHECK(html.find("there is no map to show") != std::string::npos);
  CHECK(count(html, "no attention map (this model does not attend)</p>") == 2);
  CHECK(html.find("class=\"word") == std::string::npos);  // no chip responds
  CHECK(html.find("<span>&lt;script&gt;</span>") != std::string::npos);
  const json data = embedded_data(html);
  CHECK(data["photos"][0]["maps"].empty());
}

TEST_CASE("report: the object table as sat eval counts it, and none for scores recorded without one") {
  Report r = hostile_report("soft");
  CHECK(report_html(r).find("class=\"objects\"") == std::string::npos);
  // both photos: four references name the dog, and so does the caption
  const std::vector<std::string> captions(2, "a dog");
  const std::vector<std::vector<std::string>> references(2, {"a dog runs", "the dog", "dogs", "a dog"});
  r.scores.objects = object_table(captions, references);
  const std::string html = report_html(r);
  CHECK(count(html, "<div class=\"objects\">") == 1);
  // on its side: a column per group, then the rarer objects pooled; a row per count
  CHECK(html.find("<thead><tr><th></th><th data-object=\"person\">person</th><th data-object=\"dog\">dog</th><th "
                  "data-object=\"bicycle\">bicycle</th>") != std::string::npos);
  CHECK(html.find("<th data-object=\"snow sports\">snow sports</th><th class=\"pool\" data-object=\"rarer "
                  "objects\">rarer objects</th></tr></thead>") != std::string::npos);
  auto cells = [](const std::string& person, const std::string& dog, const std::string& rarer,
                  const std::string& pool) {
    std::string h = "<td>" + person + "</td><td>" + dog + "</td>";
    for (int g = 0; g < 10; ++g) h += "<td>" + rarer + "</td>";
    return h + "<td class=\"pool\">" + pool + "</td></tr>";
  };
  CHECK(html.find("<tr data-count=\"photos\"><th title=\"photos at least 3 references name it in\">photos</th>" +
                  cells("0", "2", "0", "0")) != std::string::npos);
  CHECK(html.find(">named</th>" + cells("0", "2", "0", "0")) != std::string::npos);
  CHECK(html.find(">recall</th>" + cells("&ndash;", "1.000", "&ndash;", "&ndash;")) != std::string::npos);
  CHECK(html.find(">false</th>" + cells("0", "0", "0", "0")) != std::string::npos);
  CHECK(html.find(">none</th>" + cells("2", "0", "2", "20")) != std::string::npos);
}
