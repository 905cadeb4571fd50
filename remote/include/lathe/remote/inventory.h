#pragma once
// Reaching the workspace's hosts (the `hosts` table of core's Store): how an inventory record
// becomes a HostSpec, the probe behind `lathectl hosts check` and the workbench's Hosts page, and
// the two halves of trusting a host key — look at the key without adding it, then add it once a
// person has accepted its fingerprint. One implementation for the CLI and the GUI. Blocking (SSH
// with its own deadlines): the GUI calls these off its thread.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "lathe/core/store.h"
#include "lathe/remote/host_spec.h"

namespace lathe::remote {

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
HostSpec hostSpecFor(const core::HostRecord& host);

/// The known_hosts file SshSession reads for `given` (empty: ~/.ssh/known_hosts from $HOME).
std::string knownHostsPath(const std::string& given);

/// A host to probe or trust: how to reach it, how messages name it, and (for the probe) the
/// lathectl to ask for its version (empty: the one on the login PATH).
struct ProbeTarget {
    HostSpec spec;
    std::string name;  // "gpu-b", or spec.label() for a host outside the inventory
    std::string lathectlPath;
};
/// An inventory host as a target (throws as hostSpecFor does).
ProbeTarget probeTargetFor(const core::HostRecord& host);

struct ProbeOptions {
    std::string knownHostsFile;   // empty: ~/.ssh/known_hosts
    std::string expectedVersion;  // "lathectl 0.1.0"; empty: unknown (no match is claimed)
    int connectTimeoutSec = 10;
    bool trustOnFirstUse = false;               // probe only: add an unknown key (a changed one never)
    const std::atomic<bool>* cancel = nullptr;  // raised: the probe command stops within ~50 ms
};

enum class HostKeyState {
    Known,    // in known_hosts (or not reached: see HostProbe::problem)
    Unknown,  // not in known_hosts: trust may add it after showing the fingerprint
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

/// Connects (strict host-key policy unless options.trustOnFirstUse) and runs the probe (uname,
/// nproc, MemTotal, nvidia-smi, `lathectl --version`) with a deadline. The probe is plain POSIX
/// sh run by the login shell (`sh -c`), so a csh or fish login works too. Never throws: every
/// failure is in the result.
HostProbe probeHost(const ProbeTarget& target, const ProbeOptions& options);
HostProbe probeHost(const core::HostRecord& host, const ProbeOptions& options);

/// The first half of trusting a host: a strict connection that adds nothing.
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
KeyLook lookAtHostKey(const ProbeTarget& target, const ProbeOptions& options);
KeyLook lookAtHostKey(const core::HostRecord& host, const ProbeOptions& options);

/// The second half: connects again adding an unknown key to known_hosts, and keeps it only when
/// it is the `offered` one a person accepted (else known_hosts is put back as it was). A changed
/// key is never added.
struct TrustResult {
    bool added = false;
    std::string message;  // what happened, for the status line or an error box
    std::string note;     // added, but something else to say (authentication then failed)
};
TrustResult trustHostKey(const ProbeTarget& target, const std::string& offered, const ProbeOptions& options);
TrustResult trustHostKey(const core::HostRecord& host, const std::string& offered,
                         const ProbeOptions& options);

}  // namespace lathe::remote
