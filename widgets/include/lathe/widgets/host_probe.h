#pragma once
// Reaching the workspace's hosts from the workbench (host_probe.cpp): how to connect to an
// inventory host, the probe behind the Hosts page's Check (what `lathectl hosts check` reports),
// and the two halves of Trust — look at the key without adding it, then add it once a person has
// accepted its fingerprint (`lathectl hosts trust`). Qt-free and blocking (SSH with its own
// deadlines): call these off the GUI thread.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "lathe/core/store.h"
#include "lathe/remote/host_spec.h"

namespace lathe::widgets {

/// An address as typed: the host, and the user and port only where written in it
/// ("alice@gpu:2222", "[::1]:2222"; a plain name may be an ssh-config alias).
struct AddressParts {
    std::string host;
    std::string user;  // empty: none written
    int port = 0;      // 0: none written
};
/// Throws core::ConfigError naming the text when it does not parse.
AddressParts splitAddress(const std::string& text);

/// How to reach an inventory host: its address, then the record's port, user and identity where
/// set; the rest from the ssh config (as `ssh HOST`). Throws core::ConfigError naming the host
/// when the address does not parse.
remote::HostSpec hostSpecFor(const core::HostRecord& host);

/// What `PROGRAM --version` prints (its first line, "lathectl 0.1.0"); PROGRAM empty: the lathectl
/// beside this program. The version a remote lathectl must match. Throws core::Error when it
/// cannot be run.
std::string lathectlVersion(const std::string& program = {});

struct ProbeOptions {
    std::string knownHostsFile;   // empty: ~/.ssh/known_hosts
    std::string expectedVersion;  // "lathectl 0.1.0"; empty: unknown (no match is claimed)
    int connectTimeoutSec = 10;
    const std::atomic<bool>* cancel = nullptr;  // raised: the probe command stops within ~50 ms
};

enum class HostKeyState {
    Known,    // in known_hosts (or not reached: see HostProbe::problem)
    Unknown,  // not in known_hosts: Trust may add it after showing the fingerprint
    Changed,  // differs from the key known_hosts lists: never added here
    Other,    // known_hosts has another key type only, or could not be read
};

/// What a check of one host found.
struct HostProbe {
    bool reachable = false;  // connected, host key verified, authenticated, probe ran
    std::string problem;     // why not (the SSH error, host named); empty when reachable
    HostKeyState key = HostKeyState::Known;
    std::string fingerprint;        // "SHA256:…" of the host key: the verified one, or the one offered
    std::string address;            // the numeric address this machine reached it at
    std::string os;                 // "Linux 6.1.0-18-amd64"
    std::string arch;               // "x86_64"
    int cores = 0;                  // 0: not reported
    int64_t memoryKb = 0;           // 0: not reported
    std::vector<std::string> gpus;  // nvidia-smi's "NAME, MEMORY" lines; empty: none found
    std::string lathectlPath;       // the one probed (empty: the PATH's)
    std::string lathectlVersion;    // what it printed; empty: none found
    bool lathectlMatches = false;   // equals ProbeOptions::expectedVersion
    int exitStatus = -1;            // the probe command's
    std::string probeStderr;        // its stderr when it failed (first 2000 bytes)
    double seconds = 0;             // how long the check took
};

/// Connects with the strict host-key policy (nothing is added to known_hosts) and runs the probe
/// (uname, nproc, MemTotal, nvidia-smi, `lathectl --version`) with a deadline. Never throws:
/// every failure is in the result.
HostProbe probeHost(const core::HostRecord& host, const ProbeOptions& options);

/// The first half of Trust: a strict connection that adds nothing.
struct KeyLook {
    enum class Result {
        Trusted,  // the key is in known_hosts already
        Unknown,  // not listed: `fingerprint` is what the host offers
        Refused,  // changed key, another type listed, unreachable, …: `message` says why
    };
    Result result = Result::Refused;
    std::string fingerprint;
    std::string message;
    std::string knownHostsFile;  // the file that was (or would be) consulted
};
KeyLook lookAtHostKey(const core::HostRecord& host, const ProbeOptions& options);

/// The second half: connects again adding an unknown key to known_hosts, and keeps it only when
/// it is the `offered` one a person accepted (else known_hosts is put back as it was). A changed
/// key is never added.
struct TrustResult {
    bool added = false;
    std::string message;  // what happened, for the status line or an error box
};
TrustResult trustHostKey(const core::HostRecord& host, const std::string& offered,
                         const ProbeOptions& options);

/// The known_hosts file SshSession reads for `given` (empty: ~/.ssh/known_hosts from $HOME).
std::string knownHostsPath(const std::string& given);

}  // namespace lathe::widgets
