// The Hosts page's SSH work: the same probe and trust steps as `lathectl hosts check|trust`
// (app/lathectl/cmd_hosts.cpp), here as functions that return what they found instead of
// printing it, so the page can run them on a pool and show the outcome.
#include "lathe/widgets/host_probe.h"

#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "lathe/core/error.h"
#include "lathe/core/executable.h"
#include "lathe/remote/errors.h"
#include "lathe/remote/sftp.h"
#include "lathe/remote/ssh_session.h"

namespace lathe::widgets {

namespace {

namespace fs = std::filesystem;

// A word for the remote shell: single-quoted, with "~/" kept outside the quotes so the remote
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
    return probe + "true";
}

bool allDigits(const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

remote::HostSpec specWith(const core::HostRecord& host, const ProbeOptions& options) {
    remote::HostSpec spec = hostSpecFor(host);
    spec.knownHostsFile = options.knownHostsFile;
    spec.connectTimeoutSec = options.connectTimeoutSec;
    return spec;
}

// "host gpu-b (10.0.0.3): …" reads better than "host 10.0.0.3: …" on a page listing names.
std::string named(const core::HostRecord& host, const remote::SshError& ex) {
    const std::string what = ex.what();
    if (ex.host() == host.name) return what;
    return "host " + host.name + ": " + what;
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
    remote::HostSpec spec;
    try {
        spec = remote::parseHostSpec(text);
    } catch (const std::invalid_argument& ex) {
        throw core::ConfigError(ex.what());
    }
    AddressParts a;
    a.host = spec.host;
    const auto at = text.rfind('@');
    if (at != std::string::npos) a.user = spec.user;
    // Only a port written in the text counts. parseHostSpec's rules: "[v6]:port", or
    // "host:port" with exactly one colon.
    const std::string rest = at == std::string::npos ? text : text.substr(at + 1);
    const bool portWritten = !rest.empty() && rest.front() == '['
                                 ? rest.find("]:") != std::string::npos
                                 : std::count(rest.begin(), rest.end(), ':') == 1;
    if (portWritten) a.port = spec.port;
    return a;
}

remote::HostSpec hostSpecFor(const core::HostRecord& h) {
    AddressParts a;
    try {
        a = splitAddress(h.address);
    } catch (const core::ConfigError& ex) {
        throw core::ConfigError("host '" + h.name + "' of the workspace: " + ex.what());
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

std::string lathectlVersion(const std::string& program) {
    const std::string path = program.empty() ? core::siblingProgram("lathectl") : program;
    const std::string command = remote::shellQuote(path) + " --version 2>/dev/null";
    std::FILE* pipe = ::popen(command.c_str(), "r");
    if (!pipe) throw core::Error("cannot run " + path + " --version");
    std::string out;
    char buf[256];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0 && out.size() < 4096) out.append(buf, n);
    const int status = ::pclose(pipe);
    const std::string line = out.substr(0, out.find('\n'));
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || line.empty())
        throw core::Error(path + " --version did not answer (is it this build's lathectl?)");
    return line;
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

HostProbe probeHost(const core::HostRecord& host, const ProbeOptions& options) {
    const auto t0 = std::chrono::steady_clock::now();
    HostProbe p;
    p.lathectlPath = host.lathectl;
    auto finish = [&] {
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return p;
    };
    try {
        remote::SshSession session(specWith(host, options));
        session.connect(remote::HostKeyPolicy::Strict);
        p.fingerprint = session.hostKeyFingerprint();
        p.address = session.peerAddress();
        std::string out, err;
        // A wedged nvidia-smi or a host gone quiet must not hold the check: it has a deadline.
        const double probeTimeout = std::max(30, 3 * options.connectTimeoutSec);
        const auto res = session.exec(
            probeCommand(host.lathectl), [&](std::string_view c) { out.append(c); },
            [&](std::string_view c) { err.append(c); }, options.cancel, probeTimeout);
        if (res.cancelled) {
            p.problem = "host " + host.name + ": check cancelled";
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
                "host " + host.name + ": the probe exited with status " + std::to_string(res.exitStatus) +
                (p.probeStderr.empty() ? "" : ": " + p.probeStderr.substr(0, p.probeStderr.find('\n')));
    } catch (const remote::HostKeyError& ex) {
        p.problem = named(host, ex);
        p.fingerprint = ex.fingerprint();
        switch (ex.reason()) {
            case remote::HostKeyError::Reason::Unknown:
                p.key = HostKeyState::Unknown;
                break;
            case remote::HostKeyError::Reason::Changed:
                p.key = HostKeyState::Changed;
                break;
            default:
                p.key = HostKeyState::Other;
                break;
        }
    } catch (const remote::SshError& ex) {
        p.problem = named(host, ex);
    } catch (const std::exception& ex) {  // an address that does not parse, …
        p.problem = ex.what();
    }
    return finish();
}

KeyLook lookAtHostKey(const core::HostRecord& host, const ProbeOptions& options) {
    KeyLook look;
    look.knownHostsFile = knownHostsPath(options.knownHostsFile);
    try {
        remote::SshSession session(specWith(host, options));
        try {
            session.connect(remote::HostKeyPolicy::Strict);
            look.result = KeyLook::Result::Trusted;
            look.fingerprint = session.hostKeyFingerprint();
            look.message = "host " + host.name + ": already trusted (host key " + look.fingerprint + " in " +
                           look.knownHostsFile + ")";
        } catch (const remote::HostKeyError& ex) {
            // A changed key (or one of another type) is never added: that is for a person to
            // resolve on the host and in known_hosts.
            if (ex.reason() == remote::HostKeyError::Reason::Unknown && !ex.fingerprint().empty()) {
                look.result = KeyLook::Result::Unknown;
                look.fingerprint = ex.fingerprint();
                look.message = "host " + host.name + " offers key " + look.fingerprint;
            } else {
                look.result = KeyLook::Result::Refused;
                look.fingerprint = ex.fingerprint();
                look.message = named(host, ex);
            }
        } catch (const remote::SshError& ex) {
            if (ex.kind() != remote::SshError::Kind::Auth) {
                look.result = KeyLook::Result::Refused;
                look.message = named(host, ex);
            } else {
                // The host key is verified before authentication is tried: it is known.
                look.result = KeyLook::Result::Trusted;
                look.fingerprint = session.hostKeyFingerprint();
                look.message = "host " + host.name + ": already trusted (host key " + look.fingerprint +
                               "), but " + ex.what();
            }
        }
    } catch (const std::exception& ex) {
        look.result = KeyLook::Result::Refused;
        look.message = ex.what();
    }
    return look;
}

TrustResult trustHostKey(const core::HostRecord& host, const std::string& offered,
                         const ProbeOptions& options) {
    TrustResult t;
    const std::string file = knownHostsPath(options.knownHostsFile);
    try {
        const auto before = readIfExists(file);
        remote::SshSession session(specWith(host, options));
        std::string authNote;
        try {
            session.connect(remote::HostKeyPolicy::TrustOnFirstUse);
        } catch (const remote::HostKeyError& ex) {
            t.message = named(host, ex);
            return t;
        } catch (const remote::SshError& ex) {
            if (ex.kind() != remote::SshError::Kind::Auth) {
                t.message = named(host, ex);
                return t;
            }
            authNote = ex.what();  // after the key was verified and added
        }
        // It must be the key the person saw, or nothing stays added.
        if (session.hostKeyFingerprint() != offered) {
            if (readIfExists(file) != before) restoreFile(file, before);
            t.message = "host " + host.name + " offered another key on the second connection (" +
                        session.hostKeyFingerprint() + ", not " + offered +
                        "); not added: someone may be intercepting the connection";
            return t;
        }
        t.added = true;
        t.message = "host " + host.name + ": key " + offered + " added to " + file;
        if (!authNote.empty()) t.message += " (but " + authNote + ")";
    } catch (const std::exception& ex) {
        t.message = ex.what();
    }
    return t;
}

}  // namespace lathe::widgets
