#pragma once
// Catch2 2.x has no SKIP(). A test that cannot run calls LATHE_SKIP(reason): it prints
// "SKIPPED: <reason>", records that a skip happened and returns. The shared Catch2 main
// (tests/catch_main.cpp) then exits with kSkipExitCode when the run passed and something skipped,
// and lathe_add_test (tests/CMakeLists.txt) gives every test SKIP_RETURN_CODE 77, so ctest reports
// it as skipped. A run with a failure exits non-zero but never 77, whatever it printed or
// skipped: the marker alone skips nothing. A test program with its own main must end with
// `return lathe::test::exitCode(session.run(...))`; the self-test is support/skip_selftest.*.
// LATHE_SKIP returns from the test case, and Catch2 discovers a SECTION only when the code
// reaches it: a skip inside one section hides the sections after it. Skip at the top of a test
// case (or of its last section).

#include <iostream>

namespace lathe::test {

/// The exit code that tells ctest "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt; 77 as in
/// Automake, and as packaging/check-format.sh uses).
constexpr int kSkipExitCode = 77;

/// Set by LATHE_SKIP; one flag per program (an inline function's static is shared by every
/// translation unit).
inline bool& skipHappened() {
    static bool happened = false;
    return happened;
}

/// The program's exit code from Catch's result (the number of failed assertions, capped at
/// 255, or another non-zero code for a bad command line or a listing): a non-zero result stays
/// non-zero and is never kSkipExitCode (77 failed assertions exit 1), whatever was skipped;
/// kSkipExitCode when everything that ran passed and a test skipped; otherwise 0.
inline int exitCode(int catchResult) {
    if (catchResult != 0) return catchResult == kSkipExitCode ? 1 : catchResult;
    return skipHappened() ? kSkipExitCode : 0;
}

}  // namespace lathe::test

#define LATHE_SKIP(reason)                                 \
    do {                                                   \
        ::lathe::test::skipHappened() = true;              \
        std::cout << "SKIPPED: " << (reason) << std::endl; \
        WARN("SKIPPED: " << (reason));                     \
        return;                                            \
    } while (0)
