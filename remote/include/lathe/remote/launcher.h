#pragma once
// Data-parallel runs across hosts over SSH: one `lathectl worker` per slot, started with the
// torchrun environment, supervised by the same code as local ranks (core::superviseRanks), with
// the run's files staged both ways by SFTP and a lifeline that ends every remote rank when the
// launcher, its connection or the run goes away.

#include <string>
#include <vector>

#include "lathe/core/launcher.h"
#include "lathe/remote/host_spec.h"

namespace lathe::remote {

struct RemoteHost {
    std::string name;      // for messages ("gpu-a"); the workspace's host name
    HostSpec spec;         // how to reach it (an ssh config alias works as spec.host)
    int slots = 1;         // ranks to start there
    std::string lathectl;  // its lathectl; empty: `lathectl` on its PATH (or one staged before)
};

struct RemoteLaunchOptions {
    // Rank order: the first host's slots are ranks 0..n-1, the next host's follow, and so on.
    std::vector<RemoteHost> hosts;
    std::string masterAddr;       // empty: the address this machine reaches the first host at
    bool stage = false;           // upload this lathectl to hosts (same OS and architecture) lacking it
    std::string localProgram;     // this lathectl (staged, and whose version must match); empty: beside us
    std::string expectedVersion;  // what `lathectl --version` must print there ("lathectl 0.1.0")
};

// What the check before a launch found on one host.
struct HostReport {
    std::string name;
    bool ok = false;
    std::string problem;  // why not, in words a user can act on (host named)
    std::string address;  // numeric address this machine reaches it at
    std::string hostKey;  // SHA256:… of its host key
    std::string os, arch;
    int cores = 0;
    std::string lathectl;         // the path used there
    std::string lathectlVersion;  // what it printed
    bool staged = false;          // this launch uploaded it
};

// Checks every host in parallel (reachable, host key known and unchanged, authentication,
// lathectl present and of the expected version, staging it when asked) and says what it found.
std::vector<HostReport> checkHosts(const RemoteLaunchOptions& options);

// Launches base.nproc ranks (the sum of the hosts' slots) over SSH and supervises them like
// core::launchLocal: base.configPath is uploaded to every host, base.resumeFrom too; rank 0's
// checkpoints are downloaded into base.checkpointDir as they are written (SHA-256 checked) and
// recorded under their local paths. Every host is checked first; if any fails, core::ConfigError
// lists each failing host and its cause, and nothing has been started. A rank that fails, a stop
// request or a lost connection ends every rank on every host within base.killGraceSec plus the
// workers' lifeline grace; afterwards each host's run directory is removed and no process of the
// run is left there.
core::LaunchResult launchRemote(const core::LaunchOptions& base, const RemoteLaunchOptions& options,
                                const core::EventSink& sink);

}  // namespace lathe::remote
