// lathectl hosts: the inventory (add, list, remove) on a temporary workspace, and check and
// trust against a real sshd on loopback.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "run_process.h"
#include "skip.h"
#include "sshd_fixture.h"

using lathe::remote::test::SshdServer;

namespace {

std::string lathectl(const std::string& args) { return lathe::test::binPath("lathectl") + " " + args; }

// `hosts add NAME` for the fixture's server: its port, our user, the client key and (so the
// probe finds it on the "remote" host) this build's lathectl.
std::string addFixture(const SshdServer& sshd, const std::string& name, const std::string& db) {
    return lathectl("hosts add " + name + " --address " + SshdServer::kAddress + " --port " +
                    std::to_string(sshd.port()) + " --user " + lathe::remote::test::currentUser() +
                    " --identity " + sshd.clientKey() + " --lathectl " + lathe::test::binPath("lathectl") +
                    " --db " + db);
}

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
                               Catch::Contains("lathectl hosts trust"));

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

TEST_CASE("lathectl hosts add, list and remove keep the inventory in the workspace", "[remote][cli][hosts]") {
    lathe::remote::test::TempDir dir;
    const std::string db = dir.file("ws.db");
    const std::string on = " --db " + db;
    using lathe::test::runShell;

    const auto empty = runShell(lathectl("hosts list" + on));
    CHECK(empty.exitCode == 0);
    CHECK_THAT(empty.out, Catch::StartsWith("no hosts in " + db));

    // User and port written in the address are taken apart; the address keeps the host.
    const auto a =
        runShell(lathectl("hosts add gpu-2 --address alice@10.0.0.2:2222 --slots 4 --lathectl "
                          "/opt/lathe/bin/lathectl" +
                          on));
    CHECK(a.exitCode == 0);
    CHECK(a.out == "added host gpu-2 (alice@10.0.0.2:2222, 4 slots)\n");
    const auto b = runShell(lathectl("hosts add gpu-1 --address gpu1.example.org" + on));
    CHECK(b.exitCode == 0);
    CHECK(b.out == "added host gpu-1 (gpu1.example.org, 1 slot)\n");
    // --json prints the record; a relative identity is made absolute (a path only, no key).
    const auto c = runShell("cd " + dir.path() + " && " +
                            lathectl("hosts add gpu-3 --address 10.0.0.3 --port 2200 --user bob --identity "
                                     "keys/id_ed25519 --json" +
                                     on));
    REQUIRE(c.exitCode == 0);
    const auto cj = nlohmann::json::parse(c.out);
    CHECK(cj.at("name") == "gpu-3");
    CHECK(cj.at("port") == 2200);
    CHECK(cj.at("user") == "bob");
    CHECK_THAT(cj.at("identity").get<std::string>(),
               Catch::StartsWith("/") && Catch::EndsWith("/keys/id_ed25519"));
    CHECK(cj.at("slots") == 1);
    CHECK(cj.at("added_at").get<double>() > 0);

    const auto table = runShell(lathectl("hosts list" + on));
    CHECK(table.exitCode == 0);
    CHECK_THAT(table.out,
               Catch::StartsWith("NAME ") && Catch::Contains("ADDRESS") && Catch::Contains("LATHECTL"));
    const auto p1 = table.out.find("gpu-1"), p2 = table.out.find("gpu-2"), p3 = table.out.find("gpu-3");
    REQUIRE(p1 != std::string::npos);
    REQUIRE(p2 != std::string::npos);
    REQUIRE(p3 != std::string::npos);
    CHECK((p1 < p2 && p2 < p3));  // by name
    const std::string gpu1Line = table.out.substr(p1, table.out.find('\n', p1) - p1);
    CHECK_THAT(gpu1Line, Catch::Contains("gpu1.example.org") && Catch::Contains(" - "));  // no port, no user
    CHECK_THAT(table.out, Catch::Contains("/opt/lathe/bin/lathectl"));

    const auto listed = runShell(lathectl("hosts list --json" + on));
    REQUIRE(listed.exitCode == 0);
    const auto lj = nlohmann::json::parse(listed.out);
    REQUIRE(lj.size() == 3);
    CHECK(lj[0].at("name") == "gpu-1");
    CHECK(lj[0].at("port") == 0);  // not set
    CHECK(lj[1].at("name") == "gpu-2");
    CHECK(lj[1].at("address") == "10.0.0.2");
    CHECK(lj[1].at("port") == 2222);
    CHECK(lj[1].at("user") == "alice");
    CHECK(lj[1].at("slots") == 4);
    CHECK(lj[1].at("lathectl") == "/opt/lathe/bin/lathectl");

    // Refusals: exit 2, one line, nothing changed.
    const auto dup = runShell(lathectl("hosts add gpu-1 --address elsewhere" + on));
    CHECK(dup.exitCode == 2);
    CHECK_THAT(dup.err,
               Catch::Contains("host 'gpu-1' already exists; remove it first or choose another name"));
    for (const char* slots : {"0", "4097", "many"}) {
        CAPTURE(slots);
        const auto bad = runShell(lathectl(std::string("hosts add gpu-9 --address h --slots ") + slots + on));
        CHECK(bad.exitCode == 2);
        CHECK_THAT(bad.err, Catch::Contains("--slots"));
    }
    const auto badName = runShell(lathectl("hosts add 'bad/name' --address h" + on));
    CHECK(badName.exitCode == 2);
    CHECK_THAT(badName.err, Catch::Contains("host name 'bad/name'"));
    const auto users = runShell(lathectl("hosts add gpu-9 --address alice@h --user bob" + on));
    CHECK(users.exitCode == 2);
    CHECK_THAT(users.err, Catch::Contains("--user bob") && Catch::Contains("differ"));
    const auto ports = runShell(lathectl("hosts add gpu-9 --address h:2222 --port 22" + on));
    CHECK(ports.exitCode == 2);
    CHECK_THAT(ports.err, Catch::Contains("--port 22") && Catch::Contains("differ"));
    CHECK(
        runShell(lathectl("hosts add gpu-9 --address alice@h:2222 --user alice --port 2222" + on)).exitCode ==
        0);  // the same values twice do not conflict
    CHECK(nlohmann::json::parse(runShell(lathectl("hosts list --json" + on)).out).size() == 4);

    // Completion offers the workspace's host names.
    CHECK(runShell(lathectl("__complete hosts remove --db " + db + " gpu-")).out ==
          "gpu-1\ngpu-2\ngpu-3\ngpu-9\n");
    CHECK_THAT(runShell(lathectl("__complete hosts ''")).out,
               Catch::Contains("add\n") && Catch::Contains("list\n") && Catch::Contains("remove\n") &&
                   Catch::Contains("check\n") && Catch::Contains("trust\n"));

    const auto removed = runShell(lathectl("hosts remove gpu-2" + on));
    CHECK(removed.exitCode == 0);
    CHECK(removed.out == "removed host gpu-2\n");
    const auto again = runShell(lathectl("hosts remove gpu-2" + on));
    CHECK(again.exitCode == 2);
    CHECK_THAT(again.err, Catch::Contains("no host 'gpu-2' in " + db + " (lathectl hosts list shows them)"));
    const auto left = nlohmann::json::parse(runShell(lathectl("hosts list --json" + on)).out);
    REQUIRE(left.size() == 3);
    CHECK(left[1].at("name") == "gpu-3");

    // Checking a host given as user@host:port never creates a workspace.
    const std::string none = dir.file("none.db");
    CHECK(runShell(lathectl("hosts check 'gpu:99999' --db " + none)).exitCode == 2);
    CHECK_FALSE(std::filesystem::exists(none));
}

TEST_CASE(
    "lathectl hosts trust shows the key, adds it only when confirmed, then check reaches the host by name",
    "[remote][cli][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    SshdServer sshd;
    lathe::remote::test::TempDir dir;
    const std::string db = dir.file("ws.db");
    const std::string kh = sshd.knownHosts();  // not there yet
    const std::string on = " --known-hosts " + kh + " --db " + db;
    using lathe::test::runShell;
    REQUIRE(runShell(addFixture(sshd, "fixture", db)).exitCode == 0);

    // Nobody to ask (stdin is not a terminal) and no --yes: the fingerprint is shown, nothing added.
    const auto refused = runShell(lathectl("hosts trust fixture" + on) + " </dev/null");
    CHECK(refused.exitCode == 2);
    CHECK_THAT(refused.out, Catch::Contains("offers key " + sshd.hostKeyFingerprint()));
    CHECK_THAT(refused.err, Catch::Contains("not added: pass --yes after comparing the fingerprint") &&
                                Catch::Contains("ssh-keygen -lf"));
    CHECK_FALSE(std::filesystem::exists(kh));
    // Still unknown to a check.
    const auto unknown = runShell(lathectl("hosts check fixture" + on));
    CHECK(unknown.exitCode == 1);
    CHECK_THAT(unknown.err, Catch::Contains(sshd.hostKeyFingerprint()));

    const auto added = runShell(lathectl("hosts trust fixture --yes" + on) + " </dev/null");
    CHECK(added.exitCode == 0);
    CHECK_THAT(added.out, Catch::Contains("offers key " + sshd.hostKeyFingerprint()) &&
                              Catch::Contains("added to known_hosts"));
    REQUIRE(std::filesystem::exists(kh));
    const std::string known = lathe::remote::test::readFile(kh);
    const auto already = runShell(lathectl("hosts trust fixture --yes" + on) + " </dev/null");
    CHECK(already.exitCode == 0);
    CHECK_THAT(already.out, Catch::Contains("already trusted"));
    CHECK(lathe::remote::test::readFile(kh) == known);  // nothing appended twice

    // The check uses the record's address, port, user, identity and lathectl.
    const auto check = runShell(lathectl("hosts check fixture --json" + on));
    REQUIRE(check.exitCode == 0);
    const auto j = nlohmann::json::parse(check.out);
    CHECK(j.at("ok") == true);
    CHECK(j.at("name") == "fixture");
    CHECK(j.at("host") == std::string(SshdServer::kAddress) + ":" + std::to_string(sshd.port()));
    CHECK(j.at("host_key") == sshd.hostKeyFingerprint());
    CHECK(j.at("memory_kb").get<int64_t>() > 0);
    CHECK(j.at("lathectl_path") == lathe::test::binPath("lathectl"));
    CHECK(j.at("lathectl").get<std::string>() + "\n" == runShell(lathectl("--version")).out);
    CHECK(j.at("lathectl_matches") == true);
    const auto text = runShell(lathectl("hosts check fixture" + on));
    CHECK(text.exitCode == 0);
    CHECK_THAT(text.out, Catch::Contains("fixture (" + std::string(SshdServer::kAddress) + ":" +
                                         std::to_string(sshd.port()) + "): reachable") &&
                             Catch::Contains("GiB") && Catch::Contains("same as this one"));
    // A flag overrides the record: the other key is not authorized.
    const auto wrong = runShell(lathectl("hosts check fixture --identity " + sshd.wrongKey() + on));
    CHECK(wrong.exitCode == 1);
    CHECK_THAT(wrong.err, Catch::Contains("authentication failed"));
}

TEST_CASE("lathectl hosts trust never adds a changed host key, even with --yes", "[remote][cli][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    SshdServer sshd;
    // known_hosts lists another key for this host:port: what a man-in-the-middle looks like.
    const std::string line = "[" + std::string(SshdServer::kAddress) + "]:" + std::to_string(sshd.port()) +
                             " " + lathe::remote::test::readFile(sshd.wrongKey() + ".pub");
    lathe::remote::test::writeFile(sshd.knownHosts(), line);
    const auto r = lathe::test::runShell(lathectl("hosts trust " + lathe::remote::test::currentUser() + "@" +
                                                  SshdServer::kAddress + ":" + std::to_string(sshd.port()) +
                                                  " --identity " + sshd.clientKey() + " --known-hosts " +
                                                  sshd.knownHosts() + " --yes") +
                                         " </dev/null");
    CHECK(r.exitCode == 1);
    CHECK_THAT(r.err, Catch::Contains("host key differs") && Catch::Contains(sshd.hostKeyFingerprint()));
    CHECK_THAT(r.out, !Catch::Contains("added"));
    CHECK(lathe::remote::test::readFile(sshd.knownHosts()) == line);
}
