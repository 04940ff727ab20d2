// The page `sat serve` answers GET / with, driven in headless Chromium as a person would use it (tests/page_test.sh
// installs the driver and runs this). For each model: the page loads cleanly; a photo goes in through the file
// input; the caption shown is the one POST /caption gives for the same photo; the keyboard steps to the 3rd word;
// the canvas shows heat where that word's map is high and the bare photo where it is nil; a phone-width screen needs
// no horizontal scroll; a hostile error text stays text; a network failure is shown; no request leaves the server's
// origin; no console or page error beyond the ones a step provokes. Hard attention's glimpse box and the object
// marks are checked on answers the test forges (no shipped model has hard attention). Negative controls: the heat
// check on the bare photo, the scroll check on a too-wide page, and the origin check on a page that does go out.
// usage: node page_test.js SAT ROOT OUT MODULES CHROMIUM
"use strict";
const fs = require("fs");
const path = require("path");
const { spawn } = require("child_process");

const [SAT, ROOT, OUT, MODULES, CHROMIUM] = process.argv.slice(2);
const puppeteer = require(path.join(MODULES, "node_modules", "puppeteer-core"));
const PHOTO = path.join(ROOT, "examples", "dog_and_man.jpg");
const PHOTO_BYTES = fs.readFileSync(PHOTO);
const HOSTILE = `<img src=x onerror="document.documentElement.dataset.injected='1'">`;
let failures = 0, passes = 0;
const check = (ok, what, detail) => {
  if (ok) { passes++; console.log("ok: " + what); } else { failures++; console.log("FAIL: " + what + (detail ? ": " + detail : "")); }
  return ok;
};

// ---- the server ----------------------------------------------------------------------------------------------------
function startServer(model) {
  return new Promise((resolve, reject) => {
    const proc = spawn(SAT, ["serve", "--model", model, "--port", "0"], { stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    const timer = setTimeout(() => { proc.kill("SIGKILL"); reject(new Error("sat serve did not start: " + log)); }, 300000);
    proc.stderr.on("data", (d) => {
      log += d;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve({ proc, url: m[1], log: () => log }); }
    });
    proc.on("exit", (code) => { clearTimeout(timer); reject(new Error("sat serve exited (" + code + "): " + log)); });
  });
}
function stopServer(server) {
  return new Promise((resolve) => {
    server.proc.removeAllListeners("exit");
    server.proc.on("exit", (code) => resolve(code));
    server.proc.kill("SIGTERM");
  });
}

// ---- the attention map as the page should draw it (written again here, from the description in docs/server.md) --
function upsample(grid, width, height) {
  const { rows, cols, weights } = grid, top = Math.max(...weights);
  const axis = (n, cells) => Array.from({ length: n }, (_, x) => {
    let s = (x + 0.5) * cells / n - 0.5, i = Math.floor(s), t = s - i;
    if (i < 0) { i = 0; t = 0; }
    if (i >= cells - 1) { i = cells - 1; t = 0; }
    return [i, Math.min(i + 1, cells - 1), t];
  });
  const ax = axis(width, cols), ay = axis(height, rows), v = new Float32Array(width * height);
  for (let y = 0; y < height; y++)
    for (let x = 0; x < width; x++) {
      const [y0, y1, fy] = ay[y], [x0, x1, fx] = ax[x];
      const at = (r, c) => weights[r * cols + c];
      v[y * width + x] = ((at(y0, x0) * (1 - fx) + at(y0, x1) * fx) * (1 - fy) + (at(y1, x0) * (1 - fx) + at(y1, x1) * fx) * fy) / top;
    }
  return v;
}
// "" when `shown` is `bare` with the heat of map v drawn over it as docs/server.md says; else what is wrong. Strongly
// changed where v >= 0.9, untouched where v < 0.005, and everywhere bare * (1 - 0.65 v) + lut(v) * 0.65 v, lut being
// the colour key the page shows (pinned to inferno by inferno()). skip(x, y): pixels the check leaves out (marks).
function heatProblem(shown, bare, v, lut, w, skip) {
  let hot = 0, hotDiff = 0, coldMax = 0, cold = 0, off = 0, worst = 0, checked = 0;
  for (let p = 0; p < v.length; p++) {
    if (skip(p % w, Math.floor(p / w))) continue;
    checked++;
    let d = 0;
    const a = 0.65 * Math.min(1, v[p]), c = 4 * Math.round(255 * Math.min(1, v[p]));
    for (let k = 0; k < 3; k++) {
      d += Math.abs(shown[4 * p + k] - bare[4 * p + k]);
      const e = Math.abs(shown[4 * p + k] - (bare[4 * p + k] * (1 - a) + lut[c + k] * a));
      worst = Math.max(worst, e);
      if (e > 3) off++;
    }
    if (v[p] >= 0.9) { hot++; hotDiff += d; }
    if (v[p] < 0.005) { cold++; coldMax = Math.max(coldMax, d); }
  }
  if (!hot) return "no pixel where the map is high";
  if (hotDiff / hot < 60) return `pixels where the map is high barely differ from the photo (mean ${(hotDiff / hot).toFixed(1)} over ${hot})`;
  if (cold && coldMax > 3) return `pixels with no attention are changed (by up to ${coldMax} over ${cold})`;
  if (off > 0.001 * checked) return `${off} of ${checked} pixels are not the photo blended with the key's colour at 0.65 v (worst by ${worst.toFixed(1)})`;
  return "";
}
// "" when the key's colours are inferno's at its ends and middle (matplotlib's values, as OpenCV's COLORMAP_INFERNO)
function infernoProblem(lut) {
  const want = { 0: [0, 0, 4], 128: [188, 55, 84], 255: [252, 255, 164] };
  for (const [i, rgb] of Object.entries(want))
    if (rgb.some((c, k) => Math.abs(lut[4 * i + k] - c) > 1)) return `key colour ${i} is ${lut.slice(4 * i, 4 * i + 3)}, not ${rgb}`;
  return "";
}

// ---- the browser -----------------------------------------------------------------------------------------------
// A page whose every request is recorded; those to another origin are aborted (and reported), /caption requests can
// be made to fail or answered with a forged body.
async function openPage(browser, origin) {
  const page = await browser.newPage();
  const t = { page, foreign: [], console: [], errors: [], failNext: false, forge: null, hold: null, captionRequests: 0 };
  await page.setRequestInterception(true);
  page.on("request", (req) => {
    const url = new URL(req.url());
    if (url.protocol === "data:" || url.protocol === "blob:") return req.continue();
    if (url.origin !== origin) { t.foreign.push(req.url()); return req.abort(); }
    if (url.pathname === "/caption") {
      t.captionRequests++;
      if (t.failNext) { t.failNext = false; return req.abort("internetdisconnected"); }
      if (t.hold) { t.hold(req); t.hold = null; return; }
      if (t.forge) { const body = JSON.stringify(t.forge); t.forge = null; return req.respond({ status: 200, contentType: "application/json", body }); }
    }
    req.continue();
  });
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warn") t.console.push(m.text()); });
  page.on("pageerror", (e) => t.errors.push(e.message));
  return t;
}
const state = (page) => page.$eval("#app", (a) => a.dataset.state);
async function settled(page, what) {
  await page.waitForFunction(() => ["done", "error"].includes(document.getElementById("app").dataset.state), { timeout: 180000 });
  return state(page);
}
// The canvas and the same photo drawn bare at its size, as RGBA arrays
async function pixels(page, key = false) {
  const photo = "data:image/jpeg;base64," + PHOTO_BYTES.toString("base64");
  return page.evaluate(async (photo, key) => {
    const view = document.getElementById("view"), w = view.width, h = view.height;
    const img = new Image();
    img.src = photo;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = w; c.height = h;
    const x = c.getContext("2d");
    x.drawImage(img, 0, 0, w, h);
    return { w, h, natural: [img.naturalWidth, img.naturalHeight],
             shown: Array.from(view.getContext("2d").getImageData(0, 0, w, h).data),
             lut: key ? Array.from(document.getElementById("key").getContext("2d").getImageData(0, 0, 256, 1).data) : null,
             bare: Array.from(x.getImageData(0, 0, w, h).data) };
  }, photo, key);
}
const shownWords = (page) => page.$$eval("#caption button", (b) => b.map((x) => x.textContent));
const currentWord = (page) => page.$eval("#caption", (c) => {
  const b = c.querySelectorAll("button[aria-current=true]");
  return b.length === 1 ? b[0].textContent : `${b.length} words marked`;
});
async function noHorizontalScroll(page) {
  return page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth);
}

async function postCaption(url, query) {
  const r = await fetch(url + "/caption?" + query, { method: "POST", body: PHOTO_BYTES });
  return { status: r.status, body: await r.json() };
}

// ---- one model's run -------------------------------------------------------------------------------------------
async function run(browser, model, label, withObjects) {
  console.log(`--- ${label}: ${path.basename(model)}`);
  const server = await startServer(model);
  const origin = server.url;
  try {
    const health = await (await fetch(origin + "/health")).json();
    check(health.objects === withObjects, `${label}: /health says objects ${withObjects}`, JSON.stringify(health));
    const get = await fetch(origin + "/");
    const html = await get.text();
    const csp = get.headers.get("content-security-policy") || "";
    check(get.status === 200 && get.headers.get("content-type") === "text/html; charset=utf-8" &&
          html === fs.readFileSync(path.join(ROOT, "tools", "cli", "page", "index.html"), "utf8"),
          `${label}: GET / is tools/cli/page/index.html as text/html; charset=utf-8`, `${get.status} ${get.headers.get("content-type")}`);
    check(/^default-src 'self'; script-src 'sha256-[A-Za-z0-9+/]+=*'; style-src 'sha256-/.test(csp) && /img-src 'self' blob: data:/.test(csp),
          `${label}: a strict Content-Security-Policy (the page's own script and style by hash)`, csp);
    const head = await fetch(origin + "/", { method: "HEAD" });
    check(head.status === 200 && head.headers.get("content-type") === "text/html; charset=utf-8" &&
          (await head.text()) === "" && head.headers.get("content-security-policy") === csp, `${label}: HEAD / (headers, no body)`);

    const query = "attention=1&candidates=5" + (withObjects ? "&objects=1" : "");
    const api = await postCaption(origin, query);
    check(api.status === 200, `${label}: POST /caption?${query}`, JSON.stringify(api.body).slice(0, 200));
    const want = api.body;

    const t = await openPage(browser, origin);
    const page = t.page;
    await page.setViewport({ width: 1100, height: 900 });
    await page.goto(origin + "/", { waitUntil: "load" });
    await page.waitForFunction(() => document.getElementById("app").dataset.state !== "loading", { timeout: 30000 });
    check(await state(page) === "idle", `${label}: the page loads and asks /health`, await state(page));
    await page.keyboard.press("Tab");
    check(await page.evaluate(() => document.activeElement.id) === "file", `${label}: the first Tab reaches the file input (a photo chosen by keyboard)`);
    const objectsBox = await page.$eval("#objects", (b) => ({ disabled: b.disabled, note: document.getElementById("objects-note").textContent }));
    check(objectsBox.disabled === !withObjects, `${label}: "Find objects" ${withObjects ? "offered" : "disabled: " + objectsBox.note}`);
    if (withObjects) await page.click("#objects");

    const input = await page.$("#file");
    await input.uploadFile(PHOTO);
    check(await settled(page) === "done", `${label}: the caption arrives`, await page.$eval("#error", (e) => e.textContent));
    const words = await shownWords(page);
    check(words.join(" ") === want.caption, `${label}: the page shows POST /caption's caption "${want.caption}"`, words.join(" "));
    const candidates = await page.$$eval("#candidates li", (l) => l.map((x) => ({ text: x.textContent, chosen: x.classList.contains("chosen") })));
    check(candidates.length === want.candidates.length && candidates.every((c, k) => c.text.includes(want.candidates[k].caption) &&
          c.chosen === want.candidates[k].chosen && c.text.includes(want.candidates[k].score.toFixed(3))),
          `${label}: the ${want.candidates.length} candidates with their scores, the chosen one marked`, JSON.stringify(candidates));
    if (withObjects) {
      const objects = await page.$$eval("#objects-list li", (l) => l.map((x) => x.textContent));
      check(want.objects.length > 0 && objects.length === want.objects.length &&
            objects.every((o, k) => o === `${want.objects[k].class} ${want.objects[k].score.toFixed(2)}`),
            `${label}: the objects found, with their scores: ${objects.join(", ")}`, JSON.stringify(want.objects));
    } else {
      check(await page.$eval("#objects-box", (b) => b.hidden), `${label}: no objects section when none were asked`);
    }

    // the 3rd word by keyboard: the arrow keys from anywhere, Enter on the Next button, then back
    await page.evaluate(() => document.activeElement.blur());
    await page.keyboard.press("ArrowRight");
    await page.focus("#next");
    await page.keyboard.press("Enter");
    await page.keyboard.press("ArrowRight");
    await page.keyboard.press("ArrowLeft");
    check(await currentWord(page) === want.words[2], `${label}: → Enter → ← steps to the 3rd word "${want.words[2]}", highlighted`,
          await currentWord(page));
    check((await page.$eval("#position", (p) => p.textContent)).startsWith(`word 3 of ${want.words.length}`), `${label}: "word 3 of ${want.words.length}"`);
    const px = await pixels(page, true);
    check(px.w * px.natural[1] === px.h * px.natural[0], `${label}: the drawing keeps the photo's aspect (${px.w}x${px.h})`);
    const v = upsample(want.attention[2], px.w, px.h);
    // the object marks and their labels are left out of the heat check
    const unit = Math.max(1, Math.round(Math.max(px.w, px.h) / 300));
    const marks = (want.objects || []).map((o) => [o.x * px.w, o.y * px.h]);
    const skip = (x, y) => marks.some(([mx, my]) => x >= mx - 9 * unit && x <= mx + 85 * unit && y >= my - 18 * unit && y <= my + 9 * unit);
    const heat = heatProblem(px.shown, px.bare, v, px.lut, px.w, skip);
    check(heat === "", `${label}: the canvas shows the 3rd word's heat where its map is high, the bare photo where it is nil, ` +
          "inferno blended at 0.65 v in between", heat);
    check(heatProblem(px.bare, px.bare, v, px.lut, px.w, skip) !== "", `${label}: negative control: the same check fails on the bare photo`);
    const colours = infernoProblem(px.lut);
    check(colours === "", `${label}: the colour key is inferno`, colours);
    const key = await page.$eval("#key-hi", (k) => k.textContent);
    check(key === (100 * Math.max(...want.attention[2].weights)).toFixed(1) + "%", `${label}: the colour key reaches the map's maximum, ${key}`);
    await page.screenshot({ path: path.join(OUT, `page-${label}.png`), fullPage: true });

    // a phone's width
    await page.setViewport({ width: 360, height: 780 });
    await new Promise((r) => setTimeout(r, 200));
    check(await noHorizontalScroll(page), `${label}: 360 px wide: no horizontal scroll`,
          String(await page.evaluate(() => document.documentElement.scrollWidth)));
    await page.screenshot({ path: path.join(OUT, `page-${label}-360.png`), fullPage: true });
    await page.evaluate(() => { const d = document.createElement("div"); d.id = "wide"; d.textContent = "x"; d.style.width = "500px"; document.body.appendChild(d); });
    check(!(await noHorizontalScroll(page)), `${label}: negative control: a 500 px element does make the page scroll`);
    await page.evaluate(() => document.getElementById("wide").remove());
    await page.setViewport({ width: 1100, height: 900 });
    check(t.console.length === 0 && t.errors.length === 0, `${label}: no console message or page error so far`, JSON.stringify([t.console, t.errors]));

    // the server's error, carrying markup, shown as text
    await page.click("#include");
    await page.keyboard.type(HOSTILE);
    await page.keyboard.press("Enter");
    check(await settled(page) === "error", `${label}: an unknown word to include: an error`);
    const shown = await page.evaluate(() => ({ text: document.getElementById("error").textContent, children: document.getElementById("error").children.length,
                                               images: document.querySelectorAll("img").length, injected: document.documentElement.dataset.injected || "" }));
    check(shown.text.includes(HOSTILE) && shown.text.includes("(400)") && shown.children === 0 && shown.images === 0 && shown.injected === "",
          `${label}: the server's error with <img onerror> in it shows as text: ${shown.text}`, JSON.stringify(shown));
    check(t.console.length === 1 && /status of 400/.test(t.console[0]), `${label}: its only console message is the browser's note of the 400`, JSON.stringify(t.console));
    t.console.length = 0;
    // a network failure, then a good answer again
    await page.$eval("#include", (i) => { i.value = ""; });
    t.failNext = true;
    await page.click("#again");
    check(await settled(page) === "error" && (await page.$eval("#error", (e) => e.textContent)).startsWith("Could not reach the server"),
          `${label}: a network failure is shown: ${await page.$eval("#error", (e) => e.textContent)}`);
    check(t.console.length <= 1 && t.console.every((m) => /ERR_INTERNET_DISCONNECTED/.test(m)), `${label}: no console message but the failed request's`, JSON.stringify(t.console));
    t.console.length = 0;
    // the request held until the page's waiting state is seen
    const held = new Promise((resolve) => { t.hold = resolve; });
    await page.click("#again");
    const request = await held;
    const waiting = await page.evaluate(() => ({ state: document.getElementById("app").dataset.state, status: document.getElementById("status").textContent,
                                                 busy: document.getElementById("result").getAttribute("aria-busy") }));
    check(waiting.state === "working" && waiting.status === "Captioning dog_and_man.jpg…" && waiting.busy === "true",
          `${label}: while it waits: "${waiting.status}", busy`, JSON.stringify(waiting));
    request.continue();
    check(await settled(page) === "done" && (await shownWords(page)).join(" ") === want.caption && await page.$eval("#error", (e) => e.hidden),
          `${label}: captioned again after the errors, the error gone`);

    // a photo dropped on the drop zone
    await page.evaluate(async (b64) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)), data = new DataTransfer();
      data.items.add(new File([bytes], "dropped.jpg", { type: "image/jpeg" }));
      const zone = document.getElementById("drop");
      zone.dispatchEvent(new DragEvent("dragover", { dataTransfer: data, bubbles: true, cancelable: true }));
      zone.dispatchEvent(new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true }));
    }, PHOTO_BYTES.toString("base64"));
    check(await settled(page) === "done" && (await shownWords(page)).join(" ") === want.caption &&
          (await page.$eval("#status", (s) => s.textContent)) === "Captioned dropped.jpg.", `${label}: a photo dropped on the page: its caption`);

    if (!withObjects) await forged(t);

    check(t.console.length === 0 && t.errors.length === 0, `${label}: no console message or page error`, JSON.stringify([t.console, t.errors]));
    check(t.foreign.length === 0, `${label}: no request to any other origin`, t.foreign.join(" "));
    check(t.captionRequests >= 4, `${label}: the interception saw the page's /caption requests (${t.captionRequests})`);
    // the Content-Security-Policy holds too: the page itself cannot reach another origin
    const blocked = await page.evaluate(() => new Promise((resolve) => {
      document.addEventListener("securitypolicyviolation", (e) => resolve(e.violatedDirective), { once: true });
      fetch("http://example.invalid/").catch(() => 0);
    }));
    check(blocked === "connect-src", `${label}: the page's policy refuses a request to another origin (${blocked})`);
    await page.close();
  } finally {
    const code = await stopServer(server);
    check(code === 0, `${label}: sat serve stopped cleanly on SIGTERM`, server.log());
  }
}

// Hard attention's glimpse box and the objects' marks, on forged answers (the same words and maps): what the first
// draws beyond the second lies on the glimpse cell's outline and at the object's mark.
async function forged(t) {
  const page = t.page, rows = 4, cols = 4;
  const weights = Array.from({ length: rows * cols }, (_, k) => (k === 15 ? 0.5 : 0.5 / 15));
  const plain = { caption: "a b c", words: ["a", "b", "c"], logprob: -3, attention: [0, 1, 2].map(() => ({ rows, cols, weights })) };
  const withExtras = Object.assign({}, plain, { glimpses: [[0, 1], [1, 1], [2, 2]], objects: [{ class: "dog", score: 0.5, x: 0.2, y: 0.75 }] });
  const draw = async (answer) => {
    t.forge = answer;
    await page.click("#again");
    await settled(page);
    return pixels(page);
  };
  const a = await draw(withExtras), b = await draw(plain);
  // the outline's strokes are centred on the cell's edges (columns 1..2, rows 0..1 of the 4x4 grid): the pixels just
  // either side of each edge are drawn over
  const x0 = a.w / cols, x1 = 2 * a.w / cols, y0 = 0, y1 = a.h / rows;
  const near = (p, e) => p >= e - 1 && p < e + 1;
  let onEdge = 0, edge = 0, nearMark = 0;
  for (let y = 0; y < a.h; y++)
    for (let x = 0; x < a.w; x++) {
      const p = 4 * (y * a.w + x), differs = [0, 1, 2].some((k) => a.shown[p + k] !== b.shown[p + k]);
      const along = (x >= x0 - 1 && x < x1 + 1 && (near(y, y0) || near(y, y1))) || (y >= y0 - 1 && y < y1 + 1 && (near(x, x0) || near(x, x1)));
      if (along) { edge++; if (differs) onEdge++; }
      if (Math.hypot(x - 0.2 * a.w, y - 0.75 * a.h) < 3 && differs) nearMark++;
    }
  check(onEdge >= 0.95 * edge, `forged hard attention: the glimpse cell (row 1, column 2) outlined (${onEdge} of ${edge} edge pixels drawn)`);
  check(nearMark > 5, `forged objects: a mark where the object peaks (${nearMark} pixels)`);
  // a model without attention: the photo alone, a note, no colour key
  const none = await draw({ caption: "a b c", words: ["a", "b", "c"], logprob: -3 });
  const noneShown = await page.evaluate(() => ({ note: !document.getElementById("attention-note").hidden, key: document.getElementById("key-box").hidden }));
  check(none.shown.every((c, k) => c === none.bare[k]) && noneShown.note && noneShown.key,
        "forged answer without attention: the bare photo, a note, no colour key", JSON.stringify(noneShown));
  check((await page.$$eval("#objects-list li", (l) => l.map((x) => x.textContent))).join() === "" &&
        await page.$eval("#objects-box", (b) => b.hidden), "forged: the answer without objects shows no objects section");
}

(async () => {
  fs.mkdirSync(OUT, { recursive: true });
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-extensions", "--no-first-run",
           "--disable-component-update", "--disable-default-apps", "--disable-sync"],
  });
  try {
    console.log("browser: " + (await browser.version()));
    await run(browser, path.join(ROOT, "models", "flickr8k-inception.sat"), "inception", false);
    const shared = path.join(ROOT, "..", "shared", "models");
    if (fs.existsSync(path.join(shared, "resnet_v2_101")) && fs.existsSync(path.join(shared, "centernet_mobilenetv3")))
      await run(browser, path.join(ROOT, "models", "flickr8k.sat"), "default-objects", true);
    else console.log(`skipped: the default model with objects (it needs ${shared}: the ResNet-101 v2 weights and the detector)`);
    // negative control of the origin check: a page that does reach out is caught by the same interception
    const t = await openPage(browser, "http://127.0.0.1:1");
    await t.page.setContent(`<img src="http://example.invalid/x.png">`);
    await new Promise((r) => setTimeout(r, 300));
    check(t.foreign.length === 1, "negative control: the interception catches a request to another origin", JSON.stringify(t.foreign));
    await t.page.close();
  } catch (e) {
    check(false, "the test ran to its end", e.stack);
  } finally {
    await browser.close();
  }
  console.log(`${passes} passed, ${failures} failed`);
  process.exit(failures ? 1 : 0);
})();
