#!/usr/bin/env bash
# Installs the Debian 12 packages sat builds with, if any are missing (uses sudo when not root).
# --test: also what the whole test suite needs (tests/run-all.sh): clang and its OpenMP runtime for the sanitizer and
# fuzzing build, Chromium for the browser tests of the HTML report and the serve page, Node.js and npm for the latter.
set -euo pipefail
# ocl-icd-opencl-dev: libdnnl-dev only recommends it, but Debian's oneDNN is built with the OpenCL GPU runtime and
# its CMake config (find_package(dnnl)) fails without the OpenCL headers and library.
# libopenmpi-dev, openmpi-bin: data-parallel sat train under mpirun (SAT_MPI; sat builds and tests without them).
# pybind11-dev, python3-dev, python3-numpy: the Python module, import sat (SAT_PYTHON; built when pybind11 is found).
# curl: tools/fetch-weights.sh downloads the ResNet weights with it (and the server test sends its requests with it).
pkgs=(build-essential cmake pkg-config libdnnl-dev ocl-icd-opencl-dev libopencv-dev libeigen3-dev libstb-dev doctest-dev
      nlohmann-json3-dev libcli11-dev libstemmer-dev wordnet-base python3 libopenmpi-dev openmpi-bin
      pybind11-dev python3-dev python3-numpy curl)
if [ "${1:-}" = --test ]; then
  pkgs+=(clang libomp-dev ccache  # the ASan/UBSan + libFuzzer build (tests/fuzz); ccache: rebuilds reuse objects
         chromium          # the report and page tests open sat report's and sat serve's pages in headless Chromium
         python3-pytest python3-matplotlib)  # the Python module's tests (tests/python), its attention pictures
  # the page test (tests/page_test.sh) drives Chromium with puppeteer-core from npm (Node.js 18 or later); a Node.js
  # installed otherwise, with its own npm, is used as it is (Debian's npm would conflict with it)
  command -v node >/dev/null && command -v npm >/dev/null || pkgs+=(nodejs npm)
elif [ $# -gt 0 ]; then
  echo "usage: tools/install-deps.sh [--test]" >&2
  exit 2
fi
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
