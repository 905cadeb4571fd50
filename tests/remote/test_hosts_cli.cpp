// lathectl hosts check against a real sshd on loopback.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "run_process.h"
#include "skip.h"
#include "sshd_fixture.h"

using lathe::remote::test::SshdServer;

namespace {

std::string hostsCheck(const SshdServer& sshd, const std::string& extra) {
    return lathe::test::binPath("lathectl") + " hosts check " + lathe::remote::test::currentUser() + "@" +
           SshdServer::kAddress + ":" + std::to_string(sshd.port()) + " --identity " + sshd.clientKey() +
           " --known-hosts " + sshd.knownHosts() + " " + extra;
}

}  // namespace

TEST_CASE("lathectl hosts check verifies the host key and reports the host", "[remote][cli][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    SshdServer sshd;

    // Unknown key: refused, fingerprint shown, exit 1, nothing written to known_hosts.
    const auto strict = lathe::test::runShell(hostsCheck(sshd, ""));
    CHECK(strict.exitCode == 1);
    CHECK_THAT(strict.err, Catch::Contains("is not in " + sshd.knownHosts()) &&
                               Catch::Contains(sshd.hostKeyFingerprint()) &&
                               Catch::Contains("--trust-on-first-use"));

    const auto tofu = lathe::test::runShell(hostsCheck(sshd, "--trust-on-first-use --json"));
    REQUIRE(tofu.exitCode == 0);
    const auto j = nlohmann::json::parse(tofu.out);
    CHECK(j.at("ok") == true);
    CHECK(j.at("host_key") == sshd.hostKeyFingerprint());
    CHECK(std::stoi(j.at("cores").get<std::string>()) >= 1);
    CHECK_THAT(j.at("os").get<std::string>(), Catch::Contains("Linux"));

    // Now known: a strict check passes.
    const auto again = lathe::test::runShell(hostsCheck(sshd, ""));
    CHECK(again.exitCode == 0);
    CHECK_THAT(again.out, Catch::Contains("reachable"));
}

TEST_CASE("lathectl hosts check rejects a malformed host with exit code 2", "[remote][cli]") {
    const auto r = lathe::test::runShell(lathe::test::binPath("lathectl") + " hosts check 'gpu:99999'");
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("port"));
}
