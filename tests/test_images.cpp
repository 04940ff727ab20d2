// Image files in and out: stb for JPEG, PNG, BMP, GIF and binary PNM (and all writing), OpenCV's codecs opened by name
// for WebP, TIFF and the other PNM kinds; the checks every file passes before a decoder sees it. This program links
// OpenCV's codecs itself, to make fixtures and to hold stb's pixels against what sat decoded with before.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <dlfcn.h>
#include <fstream>
#include <thread>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "datasets/image_codecs.hpp"
#include "datasets/stb_codecs.hpp"
#include "tests/scratch.hpp"
#include "vision/exif.hpp"
#include "vision/image.hpp"
#include "vision/overlay.hpp"

using namespace sat;
using test::error_of;
using test::TempDir;

namespace {

std::string encoded(const char* ext, const cv::Mat& img, const std::vector<int>& params = {}) {
  std::vector<uchar> buf;
  REQUIRE(cv::imencode(ext, img, buf, params));
  return std::string(buf.begin(), buf.end());
}

cv::Mat opencv_decoded(const std::string& bytes) {
  return cv::imdecode(cv::Mat(1, (int)bytes.size(), CV_8UC1, (void*)bytes.data()), cv::IMREAD_COLOR);
}

cv::Mat sat_decoded(const std::string& bytes, const std::string& name = "image", const DecodeOptions& options = {}) {
  return decode_image_bgr(bytes.data(), bytes.size(), name, options);
}

// Random pixels: a swapped channel, a flipped row or a lost bit shows as a difference.
cv::Mat noise(int rows, int cols, int type) {
  cv::Mat m(rows, cols, type);
  cv::randu(m, 0, CV_MAT_DEPTH(type) == CV_16U ? 65536 : 256);
  return m;
}

uint32_t crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

std::string be32(uint32_t v) {
  return {(char)(v >> 24), (char)(v >> 16), (char)(v >> 8), (char)v};
}

// A little-endian TIFF structure whose first directory holds the orientation tag and nothing else.
std::string exif_tiff(int orientation) {
  return std::string("II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0", 18) + (char)orientation +
         std::string("\0\0\0\0\0\0\0", 7);
}

// The PNG with an eXIf chunk after its IHDR; the JPEG with an APP1 "Exif" segment after its SOI.
std::string png_with_orientation(const std::string& png, int orientation) {
  const std::string body = "eXIf" + exif_tiff(orientation);
  const std::string chunk = be32((uint32_t)body.size() - 4) + body + be32(crc32(body));
  return png.substr(0, 33) + chunk + png.substr(33);
}
std::string jpeg_with_orientation(const std::string& jpeg, int orientation) {
  const std::string payload = std::string("Exif\0\0", 6) + exif_tiff(orientation);
  const size_t length = payload.size() + 2;
  return jpeg.substr(0, 2) + "\xFF\xE1" + (char)(length >> 8) + (char)(length & 0xFF) + payload + jpeg.substr(2);
}

// An 8x6 GIF (PIL's), every pixel palette entry 0: red 10, green 200, blue 30.
const std::string kGif(
    "GIF87a\x08\x00\x06\x00\x81\x00\x00\x0a\xc8\x1e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x2c\x00\x00\x00\x00\x08\x00"
    "\x06\x00\x00\x08\x0e\x00\x01\x08\x1c\x48\xb0\xa0\xc1\x83\x08\x13\x0e\x0c\x08\x00\x3b",
    53);

}  // namespace

TEST_CASE("image codecs: OpenCV's decoder opened by name is the function OpenCV declares; stb writes what it reads") {
  load_image_codecs();
  load_image_codecs();  // once loaded, a no-op
  // this test program links OpenCV's codecs itself: the library sat opens is that one, and the symbol it looks up is
  // the overload it means (a misspelt or changed name would fail here, not in a user's hands)
  void* lib = dlopen(image_codecs_library(), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);
  cv::Mat (*imdecode)(const cv::_InputArray&, int) = &cv::imdecode;
  CHECK(dlsym(lib, kImdecodeSymbol) == reinterpret_cast<void*>(imdecode));
  dlclose(lib);  // the reference RTLD_NOLOAD took
  const std::string junk = "not an image at all";
  CHECK(decode_image(cv::Mat(1, (int)junk.size(), CV_8UC1, (void*)junk.data()), cv::IMREAD_COLOR).empty());

  const cv::Mat img = noise(7, 5, CV_8UC3);
  const std::string png = encode_png(img);
  CHECK(cv::norm(opencv_decoded(png), img, cv::NORM_INF) == 0);  // lossless, and libpng reads what stb wrote
  CHECK(cv::norm(sat_decoded(png), img, cv::NORM_INF) == 0);
  const cv::Mat grey = noise(4, 9, CV_8UC1);
  cv::Mat grey_bgr;
  cv::cvtColor(grey, grey_bgr, cv::COLOR_GRAY2BGR);
  CHECK(cv::norm(sat_decoded(encode_png(grey)), grey_bgr, cv::NORM_INF) == 0);
  // a smooth picture survives JPEG at quality 90 nearly unchanged, read by libjpeg and by stb
  cv::Mat smooth(48, 64, CV_8UC3);
  for (int y = 0; y < smooth.rows; ++y)
    for (int x = 0; x < smooth.cols; ++x) smooth.at<cv::Vec3b>(y, x) = cv::Vec3b(3 * x, 4 * y, 100 + x + y);
  const std::string jpg = encode_jpeg(smooth, 90);
  CHECK(cv::norm(opencv_decoded(jpg), smooth, cv::NORM_L1) / smooth.total() / 3 < 2);
  CHECK(cv::norm(sat_decoded(jpg), smooth, cv::NORM_L1) / smooth.total() / 3 < 2);
  // negative control: the same measure tells a different picture apart
  CHECK(cv::norm(sat_decoded(encode_jpeg(255 - smooth, 90)), smooth, cv::NORM_L1) / smooth.total() / 3 > 20);
  CHECK(error_of([&] { encode_png(cv::Mat(2, 2, CV_32FC3)); }) ==
        "PNG: can write 8-bit grey or BGR pixels, not CV_32FC3");
}

TEST_CASE("images: stb decodes the lossless formats to the pixels OpenCV decoded") {
  struct Case {
    const char* ext;
    cv::Mat img;
  };
  const std::vector<Case> cases = {
      {".png", noise(13, 17, CV_8UC3)},  {".png", noise(13, 17, CV_8UC1)},  {".png", noise(13, 17, CV_8UC4)},
      {".png", noise(13, 17, CV_16UC3)}, {".png", noise(13, 17, CV_16UC1)}, {".bmp", noise(13, 17, CV_8UC3)},
      {".bmp", noise(13, 17, CV_8UC1)},  {".ppm", noise(13, 17, CV_8UC3)},  {".pgm", noise(13, 17, CV_8UC1)},
      {".pgm", noise(13, 17, CV_16UC1)},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.ext) + " " + cv::typeToString(c.img.type()));
    const std::string bytes = encoded(c.ext, c.img);
    const cv::Mat before = opencv_decoded(bytes), now = sat_decoded(bytes);
    REQUIRE(before.type() == CV_8UC3);
    REQUIRE(now.size() == before.size());
    CHECK(cv::norm(now, before, cv::NORM_INF) == 0);
  }
  // the measure sees a swapped channel order (the control for the RGB stb gives and the BGR sat hands on)
  const cv::Mat colour = sat_decoded(encoded(".png", cases[0].img));
  cv::Mat swapped;
  cv::cvtColor(colour, swapped, cv::COLOR_BGR2RGB);
  CHECK(cv::norm(swapped, colour, cv::NORM_INF) > 0);
  // GIF (OpenCV 4.6 has no GIF reader): the first frame's palette colours, as BGR
  const cv::Mat gif = sat_decoded(kGif, "a.gif");
  REQUIRE(gif.size() == cv::Size(8, 6));
  CHECK(gif.at<cv::Vec3b>(5, 7) == cv::Vec3b(30, 200, 10));
}

TEST_CASE("images: the EXIF orientation of a JPEG or PNG is applied as OpenCV applied it") {
  const cv::Mat img = noise(6, 10, CV_8UC3);  // not square: a turn shows in the size
  const std::string png = encoded(".png", img);
  for (int o = 1; o <= 8; ++o) {
    CAPTURE(o);
    const std::string oriented = png_with_orientation(png, o);
    CHECK(exif_orientation(oriented, "PNG") == o);
    const cv::Mat before = opencv_decoded(oriented), now = sat_decoded(oriented);
    CHECK(now.size() == (o >= 5 ? cv::Size(6, 10) : cv::Size(10, 6)));
    REQUIRE(now.size() == before.size());
    CHECK(cv::norm(now, before, cv::NORM_INF) == 0);
    if (o > 1) CHECK(cv::norm(now.reshape(1, 1), img.reshape(1, 1), cv::NORM_INF) > 0);  // it did turn or mirror
  }
  cv::Mat smooth(48, 64, CV_8UC3);
  for (int y = 0; y < smooth.rows; ++y)
    for (int x = 0; x < smooth.cols; ++x) smooth.at<cv::Vec3b>(y, x) = cv::Vec3b(3 * x, 4 * y, 100 + x + y);
  const std::string jpg = encoded(".jpg", smooth);
  for (int o : {3, 6, 8}) {
    CAPTURE(o);
    const std::string oriented = jpeg_with_orientation(jpg, o);
    CHECK(exif_orientation(oriented, "JPEG") == o);
    const cv::Mat before = opencv_decoded(oriented), now = sat_decoded(oriented);
    REQUIRE(now.size() == before.size());
    CHECK(now.size() == (o >= 5 ? cv::Size(48, 64) : cv::Size(64, 48)));
    CHECK(cv::norm(now, before, cv::NORM_L1) / now.total() / 3 < 2);  // two JPEG decoders, the same turn
  }
  // a tag that is not a SHORT, an offset past the end, a cut chunk: read as no orientation
  std::string odd = exif_tiff(6);
  odd[12] = 4;  // the tag's type: LONG
  CHECK(exif_orientation(png.substr(0, 33) + be32(odd.size()) + "eXIf" + odd + be32(0) + png.substr(33), "PNG") == 1);
  CHECK(exif_orientation(png_with_orientation(png, 6).substr(0, 50), "PNG") == 1);
  std::string far = std::string("Exif\0\0II*\0\xff\xff\xff\x7f", 14);
  CHECK(exif_orientation(jpg.substr(0, 2) + "\xFF\xE1" + (char)0 + (char)(far.size() + 2) + far + jpg.substr(2),
                         "JPEG") == 1);
  CHECK(exif_orientation(jpeg_with_orientation(jpg, 6), "GIF") == 1);
}

TEST_CASE("images: stb's failure reasons stay with the thread that failed") {
  // stb keeps its last failure reason in a thread-local (STBI_THREAD_LOCAL in a C++11 build); were it one global, a
  // server decoding on many threads would name another request's problem
  const std::string jpg = encoded(".jpg", noise(64, 64, CV_8UC3));
  std::string bad_jpeg = jpg;
  const size_t sos = bad_jpeg.find("\xFF\xDA");
  REQUIRE(sos != std::string::npos);
  bad_jpeg[sos + 3] += 2;  // the scan header's length: two bytes more than its components take
  std::string bad_png = encoded(".png", noise(64, 64, CV_8UC3));
  const size_t idat = bad_png.find("IDAT");
  REQUIRE(idat != std::string::npos);
  bad_png[idat + 4] = (char)(bad_png[idat + 4] ^ 0x5A);  // the zlib header of the first IDAT
  // damaged files, read anyway so that stb's decoder meets the damage (sat's own checks refuse them before it)
  const DecodeOptions anyway{true};
  const std::string jpeg_error = error_of([&] { sat_decoded(bad_jpeg, "a.jpg", anyway); });
  const std::string png_error = error_of([&] { sat_decoded(bad_png, "a.png", anyway); });
  REQUIRE(jpeg_error.rfind("a.jpg: cannot decode image (JPEG: ", 0) == 0);
  REQUIRE(png_error.rfind("a.png: cannot decode image (PNG: ", 0) == 0);
  REQUIRE(jpeg_error.substr(7) != png_error.substr(7));  // the two reasons differ, so a mix-up would show
  std::atomic<int> wrong{0};
  auto hammer = [&](const std::string& bytes, const char* name, const std::string& expected) {
    for (int i = 0; i < 300; ++i)
      if (error_of([&] { sat_decoded(bytes, name, anyway); }) != expected) ++wrong;
  };
  std::thread a(hammer, std::cref(bad_jpeg), "a.jpg", std::cref(jpeg_error));
  std::thread b(hammer, std::cref(bad_png), "a.png", std::cref(png_error));
  a.join(), b.join();
  CHECK(wrong == 0);
}

TEST_CASE("images: write_image writes PNG and JPEG through stb, atomically, and names the file it cannot write") {
  TempDir dir;
  const cv::Mat img = noise(9, 11, CV_8UC3);
  write_image(dir.file("a.png"), img);
  CHECK(cv::norm(load_image_bgr(dir.file("a.png")), img, cv::NORM_INF) == 0);
  write_image(dir.file("a.JPG"), img);
  CHECK(load_image_bgr(dir.file("a.JPG")).size() == img.size());
  CHECK(error_of([&] { write_image(dir.file("a.bmp"), img); }) ==
        dir.file("a.bmp") + ": cannot encode an image with extension '.bmp' (use .png or .jpg)");
  CHECK(error_of([&] { write_image(dir.file("f.png"), cv::Mat(3, 3, CV_32FC1)); }) ==
        dir.file("f.png") + ": PNG: can write 8-bit grey or BGR pixels, not CV_32FC1");
  CHECK(!file_exists(dir.file("a.bmp")));
  CHECK(!file_exists(dir.file("f.png")));
}

TEST_CASE("images: only photo formats reach the decoders; other files are one-line errors") {
  TempDir dir;
  cv::Mat img(6, 8, CV_8UC3, cv::Scalar(10, 200, 30));
  for (const char* ext : {".png", ".jpg", ".bmp", ".webp", ".tiff", ".ppm", ".pgm", ".pbm"}) {
    CAPTURE(std::string(ext));
    const bool grey = ext[2] == 'g' || ext[2] == 'b';  // PGM, PBM
    write_file_atomic(dir.file(std::string("a") + ext), encoded(ext, grey ? cv::Mat(6, 8, CV_8UC1, 90) : img));
    cv::Mat back = load_image_bgr(dir.file(std::string("a") + ext));
    CHECK(back.rows == 6);
    CHECK(back.cols == 8);
  }
  write_file_atomic(dir.file("a.ppm"), encoded(".ppm", img, {cv::IMWRITE_PXM_BINARY, 0}));  // P3: ASCII, OpenCV's
  CHECK(load_image_bgr(dir.file("a.ppm")).at<cv::Vec3b>(5, 7) == cv::Vec3b(10, 200, 30));
  // a greymap whose values go up to 15, not 255: neither decoder scales them
  const std::string grey15 = std::string("P5 4 2 15\n") + std::string(8, '\x0f');
  CHECK(cv::norm(sat_decoded(grey15, "a.pgm"), opencv_decoded(grey15), cv::NORM_INF) == 0);
  CHECK(sat_decoded(grey15, "a.pgm").at<cv::Vec3b>(1, 3) == cv::Vec3b(15, 15, 15));
  write_file_atomic(dir.file("a.gif"), kGif);
  CHECK(load_image_bgr(dir.file("a.gif")).cols == 8);
  // A corrupt DICOM file (preamble, "DICM"): OpenCV's GDCM decoder asserts and aborts the process on it (found by
  // tests/fuzz/fuzz_image; the input is kept in tests/fuzz/corpus/image). sat refuses it before any decoder runs.
  std::string dicom = "\xFF\x10\xD8" + std::string(125, 'X') + "DICM\x01";
  write_file_atomic(dir.file("scan.dcm"), dicom);
  CHECK_THROWS_WITH_AS(load_image_bgr(dir.file("scan.dcm")),
                       doctest::Contains("scan.dcm: cannot decode image (not a JPEG, PNG, WebP, BMP, GIF, TIFF or PNM"),
                       Error);
  // A WebP header, then "DICM" at byte 128: OpenCV still hands it to GDCM, which aborts (found by fuzzing, kept in the
  // corpus). sat refuses it by that signature.
  std::string webp_dicom = std::string("RIFF\x16\x07\0\0WEBPVP8L\x09", 17) + std::string(111, '\0') + "DICM\xbf\xe3";
  write_file_atomic(dir.file("webp_dicom.webp"), webp_dicom);
  CHECK_THROWS_WITH_AS(load_image_bgr(dir.file("webp_dicom.webp")),
                       doctest::Contains("webp_dicom.webp: cannot decode image (a WebP header, but a DICOM signature"),
                       Error);
  write_file_atomic(dir.file("x.hdr"), "#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 2 +X 2\n");
  CHECK_THROWS_AS(load_image_bgr(dir.file("x.hdr")), Error);
  // zero bytes, a directory, a cut PNG, a JPEG without its end, garbage after a JPEG's first bytes
  write_file_atomic(dir.file("empty.jpg"), "");
  CHECK(error_of([&] { load_image_bgr(dir.file("empty.jpg")); }) ==
        dir.file("empty.jpg") + ": empty file, not an image");
  CHECK(error_of([&] { load_image_bgr(dir.path); }).rfind(dir.path + ": ", 0) == 0);
  const std::string png = encoded(".png", noise(40, 40, CV_8UC3));
  CHECK(error_of([&] {
          sat_decoded(png.substr(0, png.size() / 2), "cut.png");
        }).rfind("cut.png: damaged PNG: chunk IDAT at byte ", 0) == 0);
  CHECK(error_of([&] {
          sat_decoded(png.substr(0, png.size() / 2), "cut.png", DecodeOptions{true});
        }).rfind("cut.png: cannot decode image (PNG: ", 0) == 0);
  const std::string jpg = encoded(".jpg", noise(40, 40, CV_8UC3));
  CHECK(error_of([&] {
          sat_decoded(jpg.substr(0, jpg.size() / 2), "cut.jpg");
        }).rfind("cut.jpg: truncated JPEG (", 0) == 0);
  // a JPEG far too short for the size its header declares (stb would decode every block of it)
  std::string tall = jpg;
  const size_t frame = tall.find("\xFF\xC0");
  REQUIRE(frame != std::string::npos);
  tall[frame + 5] = (char)0xFF;  // 65 320 rows
  tall[frame + 7] = (char)0x01;  // of 296 pixels: 19 megapixels, in a file of a few kB
  CHECK(error_of([&] { sat_decoded(tall, "tall.jpg"); }).rfind("tall.jpg: truncated JPEG (", 0) == 0);
  // stb would fill a cut BMP's or PNM's missing rows (found by fuzzing): the whole file decodes, one byte less does not
  for (const char* ext : {".bmp", ".ppm", ".pgm"}) {
    CAPTURE(std::string(ext));
    const std::string whole = encoded(ext, noise(5, 7, ext[2] == 'g' ? CV_8UC1 : CV_8UC3));
    CHECK(sat_decoded(whole).cols == 7);
    const std::string cut = error_of([&] { sat_decoded(whole.substr(0, whole.size() - 1), "cut"); });
    CHECK(cut.rfind(std::string("cut: truncated ") + (ext[1] == 'b' ? "BMP" : "PNM") + " (", 0) == 0);
  }
  CHECK(error_of([&] { sat_decoded("\xFF\xD8\xFF\xE0\x00\x10JFIF\x00garbage\xFF\xD9", "g.jpg"); }) ==
        "g.jpg: cannot decode image (corrupt JPEG header)");
  // a Huffman table of more codes than a byte has values: stb 2.27 would write past its arrays (found by fuzzing)
  std::string huge_table = jpg;
  const size_t dht = huge_table.find("\xFF\xC4");
  REQUIRE(dht != std::string::npos);
  for (size_t i = 0; i < 16; ++i) huge_table[dht + 5 + i] = (char)0x20;  // 16 x 32 codes
  CHECK(error_of([&] { sat_decoded(huge_table, "h.jpg"); }) ==
        "h.jpg: cannot decode image (JPEG: a Huffman table of more than 256 codes)");
  // a 12-bit JPEG (its frame header's precision): stb lacks the coding, so it goes to libjpeg, whose 8-bit build
  // refuses it in OpenCV's words (stb's would be "corrupt JPEG header")
  std::string twelve = jpg;
  const size_t sof = twelve.find("\xFF\xC0");
  REQUIRE(sof != std::string::npos);
  twelve[sof + 4] = 12;
  CHECK(error_of([&] { sat_decoded(twelve, "12.jpg"); }) == "12.jpg: cannot decode image (corrupt or not an image)");
}

TEST_CASE("images: a header declaring more than kMaxImagePixels is refused before any decoder allocates") {
  // 15 bytes of PBM header made OpenCV allocate 3 GB (found by tests/fuzz/fuzz_image, kept in its corpus)
  auto be = [](uint32_t v, int n) {
    std::string s;
    for (int i = n - 1; i >= 0; --i) s += (char)(i < 4 ? (v >> (8 * i)) & 0xff : 0);
    return s;
  };
  auto le = [](uint32_t v, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (char)(i < 4 ? (v >> (8 * i)) & 0xff : 0);
    return s;
  };
  struct Case {
    const char* what;
    std::string bytes;
  };
  const std::string pad(64, '\0');
  // each header as its decoder's header reader accepts it (stb's for JPEG, PNG, BMP, GIF, P5/P6; sat's for the rest)
  const std::vector<Case> huge = {
      {"PBM", "P4\n# a comment\n20000 20000\n" + pad},
      {"PPM", "P6 15000 15000 255\n" + pad},
      {"PNG", std::string("\x89PNG\r\n\x1A\n", 8) + be(13, 4) + "IHDR" + be(20000, 4) + be(20000, 4) + "\x08\x00" +
                  std::string(3, '\0') + be(0, 4) + pad},  // grey: stb's header reader takes it
      {"RGB PNG", std::string("\x89PNG\r\n\x1A\n", 8) + be(13, 4) + "IHDR" + be(20000, 4) + be(20000, 4) + "\x08\x02" +
                      std::string(3, '\0') + be(0, 4) + pad},  // one stb's reader refuses (2^30 bytes)
      {"JPEG", std::string("\xFF\xD8\xFF\xE0", 4) + be(16, 2) + std::string(14, 'J') + "\xFF\xC2" + be(17, 2) + "\x08" +
                   be(20000, 2) + be(20000, 2) + "\x03" + std::string("\x01\x11\x00\x02\x11\x00\x03\x11\x00", 9) + pad +
                   "\xFF\xD9"},
      {"BMP", "BM" + le(0, 12) + le(40, 4) + le(20000, 4) + le((uint32_t)-20000, 4) + le(1, 2) + le(24, 2) + pad},
      {"GIF", std::string("GIF89a") + le(65535, 2) + le(65535, 2) + pad},
      {"TIFF", std::string("II*\0", 4) + le(8, 4) + le(2, 2) + le(256, 2) + le(4, 2) + le(1, 4) + le(20000, 4) +
                   le(257, 2) + le(3, 2) + le(1, 4) + le(20000, 4) + pad},
      {"WebP", "RIFF" + le(100, 4) + "WEBPVP8X" + le(10, 4) + le(0, 4) + le(16383, 3) + le(16383, 3) + pad},
  };
  const std::string gif_164mp = std::string("GIF89a") + le(12849, 2) + le(12810, 2) + pad;  // 9 bytes a pixel in stb
  CHECK(error_of([&] { sat_decoded(gif_164mp, "big.gif"); }) ==
        "big.gif: image of 12849x12810 pixels is too large (at most 66 megapixels)");
  for (const Case& c : huge) {
    CAPTURE(std::string(c.what));
    CHECK_THROWS_WITH_AS(decode_image_bgr(c.bytes.data(), c.bytes.size(), "big.img"),
                         doctest::Contains("big.img: image of "), Error);
    CHECK_THROWS_WITH_AS(
        decode_image_bgr(c.bytes.data(), c.bytes.size(), "big.img"),
        doctest::Contains(std::string(c.what) == "GIF" ? "pixels is too large (at most 66 megapixels)"
                                                       : "pixels is too large (at most 200 megapixels)"),
        Error);
  }
  // headers that declare no size, or none that can be read, are refused as corrupt
  for (const std::string& bad : {std::string("P4\n644466\xb6"
                                             "164 62 "),
                                 std::string("P5 0 10 255\n") + pad, std::string("\xFF\xD8\xFF\xDA\x00\x02\xFF\xD9", 8),
                                 std::string("II*\0\xff\xff\xff\xff", 8)}) {
    CHECK_THROWS_WITH_AS(decode_image_bgr(bad.data(), bad.size(), "odd.img"),
                         doctest::Contains("odd.img: cannot decode image ("), Error);
  }
  // every format's encoder output passes the header check and decodes (the sizes read are the real ones)
  cv::Mat img(1200, 1700, CV_8UC3, cv::Scalar(40, 90, 160));
  for (const char* ext : {".png", ".jpg", ".bmp", ".webp", ".tiff", ".ppm"}) {
    CAPTURE(std::string(ext));
    const cv::Mat back = sat_decoded(encoded(ext, img), std::string("a") + ext);
    CHECK(back.rows == 1200);
    CHECK(back.cols == 1700);
  }
  CHECK(sat_decoded(encoded(".pbm", cv::Mat(1200, 1700, CV_8UC1, cv::Scalar(255))), "a.pbm").cols == 1700);
  CHECK(sat_decoded(encoded(".webp", img, {cv::IMWRITE_WEBP_QUALITY, 101}), "l.webp").cols == 1700);  // VP8L
}

TEST_CASE("images: the example photos and ten Flickr8k dev photos decode through stb as through OpenCV") {
  // PNG is lossless: the same pixels. JPEG decoders may differ (the inverse DCT, the chroma upsampling): the figures
  // printed here are docs/benchmarks.md's table.
  std::vector<std::string> files = {std::string(SAT_SOURCE_DIR) + "/examples/dog_and_man.jpg",
                                    std::string(SAT_SOURCE_DIR) + "/examples/scene.png"};
  std::ifstream dev(std::string(SAT_SHARED_DATA) + "/flickr8k/dev.txt");
  std::string line;
  for (int i = 0; i < 10 && std::getline(dev, line); ++i)
    files.push_back(std::string(SAT_SHARED_DATA) + "/flickr8k/images/" + line);
  if (files.size() == 2) MESSAGE("no Flickr8k photos beside the checkout: the two example photos only");
  for (const std::string& f : files) {
    CAPTURE(f);
    const std::string bytes = read_file(f);
    const cv::Mat before = opencv_decoded(bytes), now = sat_decoded(bytes, f);
    REQUIRE(now.size() == before.size());
    cv::Mat diff;
    cv::absdiff(now, before, diff);
    const double max_diff = cv::norm(diff, cv::NORM_INF), mean_diff = cv::norm(diff, cv::NORM_L1) / diff.total() / 3;
    const double differing = (double)cv::countNonZero(diff.reshape(1)) / (diff.total() * 3);
    MESSAGE(f.substr(f.rfind('/') + 1) << " " << now.cols << "x" << now.rows << ": max |diff| " << max_diff
                                       << ", mean |diff| " << mean_diff << ", values differing " << differing);
    if (f.size() > 4 && f.substr(f.size() - 4) == ".png")
      CHECK(max_diff == 0);
    else
      CHECK(mean_diff < 1.5);
  }
}
