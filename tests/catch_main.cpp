// The Catch2 main of the test programs that need no QApplication. Its exit code tells ctest a
// skip from a pass and from a failure (support/skip.h): 0 passed, 77 passed with a test skipped
// (SKIP_RETURN_CODE in tests/CMakeLists.txt), anything else failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "skip.h"

int main(int argc, char** argv) { return lathe::test::exitCode(Catch::Session().run(argc, argv)); }
