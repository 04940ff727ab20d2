# Writes OUT, a source file holding the bytes of IN (the page `sat serve` answers GET / with) as
# sat::kServePage[kServePageSize], so the binary serves it without the source tree. Runs when IN changes.
# Usage: cmake -DIN=tools/cli/page/index.html -DOUT=file.cpp -P tools/cli/page/embed.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR size "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x..,){24})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp" "// generated from ${IN} by tools/cli/page/embed.cmake\n#include <cstddef>\nnamespace sat {\n"
  "extern const unsigned char kServePage[] = {\n${bytes}0};\nextern const size_t kServePageSize = ${size};\n}  // namespace sat\n")
file(RENAME "${OUT}.tmp" "${OUT}")
