// The skip mechanism's self-test program (tests/CMakeLists.txt, selftest.skip_exit_code): hidden
// cases that support/skip_selftest.cmake runs one by one, directly and under a nested ctest with
// lathe_add_test's properties. A failure must fail whatever it printed or skipped; only a run
// that passed and skipped exits 77.
#include <catch2/catch.hpp>

#include "skip.h"

TEST_CASE("selftest: a failure after the skip marker", "[.][selftest]") {
    std::cout << "SKIPPED: printed by a test that then fails" << std::endl;
    CHECK(1 + 1 == 3);
}

TEST_CASE("selftest: a skip in one section and a failure in another", "[.][selftest]") {
    // The failing section first: LATHE_SKIP returns from the test case, and Catch2 discovers a
    // section only when the code reaches it (skip.h).
    SECTION("fails") { CHECK(1 + 1 == 3); }
    SECTION("skips") { LATHE_SKIP("this section skips"); }
}

TEST_CASE("selftest: 77 failed assertions", "[.][selftest]") {
    // Catch's result is the number of failed assertions: 77 here, the skip code.
    for (int i = 0; i < 77; ++i) CHECK(i < 0);
}

TEST_CASE("selftest: a skip", "[.][selftest]") {
    CHECK(1 + 1 == 2);
    LATHE_SKIP("this test skips");
}

TEST_CASE("selftest: a pass", "[.][selftest]") { CHECK(1 + 1 == 2); }
