#!/usr/bin/env bash
# The page sat serve answers GET / with, in headless Chromium: tests/page/page_test.js drives it through
# puppeteer-core, installed with npm ci from the committed lock file into OUT (the build folder), never the source
# tree. Screenshots (page-*.png) are left in OUT. usage: tests/page_test.sh SAT OUT
set -u
mkdir -p "$2/node"
SAT="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
OUT="$(cd "$2" && pwd)"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ] || ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "FAIL: the page test needs chromium, node and npm (tools/install-deps.sh --test installs them)"
  exit 1
fi
# npm ci again only when the lock file changed
if ! cmp -s "$ROOT/tests/page/package-lock.json" "$OUT/node/package-lock.json" || [ ! -d "$OUT/node/node_modules/puppeteer-core" ]; then
  cp "$ROOT/tests/page/package.json" "$ROOT/tests/page/package-lock.json" "$OUT/node/"
  if ! (cd "$OUT/node" && PUPPETEER_SKIP_DOWNLOAD=1 timeout 600 npm ci --no-audit --no-fund --loglevel=error); then
    rm -f "$OUT/node/package-lock.json"
    echo "FAIL: npm ci of tests/page/package-lock.json"
    exit 1
  fi
fi
exec timeout 600 node "$ROOT/tests/page/page_test.js" "$SAT" "$ROOT" "$OUT" "$OUT/node" "$CHROMIUM"
