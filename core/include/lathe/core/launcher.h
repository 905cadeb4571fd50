#pragma once
// Distributed data-parallel training, torch-free facade: the torchrun environment a worker
// reads, and the local launcher that starts and owns N worker processes.
#include <atomic>
#include <string>
#include <vector>

#include "lathe/core/checkpoint.h"
#include "lathe/core/events.h"
#include "lathe/core/run_status.h"

namespace lathe::core {

/// The torchrun conventions: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT (plus LATHE_RENDEZVOUS_TIMEOUT, seconds).
struct DistEnv {
    int rank = 0;
    int worldSize = 1;
    int localRank = 0;
    int localWorldSize = 1;
    std::string masterAddr = "127.0.0.1";
    int masterPort = 29500;
    int timeoutSec = 60;
    bool distributed() const { return worldSize > 1; }
};

/// Reads the environment; absent variables mean a single process. Throws ConfigError for
/// malformed or inconsistent values ("RANK=3 is not below WORLD_SIZE=2").
DistEnv distEnvFromEnvironment();

struct LaunchOptions {
    int nproc = 2;
    std::string program;     // lathectl; empty = next to this executable
    std::string configPath;  // the run's TOML, written by the caller
    std::string checkpointDir;
    std::string resumeFrom;
    CheckpointOwner owner;  // written into the checkpoints (`lathectl worker --owner`)
    const std::atomic<bool>* stop = nullptr;
    int killGraceSec = 10;  // after a rank fails or a stop: SIGTERM, then SIGKILL after this
};

struct LaunchResult {
    RunStatus status = RunStatus::Failed;  // Completed, Stopped or Failed
    std::string error;
    int failedRank = -1;
};

/// Starts `nproc` `lathectl worker` processes on this machine (like `torchrun --standalone`),
/// merges their event streams into `sink` (rank 0's events as they are; other ranks' logs and
/// errors prefixed with their rank, their comm/* metrics as rank<N>/comm/*), and owns their
/// lifetime: a stop request ends every rank; when one rank dies the others are terminated and
/// the result names the rank, its exit status and its last error lines. No process is left.
LaunchResult launchLocal(const LaunchOptions& options, const EventSink& sink);

}  // namespace lathe::core
