// lathectl hosts check: can Lathe reach this host over SSH, is its key the one we know, and
// what does it offer (CPU cores, GPUs)?
#include <algorithm>
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "lathe/remote/ssh_session.h"

namespace lathe::cli {
namespace {

struct HostsState {
    std::string target;
    std::string identity;
    std::string knownHosts;
    bool trustOnFirstUse = false;
    int timeout = 10;
    bool json = false;
};

// One probe command; each answer on its own tagged line so a missing tool just leaves a gap.
constexpr const char* kProbe =
    "echo \"os=$(uname -sr)\"; echo \"cores=$(nproc 2>/dev/null || echo ?)\"; "
    "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total "
    "--format=csv,noheader 2>/dev/null | sed 's/^/gpu=/'; "
    "command -v lathectl >/dev/null 2>&1 && echo \"lathectl=$(lathectl --version)\"; true";

int runCheck(const HostsState& st) {
    remote::HostSpec spec;
    try {
        spec = remote::parseHostSpec(st.target);
    } catch (const std::invalid_argument& ex) {
        throw UsageError(ex.what());
    }
    spec.identityFile = st.identity;
    spec.knownHostsFile = st.knownHosts;
    spec.connectTimeoutSec = st.timeout;
    nlohmann::json j{{"host", spec.label()}};
    try {
        remote::SshSession session(spec);
        session.connect(st.trustOnFirstUse ? remote::HostKeyPolicy::TrustOnFirstUse
                                           : remote::HostKeyPolicy::Strict);
        j["host_key"] = session.hostKeyFingerprint();
        std::string out, err;
        // A wedged nvidia-smi or a host gone quiet must not hang the check: the probe gets a
        // deadline of its own.
        const double probeTimeout = std::max(30, 3 * st.timeout);
        const auto res = session.exec(
            kProbe, [&](std::string_view c) { out.append(c); }, [&](std::string_view c) { err.append(c); },
            nullptr, probeTimeout);
        j["exit_status"] = res.exitStatus;
        if (res.exitStatus != 0 && !err.empty()) j["stderr"] = err.substr(0, 2000);
        std::istringstream lines(out);
        std::string line;
        j["gpus"] = nlohmann::json::array();
        while (std::getline(lines, line)) {
            const auto eq = line.find('=');
            if (eq == std::string::npos) continue;
            const auto key = line.substr(0, eq), value = line.substr(eq + 1);
            if (key == "gpu")
                j["gpus"].push_back(value);
            else if (key == "os" || key == "cores" || key == "lathectl")
                j[key] = value;  // only the probe's own keys: the remote shell may print anything
        }
        j["ok"] = res.exitStatus == 0;
    } catch (const remote::SshError& ex) {
        if (st.json) {
            j["ok"] = false;
            j["error"] = ex.what();
            std::cout << j.dump() << std::endl;
        } else {
            std::cerr << "lathectl: " << ex.what() << "\n";
        }
        return kRunFailed;
    }
    if (st.json) {
        std::cout << j.dump() << std::endl;
    } else {
        std::printf("%s: reachable, host key %s\n", j["host"].get<std::string>().c_str(),
                    j["host_key"].get<std::string>().c_str());
        for (const char* k : {"os", "cores", "lathectl"})
            if (j.contains(k)) std::printf("  %-9s %s\n", k, j[k].get<std::string>().c_str());
        for (const auto& g : j["gpus"]) std::printf("  gpu       %s\n", g.get<std::string>().c_str());
        if (j["gpus"].empty()) std::printf("  gpu       none found (no nvidia-smi)\n");
        if (j.contains("stderr"))
            std::printf("  probe exited with status %d: %s\n", j["exit_status"].get<int>(),
                        j["stderr"].get<std::string>().c_str());
    }
    return j["ok"].get<bool>() ? kOk : kRunFailed;
}

}  // namespace

void registerHosts(CLI::App& app, int& exitCode) {
    auto* hosts = app.add_subcommand("hosts", "remote hosts reached over SSH");
    hosts->require_subcommand(1);
    auto st = std::make_shared<HostsState>();
    auto* check =
        hosts->add_subcommand("check", "connect, verify the host key, and report OS, cores and GPUs");
    check->add_option("HOST", st->target, "[user@]host[:port]")->required();
    check->add_option("--identity,-i", st->identity,
                      "private key file (default: ssh-agent, then ~/.ssh keys)");
    check->add_option("--known-hosts", st->knownHosts, "known_hosts file (default: ~/.ssh/known_hosts)");
    check->add_flag("--trust-on-first-use", st->trustOnFirstUse,
                    "add an unknown host key to known_hosts (a changed key is always refused)");
    check->add_option("--timeout", st->timeout, "seconds per network step")->check(CLI::Range(1, 600));
    check->add_flag("--json", st->json, "print machine-readable JSON");
    // Hosts live in the workspace from the launcher issue on; --db is accepted for uniformity.
    auto db = std::make_shared<std::string>();
    check->add_option("--db", *db, "workspace database (unused by this command)");
    check->callback([st, &exitCode] { exitCode = runCheck(*st); });
}

}  // namespace lathe::cli
