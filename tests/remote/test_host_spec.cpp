#include <catch2/catch.hpp>

#include "lathe/remote/host_spec.h"

#include <stdexcept>

using lathe::remote::HostSpec;
using lathe::remote::parseHostSpec;

TEST_CASE("parseHostSpec reads user, host and port", "[remote][host_spec]") {
    HostSpec s = parseHostSpec("alice@gpu-2:2222");
    CHECK(s.user == "alice");
    CHECK(s.host == "gpu-2");
    CHECK(s.port == 2222);
    CHECK(s.connectTimeoutSec == 10);
    CHECK(s.label() == "gpu-2:2222");
    CHECK(s.toString() == "alice@gpu-2:2222");

    s = parseHostSpec("gpu-2");
    CHECK(s.user.empty());
    CHECK(s.host == "gpu-2");
    CHECK(s.port == 0);
    CHECK(s.label() == "gpu-2");
    CHECK(s.toString() == "gpu-2");

    s = parseHostSpec("bob@10.0.0.7");
    CHECK(s.user == "bob");
    CHECK(s.host == "10.0.0.7");
    CHECK(s.port == 0);

    s = parseHostSpec("127.0.0.2:2222");
    CHECK(s.host == "127.0.0.2");
    CHECK(s.port == 2222);
}

TEST_CASE("parseHostSpec handles IPv6 and user names containing '@'", "[remote][host_spec]") {
    HostSpec s = parseHostSpec("root@[::1]:2200");
    CHECK(s.user == "root");
    CHECK(s.host == "::1");
    CHECK(s.port == 2200);
    CHECK(s.label() == "[::1]:2200");
    CHECK(s.toString() == "root@[::1]:2200");

    s = parseHostSpec("fe80::1");
    CHECK(s.host == "fe80::1");
    CHECK(s.port == 0);

    s = parseHostSpec("[::1]");
    CHECK(s.host == "::1");
    CHECK(s.port == 0);

    s = parseHostSpec("jane@corp.example@gpu-1:23");
    CHECK(s.user == "jane@corp.example");
    CHECK(s.host == "gpu-1");
    CHECK(s.port == 23);
}

TEST_CASE("parseHostSpec rejects malformed specs with a message naming them", "[remote][host_spec]") {
    for (const char* bad : {"", "@gpu", "user@", "gpu:", "gpu:0", "gpu:65536", "gpu:99999", "gpu:22x",
                            "gpu:-1", "[::1", "[::1]x", "[]:22", "gpu 2", ":22"}) {
        INFO("spec: '" << bad << "'");
        REQUIRE_THROWS_AS(parseHostSpec(bad), std::invalid_argument);
        REQUIRE_THROWS_WITH(parseHostSpec(bad), Catch::Contains(std::string("host spec '") + bad + "'"));
    }
    REQUIRE_THROWS_WITH(parseHostSpec("gpu:70000"), Catch::Contains("port must be a number from 1 to 65535"));
}
