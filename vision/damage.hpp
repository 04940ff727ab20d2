// Is a photo whole? (JPEG and PNG: the formats photos come in, and the two whose damage decoders pass silently.)
//
// JPEG: stb (like libjpeg) decodes a cut or corrupted JPEG without an error: the missing blocks come out
// grey, and a photo with its lower half grey gets a confident caption. libjpeg at least prints a warning ("Corrupt
// JPEG data: premature end of data segment"); stb says nothing, and its state (the "no more data" flag it sets when
// the entropy-coded data ends early) cannot be seen from outside its implementation. So sat reads the file's
// structure and Huffman-coded data itself, without the transforms: a decoder's checks, none of its arithmetic.
//
// What is detected: a marker sequence that is not a JPEG's (no frame, segments running past the file, bytes where a
// marker belongs, a restart marker out of order or missing, a second start of image); scan data that ends before the
// frame's every block is coded (half a photo with an end-of-image marker appended); a Huffman code no table holds, a
// coefficient past the 64th, a magnitude category no 8-bit JPEG uses, a DC value no 8-bit block has, a correction bit
// where a progressive refinement allows none; scan data left over after the last block (libjpeg's "extraneous bytes
// before marker"); a progressive JPEG whose scans stop before every coefficient is refined to full precision, or repeat
// one.
//
// What cannot be: a flipped bit inside the Huffman-coded data that still decodes to valid codes of the right total
// length changes some coefficients and no decoder can tell (JPEG has no checksum); nor is bit damage in DQT tables,
// APPn segments or EXIF data seen. Arithmetic-coded, lossless, hierarchical and 12-bit frames get the structural
// checks only.
#pragma once
#include <string>
#include <string_view>

namespace sat {

// What is wrong with the JPEG file `bytes` (which start with FF D8), one phrase such as "scan 1's data ends at MCU 1530
// of 3072 (cut short or corrupt)"; empty when no damage is detectable. Trailing bytes after the end-of-image marker are
// not damage (cameras append data there).
std::string jpeg_damage(std::string_view bytes);

// The same for a PNG file: a chunk running past the file's end, a chunk whose CRC-32 does not match (stb skips
// them), no IEND chunk. Every bit of a PNG is covered by a chunk's CRC, so any flipped bit before IEND is found.
std::string png_damage(std::string_view bytes);

}  // namespace sat
