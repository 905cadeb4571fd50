// lathectl worker: one run whose event stream goes to stdout (what the SSH and multi-process
// executors read); lathectl ingest: records such a stream into the workspace.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "cli_common.h"
#include "lathe/core/error.h"
#include "lathe/core/launcher.h"
#include "lathe/core/record.h"
#include "lathe/core/trainer.h"

namespace lathe::cli {
namespace {

struct WorkerState {
    SpecFlags spec;
    std::string checkpointDir;
    std::string resume;
    std::string owner;  // WORKSPACE_ID:RUN, written into the checkpoints
    std::string dataCache;
    std::string dataVersion;
    bool lifeline = false;
    int lifelineGraceSec = 10;
    int lifelineTimeoutSec = 30;
};

// The lifeline of a worker started over SSH: stdin stays open for as long as the launcher's
// channel does. Its end (the launcher stopped the run, was killed, or the connection dropped)
// stops the run like Ctrl+C; a rank that cannot stop by itself (blocked in a collective whose
// peers are gone) leaves after the grace period. Signals are no substitute: OpenSSH does not
// deliver them to a root login, and a dropped connection sends none. The launcher writes a
// heartbeat line every 5 s: silence for `timeoutSec` (a network cut the host's sshd has not
// noticed yet) ends the lifeline too.
void watchLifeline(std::atomic<bool>& stop, int graceSec, int timeoutSec) {
    std::thread([&stop, graceSec, timeoutSec] {
        char buf[256];
        for (;;) {
            pollfd p{STDIN_FILENO, POLLIN, 0};
            const int ready = ::poll(&p, 1, timeoutSec * 1000);
            if (ready < 0 && errno == EINTR) continue;
            if (ready == 0) {
                static const char msg[] = "lathectl worker: no heartbeat from the launcher; stopping\n";
                (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
                break;
            }
            const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
            if (n > 0 || (n < 0 && errno == EINTR)) continue;
            break;
        }
        stop.store(true);
        std::this_thread::sleep_for(std::chrono::seconds(graceSec));
        static const char msg[] =
            "lathectl worker: lifeline ended and the run did not stop in time; exiting\n";
        (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
        ::_exit(kInterrupted);
    }).detach();
}

// "WORKSPACE_ID:RUN" as the launcher passes it (lathe::core::LaunchOptions::owner).
core::CheckpointOwner parseOwner(const std::string& text) {
    const auto colon = text.rfind(':');
    core::CheckpointOwner o;
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
        throw UsageError("--owner must be WORKSPACE_ID:RUN (got '" + text + "')");
    o.workspaceId = text.substr(0, colon);
    try {
        size_t used = 0;
        o.runId = std::stoll(text.substr(colon + 1), &used);
        if (used != text.size() - colon - 1 || o.runId <= 0) throw std::invalid_argument("run");
    } catch (const std::exception&) {
        throw UsageError("--owner must be WORKSPACE_ID:RUN with a positive run id (got '" + text + "')");
    }
    return o;
}

int runWorker(const WorkerState& st) {
    // A peer that dies closes its sockets: writing to one must fail the collective with an error
    // this rank reports, not kill it by SIGPIPE, which would make it look like the rank that died
    // (the launcher names the first rank killed by a signal as the cause).
    std::signal(SIGPIPE, SIG_IGN);
    const core::RunSpec spec = buildSpec(st.spec);
    const core::DistEnv dist = core::distEnvFromEnvironment();
    if (spec.nproc > 1 && !dist.distributed())
        throw UsageError("this run asks for nproc = " + std::to_string(spec.nproc) +
                         ": start it with lathectl train, or start each rank with the torchrun environment "
                         "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    // One line per event, flushed at once so a reader sees the run live; tagged with the rank.
    const core::EventSink out = [rank = dist.rank](const core::Event& e) {
        if (rank == 0) {
            std::cout << core::encodeEvent(e) << std::endl;
            return;
        }
        core::Event tagged = e;
        tagged.rank = rank;
        std::cout << core::encodeEvent(tagged) << std::endl;
    };
    out(core::Event::run(core::toToml(spec), host));
    core::TrainOptions opts;
    // Absolute, since the path travels in the event stream and is recorded as an artifact.
    opts.checkpointDir =
        st.checkpointDir.empty() ? std::string() : std::filesystem::absolute(st.checkpointDir).string();
    opts.resumeFrom = st.resume;
    if (!st.owner.empty()) opts.owner = parseOwner(st.owner);
    opts.dataCacheDir = st.dataCache;
    opts.dataVersion = st.dataVersion;
    auto& stop = installStopHandler();
    opts.stop = &stop;
    if (st.lifeline) watchLifeline(stop, st.lifelineGraceSec, st.lifelineTimeoutSec);
    opts.dist = dist;
    core::TrainResult result;
    try {
        core::keepHeapForTraining();
        result = core::train(spec, opts, out);
    } catch (const core::Error& ex) {
        out(core::Event::error(ex.what()));
        out(core::Event::status(core::RunStatus::Failed));
        result.status = core::RunStatus::Failed;
    } catch (const std::exception& ex) {
        out(core::Event::error(std::string("internal error: ") + ex.what()));
        out(core::Event::status(core::RunStatus::Failed));
        result.status = core::RunStatus::Failed;
    }
    removeStopHandler();
    if (result.status == core::RunStatus::Completed) return kOk;
    if (result.status == core::RunStatus::Stopped) return kInterrupted;
    return kRunFailed;
}

struct IngestState {
    CommonOptions common;
    std::string file = "-";
};

int runIngest(const IngestState& st) {
    auto store = openStore(st.common);
    std::ifstream file;
    std::istream* in = &std::cin;
    if (st.file != "-") {
        file.open(st.file, std::ios::binary);
        if (!file) throw UsageError("cannot read event stream " + st.file);
        in = &file;
    }
    // In `lathectl worker | lathectl ingest`, Ctrl+C reaches both: the worker stops cleanly
    // and ends its stream with "stopped", so ingest keeps reading to the end instead of dying.
    std::signal(SIGINT, SIG_IGN);
    core::IngestResult res;
    try {
        res = core::ingestEventStream(*store, *in);
    } catch (const core::EventStreamError& ex) {
        std::signal(SIGINT, SIG_DFL);
        throw UsageError(ex.what());
    }
    std::signal(SIGINT, SIG_DFL);
    if (st.common.json) {
        nlohmann::json j{
            {"run_id", res.runId}, {"status", core::toString(res.status)}, {"workspace", store->path()}};
        if (!res.error.empty()) j["error"] = res.error;
        for (const auto& [k, v] : store->lastMetrics(res.runId)) j[k] = metricJson(v);
        std::cout << j.dump() << std::endl;
    } else {
        std::printf("recorded run %lld (%s)%s%s\n", static_cast<long long>(res.runId),
                    core::toString(res.status), res.error.empty() ? "" : ": ", res.error.c_str());
    }
    if (res.status == core::RunStatus::Completed) return kOk;
    return res.status == core::RunStatus::Stopped ? kInterrupted : kRunFailed;
}

}  // namespace

void registerWorker(CLI::App& app, int& exitCode) {
    {
        auto st = std::make_shared<WorkerState>();
        auto* cmd = app.add_subcommand(
            "worker",
            "run training and write its event stream (newline-delimited JSON) to stdout; no workspace");
        addSpecFlags(cmd, st->spec);
        cmd->add_option("--checkpoint-dir", st->checkpointDir, "write checkpoints here (default: none)");
        cmd->add_option("--resume", st->resume, "continue from this checkpoint file");
        cmd->add_option("--owner", st->owner,
                        "WORKSPACE_ID:RUN written into checkpoints (set by lathectl train)");
        cmd->add_option(
            "--data-cache", st->dataCache,
            "the data pipeline's disk cache folder (set by lathectl train; default ~/.cache/lathe/data)");
        cmd->add_option(
            "--data-version", st->dataVersion,
            "root hash of the data set version trained on, which keys the sample caches (set by lathectl "
            "train)");
        cmd->add_flag("--lifeline", st->lifeline,
                      "stop when stdin ends (set by the SSH launcher: a lost launcher stops the rank)");
        cmd->add_option("--lifeline-grace", st->lifelineGraceSec,
                        "seconds a rank may take to stop after its lifeline ends before it exits")
            ->check(CLI::Range(1, 600))
            ->capture_default_str();
        cmd->add_option("--lifeline-timeout", st->lifelineTimeoutSec,
                        "seconds without a heartbeat on stdin after which the lifeline counts as ended")
            ->check(CLI::Range(10, 3600))
            ->capture_default_str();
        cmd->callback([st, &exitCode] { exitCode = runWorker(*st); });
    }
    {
        // For the SSH launcher: a port on this host's ADDRESS that nothing listens on now (the
        // rendezvous port of a run whose rank 0 is here).
        auto address = std::make_shared<std::string>("0.0.0.0");
        auto* cmd = app.add_subcommand("free-port", "print a TCP port free on this host (for launchers)");
        cmd->group("");  // internal: not listed in --help
        cmd->add_option("--address", *address, "IPv4 or IPv6 address to probe")->capture_default_str();
        cmd->callback([address, &exitCode] {
            sockaddr_storage ss{};
            socklen_t len = 0;
            auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
            auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
            std::string literal = *address;
            if (literal.size() > 2 && literal.front() == '[' && literal.back() == ']')
                literal = literal.substr(1, literal.size() - 2);
            if (::inet_pton(AF_INET, literal.c_str(), &v4->sin_addr) == 1) {
                v4->sin_family = AF_INET;
                len = sizeof *v4;
            } else if (::inet_pton(AF_INET6, literal.c_str(), &v6->sin6_addr) == 1) {
                v6->sin6_family = AF_INET6;
                len = sizeof *v6;
            } else {
                throw UsageError("--address must be an IPv4 or IPv6 address (got '" + *address + "')");
            }
            // Below the kernel's ephemeral range when it can: a port bound to 0 comes from that
            // range, where any outgoing connection on the host may take it between this probe and
            // rank 0's bind (seen in CI: "Address already in use" on a port probed a moment before).
            int low = 32768, high = 60999;
            if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
                if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
                std::fclose(f);
            }
            if (low > 20000 + 1000) {
                std::random_device rd;
                std::mt19937 gen(rd());
                std::uniform_int_distribution<int> pick(20000, low - 1);
                for (int attempt = 0; attempt < 64; ++attempt) {
                    const auto candidate = static_cast<uint16_t>(pick(gen));
                    (ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port) = htons(candidate);
                    const int probe = ::socket(ss.ss_family, SOCK_STREAM, 0);
                    const bool ok = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&ss), len) == 0;
                    if (probe >= 0) ::close(probe);
                    if (ok) {
                        std::printf("%d\n", candidate);
                        exitCode = kOk;
                        return;
                    }
                }
                (ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port) = 0;
            }
            const int fd = ::socket(ss.ss_family, SOCK_STREAM, 0);
            if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
                ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
                const std::string why = std::strerror(errno);
                if (fd >= 0) ::close(fd);
                throw UsageError("cannot bind " + *address + ": " + why);
            }
            const uint16_t port = ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port;
            std::printf("%d\n", ntohs(port));
            ::close(fd);
            exitCode = kOk;
        });
    }
    {
        auto st = std::make_shared<IngestState>();
        auto* cmd =
            app.add_subcommand("ingest", "record an event stream (a file, or - for stdin) as a new run");
        cmd->add_option("FILE", st->file, "event stream from lathectl worker; - reads stdin");
        addCommonOptions(cmd, st->common);
        cmd->callback([st, &exitCode] { exitCode = runIngest(*st); });
    }
}

}  // namespace lathe::cli
