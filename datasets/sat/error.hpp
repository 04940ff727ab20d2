// The exception every sat function throws for a problem with its input (a file that is missing, corrupt or of
// another kind, a bad argument): one line naming the file and saying what is wrong with it, the line the `sat`
// command prints after "sat: ".
#pragma once
#include <stdexcept>

// What libsat.so exports (everything else in it is hidden): the public types, so that an exception thrown inside
// the library is caught by its type in the program that links it.
#ifndef SAT_API
#define SAT_API __attribute__((visibility("default")))
#endif

namespace sat {

struct SAT_API Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace sat
