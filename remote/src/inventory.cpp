// The inventory's SSH work (inventory.h): one probe and one trust procedure, used by
// `lathectl hosts check|trust` and by the workbench's Hosts page.
#include "lathe/remote/inventory.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "lathe/core/error.h"
#include "lathe/remote/errors.h"
#include "lathe/remote/sftp.h"
#include "lathe/remote/ssh_session.h"

namespace lathe::remote {

namespace {

namespace fs = std::filesystem;

// A word for the remote shell: single-quoted, with "~/" kept outside the quotes so the remote
// shell still expands it.
std::string shellWord(const std::string& text) {
    if (text.rfind("~/", 0) == 0) return "\"$HOME\"/" + shellQuote(text.substr(2));
    return shellQuote(text);
}

// One probe; each answer on its own tagged line so a missing tool just leaves a gap. POSIX sh,
// handed to `sh -c` so that the login shell (csh, fish, …) only has to run one quoted command.
std::string probeCommand(const std::string& lathectlPath) {
    std::string probe =
        "echo \"os=$(uname -sr)\"; echo \"arch=$(uname -m)\"; echo \"cores=$(nproc 2>/dev/null || echo ?)\"; "
        "echo \"mem=$(awk '/MemTotal/ {print $2}' /proc/meminfo 2>/dev/null)\"; "
        "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total "
        "--format=csv,noheader 2>/dev/null | sed 's/^/gpu=/'; ";
    if (lathectlPath.empty()) {
        probe +=
            "command -v lathectl >/dev/null 2>&1 && echo \"lathectl=$(lathectl --version 2>/dev/null | head "
            "-n 1)\"; ";
    } else {
        const std::string p = shellWord(lathectlPath);
        probe += "[ -x " + p + " ] && echo \"lathectl=$(" + p + " --version 2>/dev/null | head -n 1)\"; ";
    }
    probe += "true";
    return "sh -c " + shellQuote(probe);
}

bool allDigits(const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

HostSpec specWith(const ProbeTarget& target, const ProbeOptions& options) {
    HostSpec spec = target.spec;
    spec.knownHostsFile = options.knownHostsFile;
    spec.connectTimeoutSec = options.connectTimeoutSec;
    return spec;
}

// "host gpu-b (10.0.0.3): …" reads better than "host 10.0.0.3: …" on a page listing names.
std::string named(const ProbeTarget& target, const SshError& ex) {
    const std::string what = ex.what();
    if (ex.host() == target.name || what.rfind("host " + target.name, 0) == 0) return what;
    return "host " + target.name + ": " + what;
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

}  // namespace

AddressParts splitAddress(const std::string& text) {
    HostSpec spec;
    try {
        spec = parseHostSpec(text);
    } catch (const std::invalid_argument& ex) {
        throw core::ConfigError(ex.what());
    }
    // parseHostSpec leaves the user empty and the port 0 unless the text names them.
    return AddressParts{spec.host, spec.user, spec.port};
}

HostSpec hostSpecFor(const core::HostRecord& h) {
    AddressParts a;
    try {
        a = splitAddress(h.address);
    } catch (const core::ConfigError& ex) {
        throw core::ConfigError("host '" + h.name + "' of the workspace: " + ex.what());
    }
    HostSpec spec;
    spec.host = a.host;
    spec.port = h.port != 0 ? h.port : a.port;
    spec.user = !h.user.empty() ? h.user : a.user;
    spec.identityFile = h.identity;
    return spec;
}

ProbeTarget probeTargetFor(const core::HostRecord& host) {
    return ProbeTarget{hostSpecFor(host), host.name, host.lathectl};
}

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

HostProbe probeHost(const ProbeTarget& target, const ProbeOptions& options) {
    const auto t0 = std::chrono::steady_clock::now();
    HostProbe p;
    p.lathectlPath = target.lathectlPath;
    auto finish = [&] {
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return p;
    };
    try {
        SshSession session(specWith(target, options));
        session.connect(options.trustOnFirstUse ? HostKeyPolicy::TrustOnFirstUse : HostKeyPolicy::Strict);
        p.fingerprint = session.hostKeyFingerprint();
        p.address = session.peerAddress();
        std::string out, err;
        // A wedged nvidia-smi or a host gone quiet must not hold the check: it has a deadline.
        const double probeTimeout = std::max(30, 3 * options.connectTimeoutSec);
        const auto res = session.exec(
            probeCommand(target.lathectlPath), [&](std::string_view c) { out.append(c); },
            [&](std::string_view c) { err.append(c); }, options.cancel, probeTimeout);
        if (res.cancelled) {
            p.problem = "host " + target.name + ": check cancelled";
            return finish();
        }
        p.exitStatus = res.exitStatus;
        if (res.exitStatus != 0) p.probeStderr = err.substr(0, 2000);
        std::istringstream lines(out);
        std::string line;
        while (std::getline(lines, line)) {
            const auto eq = line.find('=');
            if (eq == std::string::npos) continue;
            const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
            // Only the probe's own keys: the remote shell's start-up files may print anything.
            if (key == "gpu") {
                p.gpus.push_back(value);
            } else if (key == "mem") {
                if (allDigits(value) && value.size() < 16) p.memoryKb = std::stoll(value);
            } else if (key == "cores") {
                if (allDigits(value) && value.size() < 7) p.cores = std::stoi(value);
            } else if (key == "os") {
                p.os = value;
            } else if (key == "arch") {
                p.arch = value;
            } else if (key == "lathectl") {
                p.lathectlVersion = value;
            }
        }
        p.lathectlMatches = !p.lathectlVersion.empty() && p.lathectlVersion == options.expectedVersion;
        p.reachable = true;
        if (res.exitStatus != 0)
            p.problem =
                "host " + target.name + ": the probe exited with status " + std::to_string(res.exitStatus) +
                (p.probeStderr.empty() ? "" : ": " + p.probeStderr.substr(0, p.probeStderr.find('\n')));
    } catch (const HostKeyError& ex) {
        p.problem = named(target, ex);
        p.fingerprint = ex.fingerprint();
        switch (ex.reason()) {
            case HostKeyError::Reason::Unknown:
                p.key = HostKeyState::Unknown;
                break;
            case HostKeyError::Reason::Changed:
                p.key = HostKeyState::Changed;
                break;
            default:
                p.key = HostKeyState::Other;
                break;
        }
    } catch (const SshError& ex) {
        p.problem = named(target, ex);
    } catch (const std::exception& ex) {  // an address that does not parse, …
        p.problem = ex.what();
    }
    return finish();
}

HostProbe probeHost(const core::HostRecord& host, const ProbeOptions& options) {
    ProbeTarget target;
    try {
        target = probeTargetFor(host);
    } catch (const std::exception& ex) {
        HostProbe p;
        p.lathectlPath = host.lathectl;
        p.problem = ex.what();
        return p;
    }
    return probeHost(target, options);
}

KeyLook lookAtHostKey(const ProbeTarget& target, const ProbeOptions& options) {
    KeyLook look;
    look.knownHostsFile = knownHostsPath(options.knownHostsFile);
    try {
        SshSession session(specWith(target, options));
        try {
            session.connect(HostKeyPolicy::Strict);
            look.result = KeyLook::Result::Trusted;
            look.fingerprint = session.hostKeyFingerprint();
            look.message = "host " + target.name + ": already trusted (host key " + look.fingerprint +
                           " in " + look.knownHostsFile + ")";
        } catch (const HostKeyError& ex) {
            // A changed key (or one of another type) is never added: that is for a person to
            // resolve on the host and in known_hosts.
            if (ex.reason() == HostKeyError::Reason::Unknown && !ex.fingerprint().empty()) {
                look.result = KeyLook::Result::Unknown;
                look.fingerprint = ex.fingerprint();
                look.message = "host " + target.name + " offers key " + look.fingerprint;
            } else {
                look.result = KeyLook::Result::Refused;
                look.fingerprint = ex.fingerprint();
                look.message = named(target, ex);
            }
        } catch (const SshError& ex) {
            if (ex.kind() != SshError::Kind::Auth) {
                look.result = KeyLook::Result::Refused;
                look.message = named(target, ex);
            } else {
                // The host key is verified before authentication is tried: it is known.
                look.result = KeyLook::Result::Trusted;
                look.fingerprint = session.hostKeyFingerprint();
                look.message = "host " + target.name + ": already trusted (host key " + look.fingerprint +
                               " in " + look.knownHostsFile + "), but " + ex.what();
            }
        }
    } catch (const std::exception& ex) {
        look.result = KeyLook::Result::Refused;
        look.message = ex.what();
    }
    return look;
}

KeyLook lookAtHostKey(const core::HostRecord& host, const ProbeOptions& options) {
    try {
        return lookAtHostKey(probeTargetFor(host), options);
    } catch (const std::exception& ex) {
        KeyLook look;
        look.knownHostsFile = knownHostsPath(options.knownHostsFile);
        look.message = ex.what();
        return look;
    }
}

TrustResult trustHostKey(const ProbeTarget& target, const std::string& offered, const ProbeOptions& options) {
    TrustResult t;
    const std::string file = knownHostsPath(options.knownHostsFile);
    try {
        const auto before = readIfExists(file);
        SshSession session(specWith(target, options));
        try {
            session.connect(HostKeyPolicy::TrustOnFirstUse);
        } catch (const HostKeyError& ex) {
            t.message = named(target, ex);
            return t;
        } catch (const SshError& ex) {
            if (ex.kind() != SshError::Kind::Auth) {
                t.message = named(target, ex);
                return t;
            }
            t.note = ex.what();  // after the key was verified and added
        }
        // It must be the key the person saw, or nothing stays added.
        if (session.hostKeyFingerprint() != offered) {
            if (readIfExists(file) != before) restoreFile(file, before);
            t.note.clear();
            t.message = "host " + target.name + " offered another key on the second connection (" +
                        session.hostKeyFingerprint() + ", not " + offered +
                        "); not added: someone may be intercepting the connection";
            return t;
        }
        t.added = true;
        t.message = "host " + target.name + ": key " + offered + " added to known_hosts (" + file + ")";
    } catch (const std::exception& ex) {
        t.message = ex.what();
    }
    return t;
}

TrustResult trustHostKey(const core::HostRecord& host, const std::string& offered,
                         const ProbeOptions& options) {
    try {
        return trustHostKey(probeTargetFor(host), offered, options);
    } catch (const std::exception& ex) {
        TrustResult t;
        t.message = ex.what();
        return t;
    }
}

}  // namespace lathe::remote
