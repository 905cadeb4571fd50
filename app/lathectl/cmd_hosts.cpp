// lathectl hosts: the workspace's inventory of SSH hosts (add, list, remove), and for one host
// (of the inventory, or [user@]host[:port]): can Lathe reach it, is its key the one we know, what
// does it offer (check), and adding its key to known_hosts after a look at it (trust).
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>

#include "cli_common.h"
#include "hosts_common.h"
#include "lathe/core/error.h"
#include "lathe/remote/host_spec.h"
#include "lathe/remote/ssh_session.h"

namespace lathe::cli {
namespace {

namespace fs = std::filesystem;

// ---- addresses and specs -------------------------------------------------------------------

// What an inventory address holds: the host, and the user and port only where written in it
// ("alice@gpu:2222"); a plain name may be an ssh-config alias.
struct Address {
    std::string host;
    std::string user;  // empty: none written
    int port = 0;      // 0: none written
};

Address parseAddress(const std::string& text) {
    remote::HostSpec spec;
    try {
        spec = remote::parseHostSpec(text);
    } catch (const std::invalid_argument& ex) {
        throw UsageError(ex.what());
    }
    Address a;
    a.host = spec.host;
    const auto at = text.rfind('@');
    if (at != std::string::npos) a.user = spec.user;
    // parseHostSpec fills in its default port when none is written: only a written one counts.
    // Its rules: "[v6]:port", or "host:port" with exactly one colon.
    const std::string rest = at == std::string::npos ? text : text.substr(at + 1);
    const bool portWritten = !rest.empty() && rest.front() == '['
                                 ? rest.find("]:") != std::string::npos
                                 : std::count(rest.begin(), rest.end(), ':') == 1;
    if (portWritten) a.port = spec.port;
    return a;
}

}  // namespace

remote::HostSpec specFor(const core::HostRecord& h) {
    Address a;
    try {
        a = parseAddress(h.address);
    } catch (const UsageError& ex) {
        throw UsageError("host '" + h.name + "' of the workspace: " + ex.what());
    }
    remote::HostSpec spec;
    spec.host = a.host;
    if (h.port != 0)
        spec.port = h.port;
    else if (a.port != 0)
        spec.port = a.port;
    spec.user = !h.user.empty() ? h.user : a.user;
    spec.identityFile = h.identity;
    return spec;
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
    std::string label() const { return record ? record->name + " (" + spec.label() + ")" : spec.label(); }
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
    const Address a = parseAddress(st.address);
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

// A word for the remote shell: single-quoted, and "~/" kept outside the quotes so the remote
// shell still expands it.
std::string shellWord(const std::string& text) {
    std::string rest = text, out;
    if (rest.rfind("~/", 0) == 0) {
        out = "\"$HOME\"/";
        rest = rest.substr(2);
    }
    out += "'";
    for (const char c : rest) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

// One probe command; each answer on its own tagged line so a missing tool just leaves a gap.
std::string probeCommand(const std::string& lathectlPath) {
    std::string probe =
        "echo \"os=$(uname -sr)\"; echo \"cores=$(nproc 2>/dev/null || echo ?)\"; "
        "echo \"mem=$(awk '/MemTotal/ {print $2}' /proc/meminfo 2>/dev/null)\"; "
        "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total "
        "--format=csv,noheader 2>/dev/null | sed 's/^/gpu=/'; ";
    if (lathectlPath.empty()) {
        probe += "command -v lathectl >/dev/null 2>&1 && echo \"lathectl=$(lathectl --version)\"; ";
    } else {
        const std::string p = shellWord(lathectlPath);
        probe += "[ -x " + p + " ] && echo \"lathectl=$(" + p + " --version 2>/dev/null)\"; ";
    }
    return probe + "true";
}

int runCheck(const CheckState& st) {
    Target target = resolveTarget(st.target, st.common.db);
    remote::HostSpec& spec = target.spec;
    if (!st.identity.empty()) spec.identityFile = st.identity;
    spec.knownHostsFile = st.knownHosts;
    spec.connectTimeoutSec = st.timeout;
    const std::string lathectlPath = target.record ? target.record->lathectl : std::string();
    const bool json = st.common.json;
    nlohmann::json j{{"host", spec.label()}};
    if (target.record) j["name"] = target.record->name;
    if (!lathectlPath.empty()) j["lathectl_path"] = lathectlPath;
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
            probeCommand(lathectlPath), [&](std::string_view c) { out.append(c); },
            [&](std::string_view c) { err.append(c); }, nullptr, probeTimeout);
        j["exit_status"] = res.exitStatus;
        if (res.exitStatus != 0 && !err.empty()) j["stderr"] = err.substr(0, 2000);
        std::istringstream lines(out);
        std::string line;
        j["gpus"] = nlohmann::json::array();
        while (std::getline(lines, line)) {
            const auto eq = line.find('=');
            if (eq == std::string::npos) continue;
            const auto key = line.substr(0, eq), value = line.substr(eq + 1);
            if (key == "gpu") {
                j["gpus"].push_back(value);
            } else if (key == "mem") {
                if (!value.empty() && value.size() < 16 &&
                    std::all_of(value.begin(), value.end(), [](unsigned char c) { return std::isdigit(c); }))
                    j["memory_kb"] = std::stoll(value);
            } else if (key == "os" || key == "cores" || key == "lathectl") {
                j[key] = value;  // only the probe's own keys: the remote shell may print anything
            }
        }
        j["lathectl_matches"] = j.contains("lathectl") && j["lathectl"].get<std::string>() == versionLine();
        j["ok"] = res.exitStatus == 0;
    } catch (const remote::SshError& ex) {
        if (json) {
            j["ok"] = false;
            j["error"] = ex.what();
            std::cout << j.dump() << std::endl;
        } else {
            std::cerr << "lathectl: " << ex.what() << "\n";
        }
        return kRunFailed;
    }
    if (json) {
        std::cout << j.dump() << std::endl;
        return j["ok"].get<bool>() ? kOk : kRunFailed;
    }
    std::printf("%s: reachable, host key %s\n", target.label().c_str(),
                j["host_key"].get<std::string>().c_str());
    for (const char* k : {"os", "cores"})
        if (j.contains(k)) std::printf("  %-9s %s\n", k, j[k].get<std::string>().c_str());
    if (j.contains("memory_kb"))
        std::printf("  %-9s %.1f GiB\n", "memory",
                    static_cast<double>(j["memory_kb"].get<int64_t>()) / (1 << 20));
    if (j.contains("lathectl")) {
        const auto theirs = j["lathectl"].get<std::string>();
        const std::string note =
            j["lathectl_matches"].get<bool>() ? "same as this one" : "this one is " + versionLine();
        std::printf("  %-9s %s (%s)\n", "lathectl", theirs.c_str(), note.c_str());
    } else if (!lathectlPath.empty()) {
        std::printf("  %-9s not found at %s\n", "lathectl", lathectlPath.c_str());
    }
    for (const auto& g : j["gpus"]) std::printf("  gpu       %s\n", g.get<std::string>().c_str());
    if (j["gpus"].empty()) std::printf("  gpu       none found (no nvidia-smi)\n");
    if (j.contains("stderr"))
        std::printf("  probe exited with status %d: %s\n", j["exit_status"].get<int>(),
                    j["stderr"].get<std::string>().c_str());
    return j["ok"].get<bool>() ? kOk : kRunFailed;
}

// ---- trust ---------------------------------------------------------------------------------

// The file SshSession reads: as given (with "~/" from $HOME), else ~/.ssh/known_hosts.
std::string knownHostsPath(const std::string& given) {
    std::string home;
    if (const char* h = std::getenv("HOME"); h && *h)
        home = h;
    else if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir)
        home = pw->pw_dir;
    else
        home = "/";
    if (given.empty()) return home + "/.ssh/known_hosts";
    if (given == "~") return home;
    if (given.rfind("~/", 0) == 0) return home + given.substr(1);
    return given;
}

std::optional<std::string> readIfExists(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Puts known_hosts back as it was (through a temporary name), or removes it if it was not there.
void restoreFile(const std::string& path, const std::optional<std::string>& before) {
    std::error_code ec;
    if (!before) {
        fs::remove(path, ec);
        return;
    }
    const std::string tmp = path + ".lathe-restore";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << *before;
        if (!out) return;
    }
    fs::rename(tmp, path, ec);
}

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
    Target target = resolveTarget(st.target, st.common.db);
    remote::HostSpec& spec = target.spec;
    if (!st.identity.empty()) spec.identityFile = st.identity;
    spec.knownHostsFile = st.knownHosts;
    spec.connectTimeoutSec = st.timeout;
    const std::string file = knownHostsPath(st.knownHosts);
    const std::string label = target.label();

    // First look without adding anything: known, changed, or unknown with this fingerprint.
    std::string offered;
    {
        remote::SshSession session(spec);
        try {
            session.connect(remote::HostKeyPolicy::Strict);
            std::printf("host %s: already trusted (host key %s in %s)\n", label.c_str(),
                        session.hostKeyFingerprint().c_str(), file.c_str());
            return kOk;
        } catch (const remote::HostKeyError& ex) {
            // A changed key (or one of another type) is never added: that is for a person to
            // resolve on the host and in known_hosts.
            if (ex.reason() != remote::HostKeyError::Reason::Unknown || ex.fingerprint().empty()) {
                std::cerr << "lathectl: " << ex.what() << "\n";
                return kRunFailed;
            }
            offered = ex.fingerprint();
        } catch (const remote::SshError& ex) {
            if (ex.kind() != remote::SshError::Kind::Auth) {
                std::cerr << "lathectl: " << ex.what() << "\n";
                return kRunFailed;
            }
            // The host key is verified before authentication is tried: it is known.
            std::printf("host %s: already trusted (host key %s in %s)\n", label.c_str(),
                        session.hostKeyFingerprint().c_str(), file.c_str());
            std::cerr << "lathectl: note: " << ex.what() << "\n";
            return kOk;
        }
    }

    std::printf("host %s offers key %s\n", label.c_str(), offered.c_str());
    std::fflush(stdout);
    const std::string hostsOwn =
        "the host's own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on the host)";
    if (!st.yes) {
        // Nobody to ask: a script must say --yes, having compared the fingerprint some other way.
        if (!::isatty(STDIN_FILENO))
            throw UsageError("not added: pass --yes after comparing the fingerprint with " + hostsOwn);
        std::cerr << "Compare it with " << hostsOwn << ".\n";
        if (!askYes("Add this key to " + file + "? [y/N] ")) {
            std::printf("not added\n");
            return kRunFailed;
        }
    }

    // Again, now adding the key: it must be the one just shown, or nothing stays added.
    const auto before = readIfExists(file);
    remote::SshSession session(spec);
    std::optional<std::string> failure;
    std::string authNote;
    try {
        session.connect(remote::HostKeyPolicy::TrustOnFirstUse);
    } catch (const remote::HostKeyError& ex) {
        failure = ex.what();
    } catch (const remote::SshError& ex) {
        if (ex.kind() == remote::SshError::Kind::Auth)
            authNote = ex.what();  // after the key was verified and added
        else
            failure = ex.what();
    }
    if (!failure && session.hostKeyFingerprint() != offered) {
        if (readIfExists(file) != before) restoreFile(file, before);
        std::cerr << "lathectl: host " << label << " offered another key on the second connection ("
                  << session.hostKeyFingerprint() << ", not " << offered
                  << "); not added: someone may be intercepting the connection\n";
        return kRunFailed;
    }
    if (failure) {
        std::cerr << "lathectl: " << *failure << "\n";
        return kRunFailed;
    }
    std::printf("host %s: key %s added to known_hosts (%s)\n", label.c_str(), offered.c_str(), file.c_str());
    if (!authNote.empty()) std::cerr << "lathectl: note: " << authNote << "\n";
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
