// Damaged photos (vision/damage.hpp), files that are not regular files, and caption-file image names that leave
// their folder (datasets/coco.hpp): each refused with a one-line error, and each check shown to pass what is whole.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sys/stat.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "datasets/coco.hpp"
#include "datasets/stb_codecs.hpp"
#include "tests/scratch.hpp"
#include "vision/damage.hpp"
#include "vision/image.hpp"

using namespace sat;
using test::error_of;
using test::TempDir;

namespace {

// A photo-like picture (smooth shapes and some noise), so that its JPEG has the long and short codes a photo's has.
cv::Mat picture(int rows, int cols) {
  cv::Mat img(rows, cols, CV_8UC3);
  for (int y = 0; y < rows; ++y)
    for (int x = 0; x < cols; ++x)
      img.at<cv::Vec3b>(y, x) = cv::Vec3b((uchar)(x * 255 / cols), (uchar)(y * 255 / rows), (uchar)((x ^ y) & 255));
  cv::circle(img, {cols / 3, rows / 2}, rows / 4, cv::Scalar(30, 200, 90), -1);
  cv::Mat grain(rows, cols, CV_8UC3);
  cv::RNG rng(48);
  rng.fill(grain, cv::RNG::UNIFORM, 0, 24);
  return img + grain;
}

std::string jpeg_of(const cv::Mat& img, const std::vector<int>& params = {}) {
  std::vector<uchar> buf;
  REQUIRE(cv::imencode(".jpg", img, buf, params));
  return std::string(buf.begin(), buf.end());
}

// Where the first scan's entropy-coded data starts.
size_t scan_data(const std::string& jpg) {
  const size_t sos = jpg.find("\xFF\xDA");
  REQUIRE(sos != std::string::npos);
  return sos + 2 + ((uint8_t)jpg[sos + 2] << 8 | (uint8_t)jpg[sos + 3]);
}

// Where the first scan's entropy-coded data ends: its first marker that is neither a stuffed FF nor a restart.
size_t scan_end(const std::string& jpg) {
  for (size_t at = scan_data(jpg); at + 1 < jpg.size(); ++at)
    if ((uint8_t)jpg[at] == 0xFF && jpg[at + 1] != 0 && ((uint8_t)jpg[at + 1] & 0xF8) != 0xD0) return at;
  FAIL("no marker after the first scan");
  return 0;
}

bool starts(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

TEST_CASE("damaged JPEGs: whole files of every kind stb reads pass; cut and corrupt ones are named") {
  const cv::Mat img = picture(150, 230);  // not multiples of 16: partial MCUs at the right and bottom
  cv::Mat grey;
  cv::cvtColor(img, grey, cv::COLOR_BGR2GRAY);
  const std::vector<std::pair<const char*, std::string>> whole = {
      {"baseline 4:2:0", jpeg_of(img)},
      {"stb's encoder, 4:4:4", encode_jpeg(img, 95)},
      {"stb's encoder, 4:2:0", encode_jpeg(img, 60)},
      {"optimized tables", jpeg_of(img, {cv::IMWRITE_JPEG_OPTIMIZE, 1})},
      {"restart every 3 MCUs", jpeg_of(img, {cv::IMWRITE_JPEG_RST_INTERVAL, 3})},
      {"progressive", jpeg_of(img, {cv::IMWRITE_JPEG_PROGRESSIVE, 1})},
      {"progressive, restarts", jpeg_of(img, {cv::IMWRITE_JPEG_PROGRESSIVE, 1, cv::IMWRITE_JPEG_RST_INTERVAL, 2})},
      {"grey", jpeg_of(grey)},
      {"grey progressive", jpeg_of(grey, {cv::IMWRITE_JPEG_PROGRESSIVE, 1})},
      {"quality 100", jpeg_of(img, {cv::IMWRITE_JPEG_QUALITY, 100})},
  };
  for (const auto& [kind, jpg] : whole) {
    const std::string coding = kind;  // CAPTURE's lambda cannot capture a structured binding (C++17)
    CAPTURE(coding);
    CHECK(jpeg_damage(jpg) == "");
    CHECK(decode_image_bgr(jpg.data(), jpg.size(), "a.jpg").cols == 230);
    CHECK(jpeg_damage(jpg + "trailing bytes a camera appended") == "");

    // the first scan cut in half and an end-of-image marker: the issue's photo, decoded with its lower half grey
    const std::string half = jpg.substr(0, (scan_data(jpg) + scan_end(jpg)) / 2) + "\xFF\xD9";
    const std::string what = jpeg_damage(half);
    CHECK(starts(what, "scan 1's data ends at MCU "));
    CHECK(starts(error_of([&] { decode_image_bgr(half.data(), half.size(), "half.jpg"); }),
                 "half.jpg: damaged JPEG: scan 1"));
    CHECK_THROWS_AS(decode_image_bgr(half.data(), half.size(), "half.jpg"), DamagedImage);
    CHECK(decode_image_bgr(half.data(), half.size(), "half.jpg", DecodeOptions{true}).cols == 230);

    // four bytes of data more than the blocks take, before the end-of-image marker (libjpeg: "extraneous bytes")
    const std::string padded = jpg.substr(0, jpg.size() - 2) + std::string("\x12\x34\x56\x78", 4) + "\xFF\xD9";
    CHECK(jpeg_damage(padded).find("bytes of data left after MCU") != std::string::npos);
  }
}

TEST_CASE("damaged JPEGs: markers out of order, missing scans and corrupt bytes") {
  const cv::Mat img = picture(96, 128);
  // restart markers count 0..7 and repeat: one out of turn is damage
  const std::string rst = jpeg_of(img, {cv::IMWRITE_JPEG_RST_INTERVAL, 1});
  const size_t first = rst.find("\xFF\xD0", scan_data(rst));
  REQUIRE(first != std::string::npos);
  std::string swapped = rst;
  swapped[first + 1] = (char)0xD3;
  CHECK(jpeg_damage(swapped).find("restart marker FFD0 missing before MCU 1") != std::string::npos);
  std::string stray = rst;
  stray.insert(stray.size() - 2, "\xFF\xD5");  // a restart after the last MCU
  CHECK(jpeg_damage(stray).find("more restart intervals") != std::string::npos);

  // a progressive JPEG cut at a scan boundary and given an end-of-image marker: every block coded, but the last
  // refinements missing (a blurry photo, no sign of it in the pixels' layout)
  const std::string prog = jpeg_of(img, {cv::IMWRITE_JPEG_PROGRESSIVE, 1});
  const size_t last_scan = prog.rfind("\xFF\xDA");
  REQUIRE(last_scan > scan_data(prog));
  const std::string early = prog.substr(0, last_scan) + "\xFF\xD9";
  CHECK(jpeg_damage(early).find("scans end before component") != std::string::npos);
  // the same scan twice: a coefficient refined past what was sent
  std::string twice = prog.substr(0, prog.size() - 2);
  const size_t second = twice.find("\xFF\xDA", scan_data(prog));
  const size_t after_second = twice.find("\xFF\xDA", second + 2);
  REQUIRE(after_second != std::string::npos);
  twice += twice.substr(second, after_second - second) + "\xFF\xD9";
  CHECK(jpeg_damage(twice).find("out of sequence") != std::string::npos);

  // structure: no frame, a segment running past the end, data where a marker belongs, no end at all
  const std::string jpg = jpeg_of(img);
  CHECK(jpeg_damage("\xFF\xD8\xFF\xD9") == "no frame header");
  CHECK(jpeg_damage(jpg.substr(0, 30)).find("runs past the end of the file") != std::string::npos);
  std::string junk = jpg;
  junk.insert(2, "xyz");
  CHECK(starts(jpeg_damage(junk), "data where a marker belongs, at byte 2"));
  CHECK(jpeg_damage(jpg.substr(0, jpg.size() - 2)) == "no end-of-image marker (cut short?)");

  // Bytes changed at random inside the scan data: most are caught, none crashes the check, and what is caught the
  // decoder refuses. A changed byte that still decodes to valid codes of the right length is undetectable (JPEG
  // has no checksum): the rate is printed, and the check must catch well over half (photos: docs/cli.md).
  std::mt19937 rng(48);
  int caught = 0;
  const int trials = 300;
  const size_t begin = scan_data(jpg), end = jpg.size() - 2;
  for (int t = 0; t < trials; ++t) {
    std::string bad = jpg;
    for (int k = 0; k < 3; ++k) {
      const size_t at = begin + rng() % (end - begin);
      if ((uint8_t)bad[at] == 0xFF || (at > 0 && (uint8_t)bad[at - 1] == 0xFF)) continue;  // keep stuffing intact
      bad[at] = (char)((uint8_t)bad[at] ^ (1u << (rng() % 8)));
    }
    if (bad == jpg) continue;
    if (!jpeg_damage(bad).empty()) {
      ++caught;
      CHECK_THROWS_AS(decode_image_bgr(bad.data(), bad.size(), "bad.jpg"), DamagedImage);
    }
  }
  MESSAGE("three flipped bits in a " << jpg.size() << "-byte JPEG's scan data: " << caught << " of " << trials
                                     << " caught");
  CHECK(caught > trials / 2);
}

TEST_CASE("damaged JPEGs: Flickr8k's photos all pass (the check's false alarms)") {
  std::ifstream list(std::string(SAT_SHARED_DATA) + "/flickr8k/dev.txt");
  std::string line;
  int photos = 0;
  double seconds = 0;
  for (; photos < 200 && std::getline(list, line); ++photos) {
    CAPTURE(line);
    const std::string bytes = read_file(std::string(SAT_SHARED_DATA) + "/flickr8k/images/" + line);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(jpeg_damage(bytes) == "");
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (photos == 0)
    MESSAGE("no Flickr8k photos beside the checkout: nothing checked");
  else
    MESSAGE(photos << " Flickr8k dev photos checked, " << 1000 * seconds / photos << " ms each");
}

TEST_CASE("damaged PNGs: a chunk's checksum, a cut file, no IEND") {
  std::vector<uchar> buf;
  REQUIRE(cv::imencode(".png", picture(40, 50), buf));
  const std::string png(buf.begin(), buf.end());
  CHECK(png_damage(png) == "");
  CHECK(decode_image_bgr(png.data(), png.size(), "a.png").cols == 50);
  // one bit of the compressed pixels: zlib may inflate it into other pixels; the chunk's CRC says it changed
  const size_t idat = png.find("IDAT");
  REQUIRE(idat != std::string::npos);
  std::string flipped = png;
  flipped[idat + 40] = (char)((uint8_t)flipped[idat + 40] ^ 4);
  CHECK(png_damage(flipped) == "chunk IDAT at byte " + std::to_string(idat - 4) + " fails its checksum (corrupt data)");
  CHECK(error_of([&] { decode_image_bgr(flipped.data(), flipped.size(), "f.png"); }) ==
        "f.png: damaged PNG: chunk IDAT at byte " + std::to_string(idat - 4) + " fails its checksum (corrupt data)");
  // the checksum itself damaged: the pixels are whole, and allow_damaged reads them
  std::string bad_crc = png;
  const size_t iend = png.find("IEND");
  bad_crc[iend + 4] = (char)((uint8_t)bad_crc[iend + 4] ^ 1);
  CHECK_THROWS_AS(decode_image_bgr(bad_crc.data(), bad_crc.size(), "c.png"), DamagedImage);
  CHECK(cv::norm(decode_image_bgr(bad_crc.data(), bad_crc.size(), "c.png", DecodeOptions{true}),
                 decode_image_bgr(png.data(), png.size(), "a.png"), cv::NORM_INF) == 0);
  CHECK(png_damage(png.substr(0, png.size() - 12)) == "no IEND chunk (cut short?)");
  CHECK(png_damage(png.substr(0, idat + 20)).find("chunk IDAT at byte") != std::string::npos);
  CHECK(png_damage(png + "after IEND") == "");
}

TEST_CASE("files that are not regular files are refused before they are read: a named pipe never hangs") {
  TempDir dir;
  const std::string fifo = dir.file("photo.jpg");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(error_of([&] { load_image_bgr(fifo); }) == fifo + ": is a named pipe, not a regular file");
  CHECK(error_of([&] { read_file(fifo); }) == fifo + ": is a named pipe, not a regular file");
  CHECK(error_of([&] { MappedFile m(fifo); }) == fifo + ": is a named pipe, not a regular file");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // a blocked open would never return
  CHECK(error_of([&] { load_image_bgr("/dev/null"); }) == "/dev/null: is a device, not a regular file");
  CHECK(error_of([&] { load_image_bgr(dir.path); }) == dir.path + ": is a directory, expected a file");
  // a regular file still reads (the negative control of the checks above)
  std::vector<uchar> buf;
  REQUIRE(cv::imencode(".png", picture(8, 8), buf));
  write_file_atomic(dir.file("a.png"), std::string(buf.begin(), buf.end()));
  CHECK(load_image_bgr(dir.file("a.png")).cols == 8);
}

TEST_CASE("caption files: image names that leave the image folder are refused, naming the file and the entry") {
  CHECK(image_name_problem("x.jpg") == "");
  CHECK(image_name_problem("train2014/x.jpg") == "");
  CHECK(image_name_problem("./a/../x.jpg") == "");
  CHECK(image_name_problem("a//b/x.jpg") == "");
  CHECK(image_name_problem("..x.jpg") == "");  // a file name that begins with two dots
  CHECK(image_name_problem("../x.jpg") == "leaves the image folder");
  CHECK(image_name_problem("../../secret/x.jpg") == "leaves the image folder");
  CHECK(image_name_problem("a/../../x.jpg") == "leaves the image folder");
  CHECK(image_name_problem("a/b/../../..") == "leaves the image folder");
  CHECK(image_name_problem("/etc/passwd") == "is an absolute path (image names are relative to the image folder)");
  CHECK(image_name_problem("") == "is an empty file name");
  CHECK(image_name_problem(std::string("x.jpg\0.png", 10)) == "holds a NUL byte");

  TempDir dir;
  const std::string coco = dir.write("c.json", R"({"images": [{"id": 1, "file_name": "a.jpg"},
      {"id": 2, "file_name": "../../secret/x.jpg"}], "annotations": []})");
  CHECK(error_of([&] { load_coco_captions(coco, dir.path); }) ==
        coco + ": images[1]: image '../../secret/x.jpg' leaves the image folder");
  const std::string csv = dir.write("c.csv", "image,caption\na.jpg,a dog\n/etc/passwd,a file\n");
  CHECK(error_of([&] { load_flickr_captions_csv(csv, dir.path); }) ==
        csv + ": line 3: image '/etc/passwd' is an absolute path (image names are relative to the image folder)");
  const std::string token = dir.write("t.txt", "a.jpg#0\ta dog\n../b.jpg#0\ta cat\n");
  CHECK(error_of([&] { load_flickr_token_txt(token, dir.path); }) ==
        token + ": line 2: image '../b.jpg' leaves the image folder");
  const std::string karpathy = dir.write("k.json", R"({"images": [{"filename": "x.jpg", "filepath": "../..",
      "split": "test", "sentences": [{"raw": "a dog"}]}]})");
  CHECK(error_of([&] { load_karpathy_split(karpathy, dir.path, ""); }) ==
        karpathy + ": images[0]: image '../../x.jpg' leaves the image folder");
  const std::string abs_path = dir.write("k2.json", R"({"images": [{"filename": "x.jpg", "filepath": "/etc",
      "split": "test", "sentences": [{"raw": "a dog"}]}]})");
  CHECK(error_of([&] { load_karpathy_split(abs_path, dir.path, ""); }).find("is an absolute path") !=
        std::string::npos);
  // the same files with names inside the folder load (the negative control)
  const std::string fine = dir.write("f.json", R"({"images": [{"filename": "x.jpg", "filepath": "val2014",
      "split": "test", "sentences": [{"raw": "a dog"}]}]})");
  const CaptionSet set = load_karpathy_split(fine, dir.path, "");
  CHECK(set.image_path(set.images[0]) == dir.path + "/val2014/x.jpg");
  // a set built by code rather than a loader is held to the same rule when a path is made from it
  CaptionSet built = set;
  built.images[0].file_name = "../x.jpg";
  CHECK(error_of([&] { built.image_path(built.images[0]); }) ==
        dir.path + ": image '../x.jpg' leaves the image folder");
}
