// lathectl hosts: the workspace's inventory of SSH hosts (add, list, remove), and for one host
// (of the inventory, or [user@]host[:port]): can Lathe reach it, is its key the one we know, what
// does it offer (check), and adding its key to known_hosts after a look at it (trust).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "cli_common.h"
#include "hosts_common.h"
#include "lathe/core/error.h"
#include "lathe/remote/host_spec.h"
#include "lathe/remote/inventory.h"

namespace lathe::cli {
namespace {

namespace fs = std::filesystem;

// ---- addresses and specs -------------------------------------------------------------------

remote::AddressParts parseAddress(const std::string& text) {
    try {
        return remote::splitAddress(text);
    } catch (const core::ConfigError& ex) {
        throw UsageError(ex.what());
    }
}

}  // namespace

remote::HostSpec specFor(const core::HostRecord& h) {
    try {
        return remote::hostSpecFor(h);
    } catch (const core::ConfigError& ex) {
        throw UsageError(ex.what());
    }
}

namespace {

// "alice@10.0.0.2:2222", "[::1]:2222", "gpu-2": the record's address as one would type it.
std::string addressText(const core::HostRecord& h) {
    std::string out = h.user.empty() ? std::string() : h.user + "@";
    const bool v6 = h.address.find(':') != std::string::npos;
    if (h.port == 0) return out + h.address;
    return out + (v6 ? "[" + h.address + "]" : h.address) + ":" + std::to_string(h.port);
}

bool isHostName(const std::string& word) {
    try {
        core::Store::validateHostName(word);
        return true;
    } catch (const core::ConfigError&) {
        return false;
    }
}

// The host a command names: a host of the inventory, else [user@]host[:port]. The workspace is
// read only when the word could be a name and the file exists: checking alice@gpu must not
// create a workspace.
struct Target {
    remote::HostSpec spec;
    std::optional<core::HostRecord> record;
    std::string label() const {
        return record && record->name != spec.label() ? record->name + " (" + spec.label() + ")"
                                                      : spec.label();
    }
};

Target resolveTarget(const std::string& word, const std::string& db) {
    Target t;
    std::error_code ec;
    if (isHostName(word) && fs::is_regular_file(core::Store::resolvePath(db), ec)) {
        CommonOptions opts;
        opts.db = db;
        t.record = openStore(opts)->host(word);
    }
    if (t.record) {
        t.spec = specFor(*t.record);
        return t;
    }
    try {
        t.spec = remote::parseHostSpec(word);
    } catch (const std::invalid_argument& ex) {
        throw UsageError(ex.what());
    }
    return t;
}

// ---- add, list, remove ---------------------------------------------------------------------

struct AddState {
    CommonOptions common;
    std::string name, address, user, identity, lathectl;
    int port = 0;
    int slots = 1;
    CLI::Option* portOption = nullptr;
    CLI::Option* userOption = nullptr;
};

nlohmann::json hostJson(const core::HostRecord& h) {
    return {{"name", h.name},         {"address", h.address},   {"port", h.port},   {"user", h.user},
            {"identity", h.identity}, {"lathectl", h.lathectl}, {"slots", h.slots}, {"added_at", h.addedAt}};
}

void runAdd(const AddState& st) {
    core::Store::validateHostName(st.name);  // before anything is opened or created
    const remote::AddressParts a = parseAddress(st.address);
    core::HostRecord h;
    h.name = st.name;
    h.address = a.host;
    h.user = st.user;
    if (st.userOption->count() > 0 && !a.user.empty() && a.user != st.user)
        throw UsageError("--user " + st.user + " and the user in --address " + st.address +
                         " differ; give the user once");
    if (st.userOption->count() == 0) h.user = a.user;
    h.port = st.port;
    if (st.portOption->count() > 0 && a.port != 0 && a.port != st.port)
        throw UsageError("--port " + std::to_string(st.port) + " and the port in --address " + st.address +
                         " differ; give the port once");
    if (st.portOption->count() == 0) h.port = a.port;
    // A relative key path would mean another file from another directory.
    h.identity = st.identity;
    if (!h.identity.empty() && h.identity.front() != '~' && fs::path(h.identity).is_relative()) {
        std::error_code ec;
        const auto abs = fs::absolute(h.identity, ec);
        if (!ec) h.identity = abs.lexically_normal().string();
    }
    h.lathectl = st.lathectl;
    h.slots = st.slots;

    auto store = openStore(st.common);
    if (store->host(h.name))
        throw UsageError("host '" + h.name + "' already exists; remove it first or choose another name");
    store->addHost(h);
    const auto added = store->host(h.name);
    if (st.common.json) {
        std::cout << hostJson(added ? *added : h).dump() << std::endl;
        return;
    }
    std::printf("added host %s (%s, %d slot%s)\n", h.name.c_str(), addressText(h).c_str(), h.slots,
                h.slots == 1 ? "" : "s");
}

void runList(const CommonOptions& common) {
    auto store = openStore(common);
    const auto hosts = store->hosts();
    if (common.json) {
        auto a = nlohmann::json::array();
        for (const auto& h : hosts) a.push_back(hostJson(h));
        std::cout << a.dump() << std::endl;
        return;
    }
    if (hosts.empty()) {
        std::printf("no hosts in %s (lathectl hosts add NAME --address HOST)\n", store->path().c_str());
        return;
    }
    std::vector<std::vector<std::string>> rows{{"NAME", "ADDRESS", "PORT", "USER", "SLOTS", "LATHECTL"}};
    for (const auto& h : hosts)
        rows.push_back({h.name, h.address, h.port == 0 ? "-" : std::to_string(h.port),
                        h.user.empty() ? "-" : h.user, std::to_string(h.slots),
                        h.lathectl.empty() ? "-" : h.lathectl});
    std::vector<size_t> width(rows.front().size(), 0);
    for (const auto& r : rows)
        for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
    for (const auto& r : rows) {
        std::string line;
        for (size_t c = 0; c < r.size(); ++c) {
            const bool last = c + 1 == r.size();
            const bool right = c == 2 || c == 4;  // numbers
            const std::string pad(last ? 0 : width[c] - r[c].size(), ' ');
            line += right ? pad + r[c] : r[c] + pad;
            if (!last) line += "  ";
        }
        std::printf("%s\n", line.c_str());
    }
}

struct RemoveState {
    CommonOptions common;
    std::string name;
};

void runRemove(const std::string& name, const CommonOptions& common) {
    auto store = openStore(common);
    if (!store->removeHost(name))
        throw UsageError("no host '" + name + "' in " + store->path() + " (lathectl hosts list shows them)");
    std::printf("removed host %s\n", name.c_str());
}

// ---- check ---------------------------------------------------------------------------------

struct CheckState {
    CommonOptions common;
    std::string target;
    std::string identity;
    std::string knownHosts;
    bool trustOnFirstUse = false;
    bool yes = false;  // trust
    int timeout = 10;
};

remote::ProbeTarget probeTarget(const Target& target) {
    remote::ProbeTarget t;
    t.spec = target.spec;
    t.name = target.record ? target.record->name : target.spec.label();
    if (target.record) t.lathectlPath = target.record->lathectl;
    return t;
}

remote::ProbeOptions probeOptions(const CheckState& st) {
    remote::ProbeOptions o;
    o.knownHostsFile = st.knownHosts;
    o.connectTimeoutSec = st.timeout;
    o.expectedVersion = versionLine();
    o.trustOnFirstUse = st.trustOnFirstUse;
    return o;
}

Target targetOf(const CheckState& st) {
    Target target = resolveTarget(st.target, st.common.db);
    if (!st.identity.empty()) target.spec.identityFile = st.identity;
    return target;
}

int runCheck(const CheckState& st) {
    const Target target = targetOf(st);
    const remote::HostProbe p = remote::probeHost(probeTarget(target), probeOptions(st));
    nlohmann::json j{{"host", target.spec.label()}, {"ok", p.reachable && p.exitStatus == 0}};
    if (target.record) j["name"] = target.record->name;
    if (!p.lathectlPath.empty()) j["lathectl_path"] = p.lathectlPath;
    if (!p.reachable) {
        j["error"] = p.problem;
        if (!p.fingerprint.empty()) j["offered_key"] = p.fingerprint;
        if (st.common.json)
            std::cout << j.dump() << std::endl;
        else
            std::cerr << "lathectl: " << p.problem << "\n";
        return kRunFailed;
    }
    j["host_key"] = p.fingerprint;
    j["address"] = p.address;
    j["exit_status"] = p.exitStatus;
    if (!p.probeStderr.empty()) j["stderr"] = p.probeStderr;
    if (!p.os.empty()) j["os"] = p.os;
    if (!p.arch.empty()) j["arch"] = p.arch;
    if (p.cores > 0) j["cores"] = std::to_string(p.cores);
    if (p.memoryKb > 0) j["memory_kb"] = p.memoryKb;
    j["gpus"] = p.gpus;
    if (!p.lathectlVersion.empty()) j["lathectl"] = p.lathectlVersion;
    j["lathectl_matches"] = p.lathectlMatches;
    if (st.common.json) {
        std::cout << j.dump() << std::endl;
        return j["ok"].get<bool>() ? kOk : kRunFailed;
    }
    std::printf("%s: reachable, host key %s\n", target.label().c_str(), p.fingerprint.c_str());
    if (!p.os.empty())
        std::printf("  %-9s %s%s\n", "os", p.os.c_str(), p.arch.empty() ? "" : (" " + p.arch).c_str());
    if (p.cores > 0) std::printf("  %-9s %d\n", "cores", p.cores);
    if (p.memoryKb > 0)
        std::printf("  %-9s %.1f GiB\n", "memory", static_cast<double>(p.memoryKb) / (1 << 20));
    if (!p.lathectlVersion.empty()) {
        const std::string note = p.lathectlMatches ? "same as this one" : "this one is " + versionLine();
        std::printf("  %-9s %s (%s)\n", "lathectl", p.lathectlVersion.c_str(), note.c_str());
    } else if (!p.lathectlPath.empty()) {
        std::printf("  %-9s not found at %s\n", "lathectl", p.lathectlPath.c_str());
    }
    for (const auto& g : p.gpus) std::printf("  gpu       %s\n", g.c_str());
    if (p.gpus.empty()) std::printf("  gpu       none found (no nvidia-smi)\n");
    if (!p.problem.empty()) std::printf("  %s\n", p.problem.c_str());
    return j["ok"].get<bool>() ? kOk : kRunFailed;
}

// ---- trust ---------------------------------------------------------------------------------

bool askYes(const std::string& question) {
    std::cerr << question << std::flush;
    std::string answer;
    if (!std::getline(std::cin, answer)) return false;
    answer.erase(0, answer.find_first_not_of(" \t"));
    answer.erase(answer.find_last_not_of(" \t\r") + 1);
    std::transform(answer.begin(), answer.end(), answer.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return answer == "y" || answer == "yes";
}

int runTrust(const CheckState& st) {
    const Target target = targetOf(st);
    const remote::ProbeTarget pt = probeTarget(target);
    remote::ProbeOptions options = probeOptions(st);
    options.trustOnFirstUse = false;

    // First look without adding anything: known, changed, or unknown with this fingerprint.
    const remote::KeyLook look = remote::lookAtHostKey(pt, options);
    switch (look.result) {
        case remote::KeyLook::Result::Trusted:
            std::printf("%s\n", look.message.c_str());
            return kOk;
        case remote::KeyLook::Result::Refused:
            // A changed key (or one of another type) is never added: that is for a person to
            // resolve on the host and in known_hosts.
            std::cerr << "lathectl: " << look.message << "\n";
            return kRunFailed;
        case remote::KeyLook::Result::Unknown:
            break;
    }

    std::printf("%s\n", look.message.c_str());
    std::fflush(stdout);
    const std::string hostsOwn =
        "the host's own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on the host)";
    if (!st.yes) {
        // Nobody to ask: a script must say --yes, having compared the fingerprint some other way.
        if (!::isatty(STDIN_FILENO))
            throw UsageError("not added: pass --yes after comparing the fingerprint with " + hostsOwn);
        std::cerr << "Compare it with " << hostsOwn << ".\n";
        if (!askYes("Add this key to " + look.knownHostsFile + "? [y/N] ")) {
            std::printf("not added\n");
            return kRunFailed;
        }
    }

    // Again, now adding the key: it must be the one just shown, or nothing stays added.
    const remote::TrustResult t = remote::trustHostKey(pt, look.fingerprint, options);
    if (!t.added) {
        std::cerr << "lathectl: " << t.message << "\n";
        return kRunFailed;
    }
    std::printf("%s\n", t.message.c_str());
    if (!t.note.empty()) std::cerr << "lathectl: note: " << t.note << "\n";
    return kOk;
}

void addConnectionOptions(CLI::App* cmd, CheckState& st) {
    cmd->add_option("HOST", st.target, "a host of the workspace (lathectl hosts list), or [user@]host[:port]")
        ->required();
    cmd->add_option("--identity,-i", st.identity,
                    "private key file (default: the host's --identity, else ssh-agent, then ~/.ssh keys)");
    cmd->add_option("--known-hosts", st.knownHosts, "known_hosts file (default: ~/.ssh/known_hosts)");
    cmd->add_option("--timeout", st.timeout, "seconds per network step")->check(CLI::Range(1, 600));
}

}  // namespace

void registerHosts(CLI::App& app, int& exitCode) {
    auto* hosts = app.add_subcommand("hosts", "the workspace's SSH hosts: add, list, remove, check, trust");
    hosts->require_subcommand(1);

    auto add = std::make_shared<AddState>();
    auto* a = hosts->add_subcommand("add", "add a host to the workspace");
    a->add_option("NAME", add->name, "the host's name in Lathe: letters, digits, '.', '_', '-'")->required();
    a->add_option("--address", add->address, "host name, address or ssh-config alias; [user@]host[:port]")
        ->required();
    add->portOption = a->add_option("--port", add->port, "SSH port (default: ssh config, else 22)")
                          ->check(CLI::Range(1, 65535));
    add->userOption = a->add_option("--user", add->user, "login name (default: ssh config, else yours)");
    a->add_option("--identity", add->identity,
                  "private key file, a path only (default: ssh-agent, then ~/.ssh keys)");
    a->add_option("--lathectl", add->lathectl, "lathectl on the host (default: the one on its PATH)");
    a->add_option("--slots", add->slots, "runs it takes at once (1..4096)")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    addCommonOptions(a, add->common);
    a->callback([add] { runAdd(*add); });

    auto list = std::make_shared<CommonOptions>();
    auto* l = hosts->add_subcommand("list", "the workspace's hosts");
    addCommonOptions(l, *list);
    l->callback([list] { runList(*list); });

    auto remove = std::make_shared<RemoveState>();
    auto* r = hosts->add_subcommand("remove", "remove a host from the workspace");
    r->add_option("NAME", remove->name, "the host's name")->required();
    addCommonOptions(r, remove->common, false);
    r->callback([remove] { runRemove(remove->name, remove->common); });

    auto check = std::make_shared<CheckState>();
    auto* c = hosts->add_subcommand(
        "check", "connect, verify the host key, and report OS, cores, memory, GPUs and lathectl");
    addConnectionOptions(c, *check);
    c->add_flag("--trust-on-first-use", check->trustOnFirstUse,
                "add an unknown host key to known_hosts (a changed key is always refused)");
    addCommonOptions(c, check->common);
    c->callback([check, &exitCode] { exitCode = runCheck(*check); });

    auto trust = std::make_shared<CheckState>();
    auto* t = hosts->add_subcommand(
        "trust", "show an unknown host's key fingerprint and add it to known_hosts once confirmed");
    addConnectionOptions(t, *trust);
    t->add_flag("--yes,-y", trust->yes,
                "add the key without asking (after comparing its fingerprint with the host's own)");
    addCommonOptions(t, trust->common, false);
    t->callback([trust, &exitCode] { exitCode = runTrust(*trust); });
}

}  // namespace lathe::cli
