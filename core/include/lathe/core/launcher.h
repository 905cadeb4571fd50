#pragma once
// Distributed data-parallel training, torch-free facade: the torchrun environment a worker
// reads, and the local launcher that starts and owns N worker processes.
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/checkpoint.h"
#include "lathe/core/events.h"
#include "lathe/core/run_status.h"

namespace lathe::core {

/// The torchrun conventions: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT (plus LATHE_RENDEZVOUS_TIMEOUT, seconds, and LATHE_BIND_ADDR: the address of this
/// host that the collectives' sockets bind to, which the other hosts reach it at; default the
/// master address, right when all ranks share one host).
struct DistEnv {
    int rank = 0;
    int worldSize = 1;
    int localRank = 0;
    int localWorldSize = 1;
    std::string masterAddr = "127.0.0.1";
    int masterPort = 29500;
    int timeoutSec = 60;
    std::string bindAddr;  // empty: masterAddr
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
    CheckpointOwner owner;     // written into the checkpoints (`lathectl worker --owner`)
    std::string dataCacheDir;  // the data pipeline's disk cache (`lathectl worker --data-cache`)
    std::string dataVersion;   // the data set version's root hash (`--data-version`): cache keys
    /// Files the run reads through a path in its config, by spec key (ppo_policy: the PPO agent's
    /// policy; teacher: a distillation teacher). Local ranks read them in place; a launch on other
    /// hosts copies each there and points the key at the copy.
    std::map<std::string, std::string> inputFiles;
    const std::atomic<bool>* stop = nullptr;
    int killGraceSec = 10;  // after a rank fails or a stop: SIGTERM, then SIGKILL after this
};

struct LaunchResult {
    RunStatus status = RunStatus::Failed;  // Completed, Stopped or Failed
    std::string error;
    int failedRank = -1;
};

/// How a rank's process ended.
struct RankExit {
    bool clean = false;   // exited 0, or 130 after a stop request
    bool abrupt = false;  // ended without a say of its own: killed by a signal, or its connection lost
    std::string
        description;  // "exited with status 1", "was killed by signal Killed", "lost its connection: …"
};

/// One rank's process as the supervisor sees it, wherever it runs: a local child (launchLocal)
/// or a command on another host over SSH (lathe::remote::launchRemote). Its stdout carries the
/// worker's event stream, its stderr anything else it prints.
class RankProcess {
public:
    virtual ~RankProcess() = default;
    /// Read ends of stdout and stderr, owned by the RankProcess (closed when it is destroyed);
    /// the supervisor reads each to its end.
    virtual int stdoutFd() const = 0;
    virtual int stderrFd() const = 0;
    /// Non-blocking: how it ended, once it has.
    virtual std::optional<RankExit> reap() = 0;
    /// Asks it to stop cleanly (SIGTERM; over SSH also the end of its lifeline).
    virtual void terminate() = 0;
    /// Ends it now (SIGKILL; over SSH the channel is closed and the lifeline does the rest).
    virtual void kill() = 0;
    /// Where it runs, for messages: "" on this machine, "on gpu-a" elsewhere.
    virtual std::string where() const { return {}; }
};

struct SuperviseOptions {
    const std::atomic<bool>* stop = nullptr;
    int killGraceSec = 10;  // after a failure or a stop: terminate(), then kill() after this
};

/// Runs the ranks to their end: merges their event streams into `sink` (rank 0's events as they
/// are; other ranks' logs and errors prefixed with their rank, their comm/* metrics as
/// rank<N>/comm/*), stops every rank when one fails, when `stop` is raised or when the sink
/// throws (rethrown once all have ended), and returns when every rank has ended and its output
/// is read. A failure names the rank, where it ran, how it ended and its last error lines: of the
/// ranks that failed before the supervisor had to kill any, one that ended abruptly (the cause;
/// its peers then fail on their broken connections, and may be noticed first), else the first. On a
/// failure or a stop every rank's last stderr lines are logged. `rendezvousPortTaken` (may be
/// null) is set when the failure looks like the rendezvous port being in use.
LaunchResult superviseRanks(std::vector<std::unique_ptr<RankProcess>>& ranks, const SuperviseOptions& options,
                            const EventSink& sink, bool* rendezvousPortTaken = nullptr);

/// Starts `nproc` `lathectl worker` processes on this machine (like `torchrun --standalone`),
/// merges their event streams into `sink` (rank 0's events as they are; other ranks' logs and
/// errors prefixed with their rank, their comm/* metrics as rank<N>/comm/*), and owns their
/// lifetime: a stop request ends every rank; when one rank dies the others are terminated and
/// the result names the rank, its exit status and its last error lines. No process is left.
LaunchResult launchLocal(const LaunchOptions& options, const EventSink& sink);

}  // namespace lathe::core
