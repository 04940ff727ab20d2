// The report page: static HTML for every text (escaped here, so the page reads without its script), the attention
// maps as JSON numbers, and a small script that sorts, filters and draws a word's map on a canvas over its photo.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "train/report.hpp"
#include "vision/overlay.hpp"

namespace sat {

using nlohmann::json;

namespace {

// The page's test (tests/report_test.sh) reads the markers set here: html[data-error] when any script fails,
// body[data-ready], body[data-cards], body[data-shown], and per canvas data-drawn (the word shown), data-drawn-sum (sum
// of the drawn, normalized map) and data-box (hard attention: the glimpse's row,column).
const char* const kStyle = R"CSS(
:root { --ink: #1d1d1f; --muted: #5f6368; --line: #d9dce1; --warn: #a3271b; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink);
       background: #f4f5f7; }
header { padding: 14px 24px 6px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 10px; }
h1 code { font-size: 17px; overflow-wrap: anywhere; }
.summary { display: flex; flex-wrap: wrap; gap: 12px 40px; align-items: flex-start; }
table { border-collapse: collapse; }
caption { text-align: left; font-weight: 600; padding-bottom: 2px; }
th, td { padding: 2px 12px 2px 0; text-align: left; vertical-align: top; }
.scores th { color: var(--muted); font-weight: normal; }
.scores td { font-weight: 600; font-variant-numeric: tabular-nums; }
.objects { max-width: 100%; overflow-x: auto; }
.objects th { color: var(--muted); font-weight: normal; }
.objects thead th, .objects td { text-align: right; white-space: nowrap; }
.objects td { font-variant-numeric: tabular-nums; }
.objects .pool { border-left: 1px solid var(--line); padding-left: 12px; }
.settings { max-width: 900px; }
.settings th { color: var(--muted); font-weight: normal; white-space: nowrap; }
.settings td { overflow-wrap: anywhere; }
.note { color: var(--muted); max-width: 1150px; margin: 8px 0; }
.skipped { color: var(--warn); }
.skipped ul { margin: 2px 0 8px; }
.error { background: #fdecea; color: var(--warn); padding: 10px 24px; font-weight: 600; }
.controls { position: sticky; top: 0; z-index: 2; display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center;
            padding: 8px 24px; background: #fff; border-top: 1px solid var(--line); border-bottom: 1px solid var(--line); }
.controls input[type=number] { width: 5.5em; }
.controls input[type=search] { width: 15em; }
#shown { color: var(--muted); }
#cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; padding: 12px 24px 32px; }
.card { display: flex; gap: 14px; padding: 12px; background: #fff; border: 1px solid var(--line); border-radius: 6px; }
.card[hidden] { display: none; }
.photo { position: relative; flex: none; background: #000; }
.photo img, .photo canvas { position: absolute; left: 0; top: 0; width: 100%; height: 100%; }
.about { min-width: 0; }
.about h2 { font-size: 13px; margin: 0 0 4px; color: var(--muted); overflow-wrap: anywhere; }
.caption { font-size: 16px; margin: 0 0 2px; }
.word { cursor: pointer; padding: 1px 3px; border-radius: 3px; }
.word:hover, .word:focus { background: #e3eafc; outline: none; }
.word.active { background: #1f4fd1; color: #fff; }
.word.end { color: var(--muted); font-size: 12px; }
.word.end.active { color: #fff; }
.key { color: var(--muted); white-space: nowrap; }
.key .bar { display: inline-block; width: 120px; height: 10px; vertical-align: middle; }
.maplabel { font-size: 12px; color: var(--muted); margin: 0 0 6px; min-height: 1.45em; }
.pscores { margin: 0 0 6px; font-variant-numeric: tabular-nums; }
.pscores span { margin-right: 14px; white-space: nowrap; }
.refs { margin: 0; padding-left: 20px; color: #333; }
)CSS";

// In <head>: any later script error shows a banner and marks the page, syntax errors in the main script included.
const char* const kErrorScript = R"JS(
window.addEventListener("error", function (event) {
  var message = (event.message || "script error") + (event.lineno ? " (line " + event.lineno + ")" : "");
  document.documentElement.setAttribute("data-error", message);
  var banner = document.getElementById("error");
  if (banner) {
    banner.textContent = "This page's script failed: " + message + ". Captions and scores are shown, attention maps may not be.";
    banner.hidden = false;
  }
});
)JS";

const char* const kMainScript = R"JS(
(function () {
  "use strict";
  var body = document.body;
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var gh = data.grid[0], gw = data.grid[1], uniform = 1 / (gh * gw), inferno = data.inferno;
  var list = document.getElementById("cards");
  var cards = Array.prototype.slice.call(list.querySelectorAll(".card"));
  var sortBy = document.getElementById("sort"), filter = document.getElementById("filter");
  var minCider = document.getElementById("min-cider"), maxCider = document.getElementById("max-cider");
  var drawAs = document.getElementById("draw-as"), shown = document.getElementById("shown");

  function value(element, key) { return parseFloat(element.dataset[key]); }
  function byIndex(a, b) { return value(a, "index") - value(b, "index"); }
  function byScore(key, sign) { return function (a, b) { return sign * (value(a, key) - value(b, key)) || byIndex(a, b); }; }
  var orders = {
    "set": byIndex,
    "cider-desc": byScore("cider", -1),
    "cider-asc": byScore("cider", 1),
    "bleu4-desc": byScore("bleu4", -1),
    "rouge-desc": byScore("rouge", -1),
    "file": function (a, b) { var x = a.dataset.file, y = b.dataset.file; return x < y ? -1 : x > y ? 1 : byIndex(a, b); }
  };
  function isOrder(name) { return Object.prototype.hasOwnProperty.call(orders, name); }

  function applyView() {
    var query = filter.value.trim().toLowerCase();
    var lo = parseFloat(minCider.value), hi = parseFloat(maxCider.value), count = 0;
    cards.slice().sort(isOrder(sortBy.value) ? orders[sortBy.value] : byIndex).forEach(function (card) {
      list.appendChild(card);
      var cider = value(card, "cider");
      var text = (card.dataset.file + "\n" + card.dataset.caption).toLowerCase();
      var keep = (!query || text.indexOf(query) >= 0) && !(cider < lo) && !(cider > hi);
      card.hidden = !keep;
      if (keep) count++;
    });
    shown.textContent = count === cards.length ? cards.length + " photos" : count + " of " + cards.length + " photos";
    body.dataset.shown = String(count);
  }

  // Pixel i of n samples the grid (cells across the photo) at (i + 0.5) * cells / n - 0.5, between cell centres: the
  // grid covers the whole photo, which the encoder saw squashed to a square. Per pixel: two cells and the second's weight.
  function axis(n, cells) {
    var first = new Int32Array(n), second = new Int32Array(n), weight = new Float32Array(n);
    for (var i = 0; i < n; i++) {
      var s = Math.min(Math.max((i + 0.5) * cells / n - 0.5, 0), cells - 1);
      first[i] = Math.floor(s);
      second[i] = Math.min(first[i] + 1, cells - 1);
      weight[i] = s - first[i];
    }
    return { first: first, second: second, weight: weight };
  }
  function clamp01(x) { return x < 0 ? 0 : x > 1 ? 1 : x; }

  function drawBox(ctx, row, col, width, height) {
    var half = (data.window - 1) / 2;
    var x0 = Math.max(col - half, 0) * width / gw, x1 = Math.min(col + half + 1, gw) * width / gw;
    var y0 = Math.max(row - half, 0) * height / gh, y1 = Math.min(row + half + 1, gh) * height / gh;
    ctx.lineWidth = 4;
    ctx.strokeStyle = "#000";
    ctx.strokeRect(x0 + 2, y0 + 2, x1 - x0 - 4, y1 - y0 - 4);
    ctx.lineWidth = 2;
    ctx.strokeStyle = "#fff";
    ctx.strokeRect(x0 + 2, y0 + 2, x1 - x0 - 4, y1 - y0 - 4);
  }

  // Word k's map over the photo (k < 0: none), its range stretched to the colour map as sat attend does.
  function draw(card, k) {
    var photo = data.photos[value(card, "index")];
    var canvas = card.querySelector("canvas"), label = card.querySelector(".maplabel");
    var chips = card.querySelectorAll(".word");
    for (var c = 0; c < chips.length; c++) chips[c].classList.toggle("active", c === k);
    var ctx = canvas.getContext("2d"), width = canvas.width, height = canvas.height;
    ctx.clearRect(0, 0, width, height);
    if (k < 0 || k >= photo.maps.length) {
      delete canvas.dataset.drawn;
      delete canvas.dataset.drawnSum;
      delete canvas.dataset.box;
      label.textContent = label.dataset.hint;
      return;
    }
    // v: the weight over the word's largest (the maps are stored that way, in thousandths), as sat attend draws it:
    // the inferno colour of v with opacity 0.65 v, so where the model did not look the photo shows untouched.
    var map = photo.maps[k].map, xs = axis(width, gw), ys = axis(height, gh), spotlight = drawAs.value === "spotlight";
    var image = ctx.createImageData(width, height), px = image.data, sum = 0;
    for (var y = 0; y < height; y++) {
      var r0 = ys.first[y] * gw, r1 = ys.second[y] * gw, fy = ys.weight[y];
      for (var x = 0; x < width; x++) {
        var x0 = xs.first[x], x1 = xs.second[x], fx = xs.weight[x];
        var v = (1 - fy) * ((1 - fx) * map[r0 + x0] + fx * map[r0 + x1]) + fy * ((1 - fx) * map[r1 + x0] + fx * map[r1 + x1]);
        v = clamp01(v / 1000);
        var o = 4 * (y * width + x);
        if (spotlight) {
          px[o + 3] = 215 * (1 - v);  // dark where the model did not look
        } else {
          var c = 3 * Math.round(255 * v);
          px[o] = inferno[c];
          px[o + 1] = inferno[c + 1];
          px[o + 2] = inferno[c + 2];
          px[o + 3] = 255 * 0.65 * v;
        }
        sum += v;
      }
    }
    ctx.putImageData(image, 0, 0);
    canvas.dataset.drawn = String(k);
    canvas.dataset.drawnSum = sum.toFixed(1);
    var text = "\u201c" + chips[k].textContent + "\u201d: largest weight " + photo.maps[k].peak.toPrecision(3) +
               " (uniform would be " + uniform.toPrecision(2) + ")";
    if (photo.loc && photo.loc[k] >= 0) {
      var row = Math.floor(photo.loc[k] / gw), col = photo.loc[k] % gw;
      drawBox(ctx, row, col, width, height);
      canvas.dataset.box = row + "," + col;
      text += "; glimpse at row " + (row + 1) + ", column " + (col + 1);
    } else {
      delete canvas.dataset.box;
    }
    label.textContent = text;
  }

  function wordAt(target) {
    var chip = target && target.closest ? target.closest(".word") : null;
    return chip ? { chip: chip, card: chip.closest(".card"), k: value(chip, "k") } : null;
  }
  function pinned(card) { return card.dataset.pinned === undefined ? -1 : value(card, "pinned"); }
  function togglePin(word) {
    if (pinned(word.card) === word.k) delete word.card.dataset.pinned;
    else word.card.dataset.pinned = String(word.k);
    draw(word.card, word.k);
  }
  function preview(event) {
    var word = wordAt(event.target);
    if (word) draw(word.card, word.k);
  }
  function leave(event) {
    var word = wordAt(event.target);
    if (word && !(event.relatedTarget && word.chip.contains(event.relatedTarget))) draw(word.card, pinned(word.card));
  }
  list.addEventListener("mouseover", preview);
  list.addEventListener("focusin", preview);
  list.addEventListener("mouseout", leave);
  list.addEventListener("focusout", leave);
  list.addEventListener("click", function (event) {
    var word = wordAt(event.target);
    if (word) togglePin(word);
  });
  list.addEventListener("keydown", function (event) {
    var word = wordAt(event.target);
    if (word && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      togglePin(word);
    }
  });
  [sortBy, filter, minCider, maxCider].forEach(function (control) { control.addEventListener("input", applyView); });
  if (drawAs) {
    drawAs.addEventListener("input", function () {
      cards.forEach(function (card) {
        var canvas = card.querySelector("canvas");
        if (canvas && canvas.dataset.drawn !== undefined) draw(card, value(canvas, "drawn"));
      });
    });
  }

  // The address may set the view: #sort=cider-asc&q=dog&min=0.5&max=2&draw=spotlight, and #demo pins the first word
  // of the first photo shown (as a click would), so a headless browser runs the drawing code.
  function readAddress() {
    var params = new URLSearchParams(location.hash.slice(1));
    if (isOrder(params.get("sort"))) sortBy.value = params.get("sort");
    if (params.has("q")) filter.value = params.get("q");
    if (params.has("min")) minCider.value = params.get("min");
    if (params.has("max")) maxCider.value = params.get("max");
    if (drawAs && params.get("draw") === "spotlight") drawAs.value = "spotlight";
    applyView();
    if (params.has("demo")) {
      var chip = list.querySelector(".card:not([hidden]) .word");
      if (chip) togglePin(wordAt(chip));
    }
  }
  window.addEventListener("hashchange", readAddress);
  readAddress();
  body.dataset.cards = String(cards.length);
  body.dataset.ready = "1";
})();
)JS";

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string attribute_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string scores_table(const CaptionScores& s) {
  std::string h = "<table class=\"scores\"><caption>Corpus scores</caption>\n";
  auto row = [&](const std::string& name, const std::string& value) {
    h += "<tr><th>" + name + "</th><td>" + value + "</td></tr>\n";
  };
  row("photos", std::to_string(s.images));
  for (int k = 0; k < 4; ++k) row("BLEU-" + std::to_string(k + 1), fixed(s.bleu[k], 4));
  row("METEOR", s.meteor >= 0 ? fixed(s.meteor, 4) : "n/a");
  row("ROUGE-L", fixed(s.rouge_l, 4));
  row("CIDEr-D", fixed(s.cider_d, 4));
  row("length ratio", fixed(s.length_ratio, 3));
  return h + "</table>\n";
}

// The object table of sat eval (train/object_mentions.hpp), turned on its side so that it is wide rather than tall and
// the header leaves room for the photos; nothing for scores recorded without one.
std::string objects_table(const ObjectTable& t) {
  if (t.rows.empty()) return "";
  std::vector<const ObjectRow*> columns;
  for (const ObjectRow& r : t.rows) columns.push_back(&r);
  columns.push_back(&t.rare);
  std::string h = "<div class=\"objects\"><table><caption>Objects named</caption>\n<thead><tr><th></th>";
  for (const ObjectRow* c : columns)
    h += std::string("<th") + (c == &t.rare ? " class=\"pool\"" : "") + " data-object=\"" + html_escape(c->name) +
         "\">" + html_escape(c->name) + "</th>";
  h += "</tr></thead>\n<tbody>\n";
  auto row = [&](const char* name, const char* title, const std::function<std::string(const ObjectRow&)>& value) {
    h += std::string("<tr data-count=\"") + name + "\"><th title=\"" + title + "\">" + name + "</th>";
    for (const ObjectRow* c : columns)
      h += std::string("<td") + (c == &t.rare ? " class=\"pool\"" : "") + ">" + value(*c) + "</td>";
    h += "</tr>\n";
  };
  row("photos", "photos at least 3 references name it in", [](const ObjectRow& r) { return std::to_string(r.photos); });
  row("named", "of those, the photos whose caption names it",
      [](const ObjectRow& r) { return std::to_string(r.named); });
  row("recall", "named / photos",
      [](const ObjectRow& r) { return r.photos > 0 ? fixed(r.recall(), 3) : std::string("&ndash;"); });
  row("false", "captions naming it on photos no reference names it in",
      [](const ObjectRow& r) { return std::to_string(r.false_mentions); });
  row("none", "photos no reference names it in", [](const ObjectRow& r) { return std::to_string(r.unnamed_photos); });
  return h + "</tbody></table></div>\n";
}

std::string attention_note(const Report& r) {
  if (r.attention == "none")
    return "This model has no attention (the baseline <code>none</code>: the decoder sees the photo only through its "
           "initial state, the mean of the grid), so there is no map to show.";
  const std::string grid = std::to_string(r.grid_h) + "&times;" + std::to_string(r.grid_w);
  std::string note =
      "Point at a word (or reach it with Tab) to see where the model looked when it wrote it; click it (or press "
      "Enter) "
      "to keep it. The " +
      grid +
      " attention grid covers the whole photo (the encoder saw it squashed to a square); "
      "each map is drawn smoothly between cell centres, its colour and opacity rising from no weight (the photo "
      "untouched) to the word's largest weight (yellow), as <code>sat attend</code> draws it. "
      "<code>&lt;end&gt;</code> is the step that ended the caption.";
  if (r.attention == "hard")
    note += " Hard attention: the box is the glimpse, the cell the decoder took its features from" +
            std::string(r.hard_window > 1 ? " with the " + std::to_string(r.hard_window) + "&times;" +
                                                std::to_string(r.hard_window) + " window around it"
                                          : "") +
            ".";
  return note;
}

std::string card_html(const Report& r, const ReportPhoto& p, size_t index) {
  const bool attends = r.attention != "none";
  const std::string caption = join_words(p.words);
  std::string h = "<article class=\"card\" id=\"photo-" + std::to_string(index) + "\" data-index=\"" +
                  std::to_string(index) + "\" data-file=\"" + html_escape(p.file_name) + "\" data-caption=\"" +
                  html_escape(caption) + "\" data-cider=\"" + attribute_number(p.cider_d) + "\" data-bleu4=\"" +
                  attribute_number(p.bleu_4) + "\" data-rouge=\"" + attribute_number(p.rouge_l) + "\">\n";
  const std::string w = std::to_string(p.width), ht = std::to_string(p.height);
  h += "<div class=\"photo\" style=\"width:" + w + "px;height:" + ht + "px\"><img src=\"data:image/jpeg;base64," +
       base64_encode(p.jpeg) + "\" width=\"" + w + "\" height=\"" + ht + "\" alt=\"" + html_escape(p.file_name) + "\">";
  if (attends) h += "<canvas width=\"" + w + "\" height=\"" + ht + "\"></canvas>";
  h += "</div>\n<div class=\"about\">\n<h2>" + html_escape(p.file_name) + "</h2>\n<p class=\"caption\">";
  // A chip per word and one for <end> when its step has a map; only chips with a map respond.
  const size_t chips = p.words.size() + (p.alphas.size() > p.words.size() ? 1 : 0);
  for (size_t k = 0; k < chips; ++k) {
    const bool end = k == p.words.size();
    const std::string text = html_escape(end ? "<end>" : p.words[k]);
    if (k > 0) h += ' ';
    if (k < p.alphas.size())
      h += "<span class=\"word" + std::string(end ? " end" : "") + "\" tabindex=\"0\" data-k=\"" + std::to_string(k) +
           "\">" + text + "</span>";
    else
      h += "<span>" + text + "</span>";
  }
  const std::string hint =
      attends ? "point at or click a word to see its attention map" : "no attention map (this model does not attend)";
  h += "</p>\n<p class=\"maplabel\" data-hint=\"" + hint + "\">" + hint + "</p>\n";
  h += "<p class=\"pscores\"><span>CIDEr-D <b>" + fixed(p.cider_d, 3) + "</b></span> <span>BLEU-4 <b>" +
       fixed(p.bleu_4, 3) + "</b></span> <span>ROUGE-L <b>" + fixed(p.rouge_l, 3) +
       "</b></span></p>\n<ol class=\"refs\">";
  for (const std::string& ref : p.references) h += "<li>" + html_escape(ref) + "</li>";
  return h + "</ol>\n</div>\n</article>\n";
}

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string script_safe_json(const json& value) {
  const std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<')
      out += "\\u003c";  // only inside strings: JSON has no '<' elsewhere
    else
      out += c;
  }
  return out;
}

// The key's colours as CSS gradient stops (", #rrggbb" each).
static std::string gradient_stops() {
  std::string stops;
  for (int i = 0; i <= 8; ++i) {
    const cv::Vec3b c = inferno_bgr(i / 8.0);
    char hex[16];
    std::snprintf(hex, sizeof hex, ", #%02x%02x%02x", c[2], c[1], c[0]);
    stops += hex;
  }
  return stops;
}

json attention_map_json(const std::vector<float>& alpha) {
  float peak = 0;
  for (float a : alpha) peak = std::max(peak, a);
  json map = json::array();
  for (float a : alpha) map.push_back(peak > 0 ? (int)std::lround(1000.0 * std::max(a, 0.f) / peak) : 0);
  char rounded[32];
  std::snprintf(rounded, sizeof rounded, "%.4g", (double)peak);
  return {{"peak", std::strtod(rounded, nullptr)}, {"map", std::move(map)}};
}

std::string report_html(const Report& r) {
  const bool attends = r.attention != "none";
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
      html_escape("sat report: " + r.title) + "</title>\n<style>" + kStyle + "</style>\n<script>" + kErrorScript +
      "</script>\n</head>\n<body>\n<div id=\"error\" class=\"error\" role=\"alert\" hidden></div>\n";
  h += "<header>\n<h1>Attention report <code>" + html_escape(r.title) + "</code></h1>\n<div class=\"summary\">\n" +
       scores_table(r.scores) + "<table class=\"settings\"><caption>Model and run</caption>\n";
  for (const auto& [key, text] : r.settings)
    h += "<tr><th>" + html_escape(key) + "</th><td>" + html_escape(text) + "</td></tr>\n";
  h += "</table>\n" + objects_table(r.scores.objects) + "</div>\n";
  h += "<p class=\"note\">Corpus scores as <code>sat eval</code> computes them (coco-caption's definitions; METEOR "
       "without "
       "its paraphrase stage). Per photo: CIDEr-D is the photo's term of the corpus CIDEr-D (document frequencies from "
       "the references of the photos in this report; the terms average to the corpus score), BLEU-4 is coco-caption's "
       "sentence BLEU-4 of the caption alone, ROUGE-L as in the corpus mean.</p>\n";
  if (!r.scores.objects.rows.empty())
    h += "<p class=\"note\">Objects named: <em>photos</em> where at least 3 references name the object, how many "
         "captions name it there (<em>named</em>, <em>recall</em>) and where no reference does (<em>false</em>, of "
         "<em>none</em> photos); word lists in docs/metrics.md.</p>\n";
  h += "<p class=\"note\">" + attention_note(r) +
       "</p>\n<noscript><p class=\"note\">Sorting, filtering and the "
       "attention maps need JavaScript.</p></noscript>\n";
  if (!r.skipped.empty()) {
    h += "<div class=\"skipped\">" + std::to_string(r.skipped.size()) +
         " unreadable photo(s) left out of the report and its scores:<ul>";
    for (const SkippedPhoto& s : r.skipped) h += "<li>" + html_escape(s.message) + "</li>";
    h += "</ul></div>\n";
  }
  h += "</header>\n<nav class=\"controls\" aria-label=\"Sort and filter\">\n"
       "<label>Sort <select id=\"sort\"><option value=\"set\">data order</option><option value=\"cider-desc\">CIDEr-D, "
       "best first</option><option value=\"cider-asc\">CIDEr-D, worst first</option><option "
       "value=\"bleu4-desc\">BLEU-4, "
       "best first</option><option value=\"rouge-desc\">ROUGE-L, best first</option><option value=\"file\">file name"
       "</option></select></label>\n"
       "<label>Filter <input id=\"filter\" type=\"search\" placeholder=\"words of the caption or file name\"></label>\n"
       "<label>CIDEr-D from <input id=\"min-cider\" type=\"number\" step=\"0.1\"></label>\n"
       "<label>to <input id=\"max-cider\" type=\"number\" step=\"0.1\"></label>\n";
  if (attends)
    h += "<label>Draw <select id=\"draw-as\"><option value=\"heat\">heat map</option><option value=\"spotlight\">"
         "spotlight</option></select></label>\n<span class=\"key\">0 <span class=\"bar\" style=\"background: "
         "linear-gradient(to right" + gradient_stops() + ")\"></span> the word's largest weight</span>\n";
  h += "<span id=\"shown\">" + std::to_string(r.photos.size()) + " photos</span>\n</nav>\n<main id=\"cards\">\n";
  json photos = json::array();
  for (size_t i = 0; i < r.photos.size(); ++i) {
    const ReportPhoto& p = r.photos[i];
    h += card_html(r, p, i);
    json entry = {{"maps", json::array()}};
    if (attends)
      for (const auto& alpha : p.alphas) entry["maps"].push_back(attention_map_json(alpha));
    if (r.attention == "hard") entry["loc"] = p.locations;
    photos.push_back(std::move(entry));
  }
  json inferno = json::array();  // 256 RGB colours, flat: the colour map sat attend draws with
  for (int i = 0; i < 256; ++i) {
    const cv::Vec3b c = inferno_bgr(i / 255.0);
    inferno.insert(inferno.end(), {c[2], c[1], c[0]});
  }
  const json data = {{"grid", {r.grid_h, r.grid_w}},
                     {"inferno", std::move(inferno)},
                     {"attention", r.attention},
                     {"window", r.hard_window},
                     {"photos", std::move(photos)}};
  h += "</main>\n<script type=\"application/json\" id=\"report-data\">" + script_safe_json(data) +
       "</script>\n<script>" + kMainScript + "</script>\n</body>\n</html>\n";
  return h;
}

}  // namespace sat
