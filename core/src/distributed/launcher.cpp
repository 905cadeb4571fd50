// The local launcher: N `lathectl worker` processes, their merged event streams, their lifetime.
// POSIX only (fork/exec, pipes, poll); no LibTorch here.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "lathe/core/error.h"
#include "lathe/core/executable.h"
#include "lathe/core/launcher.h"
#include "ports.h"

namespace fs = std::filesystem;
extern char** environ;

namespace lathe::core {
namespace {

int envInt(const char* name, int fallback, int lo, int hi) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi)
        throw ConfigError(std::string(name) + "=" + v + " is not an integer from " + std::to_string(lo) +
                          " to " + std::to_string(hi));
    return static_cast<int>(x);
}

std::string describeExit(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
    return "ended";
}

}  // namespace

DistEnv distEnvFromEnvironment() {
    DistEnv d;
    d.worldSize = envInt("WORLD_SIZE", 1, 1, 4096);
    d.rank = envInt("RANK", 0, 0, 4095);
    d.localWorldSize = envInt("LOCAL_WORLD_SIZE", d.worldSize, 1, 4096);
    d.localRank = envInt("LOCAL_RANK", d.rank, 0, 4095);
    d.masterPort = envInt("MASTER_PORT", 29500, 1, 65535);
    d.timeoutSec = envInt("LATHE_RENDEZVOUS_TIMEOUT", 60, 1, 86400);
    if (const char* a = std::getenv("MASTER_ADDR"); a && *a) d.masterAddr = a;
    if (const char* a = std::getenv("LATHE_BIND_ADDR"); a && *a) d.bindAddr = a;
    if (d.rank >= d.worldSize)
        throw ConfigError("RANK=" + std::to_string(d.rank) +
                          " is not below WORLD_SIZE=" + std::to_string(d.worldSize));
    if (d.localRank >= d.localWorldSize)
        throw ConfigError("LOCAL_RANK=" + std::to_string(d.localRank) +
                          " is not below LOCAL_WORLD_SIZE=" + std::to_string(d.localWorldSize));
    return d;
}

namespace {

// A local `lathectl worker`: a child process with its stdout and stderr on pipes.
class LocalRank final : public RankProcess {
public:
    LocalRank(pid_t pid, int outFd, int errFd) : m_pid(pid), m_out(outFd), m_err(errFd) {}
    ~LocalRank() override {
        if (!m_reaped) {
            ::kill(m_pid, SIGKILL);
            ::waitpid(m_pid, nullptr, 0);
        }
        for (int fd : {m_out, m_err})
            if (fd >= 0) ::close(fd);
    }
    int stdoutFd() const override { return m_out; }
    int stderrFd() const override { return m_err; }
    std::optional<RankExit> reap() override {
        if (m_reaped) return m_exit;
        int status = 0;
        if (::waitpid(m_pid, &status, WNOHANG) != m_pid) return std::nullopt;
        m_reaped = true;
        m_exit.clean = WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 130);
        // Killed by a signal, unless it is the SIGTERM we sent (a rank still starting has no
        // handler for it yet): that is our stop, not the cause of a failure.
        m_exit.abrupt = WIFSIGNALED(status) && !(m_terminated && WTERMSIG(status) == SIGTERM);
        m_exit.description = describeExit(status);
        return m_exit;
    }
    void terminate() override {
        if (m_reaped) return;
        m_terminated = true;
        ::kill(m_pid, SIGTERM);
    }
    void kill() override {
        if (!m_reaped) ::kill(m_pid, SIGKILL);
    }

private:
    pid_t m_pid;
    int m_out, m_err;
    bool m_reaped = false, m_terminated = false;
    RankExit m_exit;
};

// Starts the ranks of one attempt; throws Error when a pipe or fork fails (the ones already
// started are killed and reaped by their destructors, their pipes closed).
std::vector<std::unique_ptr<RankProcess>> startLocalRanks(const LaunchOptions& options,
                                                          const std::string& program, int port) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::string threads = std::to_string(std::max(1u, cores / static_cast<unsigned>(options.nproc)));
    std::vector<std::unique_ptr<RankProcess>> ranks;
    for (int r = 0; r < options.nproc; ++r) {
        int out[2] = {-1, -1}, err[2] = {-1, -1};
        const auto closeAll = [&] {
            for (int fd : {out[0], out[1], err[0], err[1]})
                if (fd >= 0) ::close(fd);
        };
        if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
            const std::string why = std::strerror(errno);
            closeAll();
            throw Error("pipe: " + why);
        }
        std::vector<std::string> args{program, "worker", options.configPath};
        if (!options.checkpointDir.empty())
            args.insert(args.end(), {"--checkpoint-dir", options.checkpointDir});
        if (!options.resumeFrom.empty()) args.insert(args.end(), {"--resume", options.resumeFrom});
        if (!options.dataCacheDir.empty()) args.insert(args.end(), {"--data-cache", options.dataCacheDir});
        if (!options.dataVersion.empty()) args.insert(args.end(), {"--data-version", options.dataVersion});
        if (!options.owner.workspaceId.empty())
            args.insert(args.end(),
                        {"--owner", options.owner.workspaceId + ":" + std::to_string(options.owner.runId)});
        // Everything the child needs is built here: between fork and exec a child of a
        // multi-threaded process (the GUI) may only make async-signal-safe calls.
        std::vector<std::string> env;
        const std::map<std::string, std::string> set{{"RANK", std::to_string(r)},
                                                     {"LOCAL_RANK", std::to_string(r)},
                                                     {"WORLD_SIZE", std::to_string(options.nproc)},
                                                     {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
                                                     {"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", std::to_string(port)}};
        for (char** e = environ; *e; ++e) {
            const std::string kv(*e);
            const auto name = kv.substr(0, kv.find('='));
            if (set.count(name) || name == "LATHE_BIND_ADDR") continue;
            env.push_back(kv);
        }
        for (const auto& [k, v] : set) env.push_back(k + "=" + v);
        // N processes on the same cores: split them rather than oversubscribe (unless set).
        for (const char* k : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
            if (!std::getenv(k)) env.push_back(std::string(k) + "=" + threads);
        std::vector<char*> argv, envp;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        for (auto& e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        const pid_t parent = ::getpid();
        const pid_t pid = ::fork();
        if (pid < 0) {
            const std::string why = std::strerror(errno);
            closeAll();
            throw Error("fork: " + why);
        }
        if (pid == 0) {
            // Child: never outlive the launcher, even if it is killed (and if it already died
            // before the prctl, leave at once).
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) ::_exit(1);
            ::dup2(out[1], STDOUT_FILENO);
            ::dup2(err[1], STDERR_FILENO);
            ::execve(program.c_str(), argv.data(), envp.data());
            static const char msg[] = "cannot start lathectl worker\n";
            (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
            ::_exit(127);
        }
        ::close(out[1]);
        ::close(err[1]);
        ranks.push_back(std::make_unique<LocalRank>(pid, out[0], err[0]));
    }
    return ranks;
}

struct Supervised {
    int rank = 0;
    RankProcess* process = nullptr;
    bool outOpen = true, errOpen = true;
    std::string outBuf, errBuf;
    std::deque<std::string> lastErrors;  // stderr lines and error events, newest last
    std::optional<RankExit> exit;
    std::string lastStatus;  // from its status events

    std::string name() const {
        const std::string where = process->where();
        return "rank " + std::to_string(rank) + (where.empty() ? "" : " (" + where + ")");
    }
};

void remember(Supervised& w, std::string line) {
    if (line.empty()) return;
    w.lastErrors.push_back(std::move(line));
    if (w.lastErrors.size() > 5) w.lastErrors.pop_front();
}

std::string joined(const std::deque<std::string>& lines) {
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? " | " : "") + lines[i];
    return out;
}

}  // namespace

LaunchResult superviseRanks(std::vector<std::unique_ptr<RankProcess>>& ranks, const SuperviseOptions& options,
                            const EventSink& sink, bool* rendezvousPortTaken) {
    std::vector<Supervised> workers(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
        workers[r].rank = static_cast<int>(r);
        workers[r].process = ranks[r].get();
        workers[r].outOpen = ranks[r]->stdoutFd() >= 0;
        workers[r].errOpen = ranks[r]->stderrFd() >= 0;
    }
    LaunchResult result;
    std::vector<int> failures;  // ranks that failed, in the order they were noticed
    bool terminating = false, killed = false;
    std::chrono::steady_clock::time_point termAt;
    auto beginTermination = [&] {
        if (terminating) return;
        terminating = true;
        termAt = std::chrono::steady_clock::now();
        for (auto& w : workers)
            if (!w.exit) w.process->terminate();
    };

    // A sink that throws (the workspace cannot be written) stops every rank like a failure does;
    // its error is rethrown once they are all reaped, so no worker outlives this call.
    std::exception_ptr sinkError;
    auto deliver = [&](const Event& e) {
        if (sinkError || !sink) return;
        try {
            sink(e);
        } catch (...) {
            sinkError = std::current_exception();
            beginTermination();
        }
    };

    auto handleLine = [&](Supervised& w, const std::string& line) {
        Event e;
        try {
            e = decodeEvent(line);
        } catch (const EventStreamError&) {
            remember(w, line);  // not an event: a stray print; keep it for the error report
            return;
        }
        e.rank = w.rank;
        if (e.type == Event::Type::Status) w.lastStatus = e.text;
        if (e.type == Event::Type::Error) remember(w, e.text);
        if (w.rank == 0) {
            if (e.type != Event::Type::Run) deliver(e);
            return;
        }
        if (e.type == Event::Type::Log || e.type == Event::Type::Error) {
            e.text = "rank " + std::to_string(w.rank) + ": " + e.text;
            deliver(e);
        } else if (e.type == Event::Type::Metric && e.key.rfind("comm/", 0) == 0) {
            e.key = "rank" + std::to_string(w.rank) + "/" + e.key;
            deliver(e);
        } else if (e.type == Event::Type::Metric && e.key.rfind("pipe/stage", 0) == 0) {
            deliver(e);  // a pipeline stage's own figures, named by stage
        } else if (e.type == Event::Type::Span && spanStage(e.span) > 0) {
            deliver(e);  // a pipeline stage's lane of the timeline
        }
    };

    // Reads what is there; false at the end of the stream.
    auto drain = [&](Supervised& w, int fd, bool isErr) -> bool {
        char buf[65536];
        ssize_t n;
        do {
            n = ::read(fd, buf, sizeof buf);
        } while (n < 0 && errno == EINTR);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
        if (n <= 0) {
            // End of stream: an unterminated last line (a crashing rank's final words) still counts.
            std::string& rest = isErr ? w.errBuf : w.outBuf;
            if (!rest.empty()) {
                if (isErr)
                    remember(w, rest);
                else
                    handleLine(w, rest);
                rest.clear();
            }
            return false;
        }
        std::string& acc = isErr ? w.errBuf : w.outBuf;
        // Only the new bytes are searched, and the consumed lines are erased once: a long line
        // arriving in many reads costs linear time, not a rescan per read.
        const size_t from = acc.size();
        acc.append(buf, static_cast<size_t>(n));
        size_t start = 0;
        for (size_t pos = acc.find('\n', from); pos != std::string::npos; pos = acc.find('\n', start)) {
            std::string line = acc.substr(start, pos - start);
            start = pos + 1;
            if (isErr)
                remember(w, std::move(line));
            else
                handleLine(w, line);
        }
        acc.erase(0, start);
        // A line that never ends (a progress bar drawn with \r, a runaway print) is bounded: of
        // stderr the newest 4 KiB are kept; an unending stdout line is no event and is dropped.
        if (acc.size() > kMaxEventLine) {
            remember(w, "(" + w.name() + " wrote a line of more than " + std::to_string(kMaxEventLine >> 20) +
                            " MiB to std" + (isErr ? "err" : "out") + "; cut)");
            acc.erase(0, isErr ? acc.size() - 4096 : acc.size());
        }
        return true;
    };

    for (;;) {
        if (options.stop && options.stop->load() && !terminating) beginTermination();
        std::vector<pollfd> fds;
        std::vector<std::pair<Supervised*, bool>> owners;
        for (auto& w : workers) {
            if (w.outOpen) {
                fds.push_back({w.process->stdoutFd(), POLLIN, 0});
                owners.emplace_back(&w, false);
            }
            if (w.errOpen) {
                fds.push_back({w.process->stderrFd(), POLLIN, 0});
                owners.emplace_back(&w, true);
            }
        }
        if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
        for (size_t i = 0; i < fds.size(); ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            auto [w, isErr] = owners[i];
            if (!drain(*w, fds[i].fd, isErr)) (isErr ? w->errOpen : w->outOpen) = false;
        }
        for (auto& w : workers) {
            if (w.exit) continue;
            w.exit = w.process->reap();
            if (!w.exit) continue;
            const bool stopping = options.stop && options.stop->load();
            // Failures until the supervisor kills anyone are candidates for the cause; a stop
            // request's SIGTERM ends ranks cleanly (130), and a rank failing meanwhile counts.
            if (!w.exit->clean && !killed && !(stopping && failures.empty())) {
                failures.push_back(w.rank);
                beginTermination();
            }
        }
        if (terminating && !killed &&
            std::chrono::steady_clock::now() - termAt > std::chrono::seconds(options.killGraceSec)) {
            killed = true;
            for (auto& w : workers)
                if (!w.exit) w.process->kill();
        }
        bool done = true;
        for (const auto& w : workers) done &= w.exit && !w.outOpen && !w.errOpen;
        if (done) break;
        if (fds.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (sinkError) std::rethrow_exception(sinkError);
    // The cause: a rank that was killed or lost its connection, rather than a peer that then
    // failed on the broken connection (and may have been noticed first).
    if (!failures.empty()) {
        result.failedRank = failures.front();
        for (int r : failures)
            if (workers[static_cast<size_t>(r)].exit->abrupt) {
                result.failedRank = r;
                break;
            }
    }

    bool anyRunning = false;
    for (const auto& w : workers) anyRunning |= !w.lastStatus.empty();
    if (rendezvousPortTaken && result.failedRank >= 0 && !anyRunning) {
        for (const auto& line : workers[static_cast<size_t>(result.failedRank)].lastErrors)
            if (line.find("in use") != std::string::npos) *rendezvousPortTaken = true;
    }
    const bool stopped = options.stop && options.stop->load();
    if (result.failedRank >= 0 || stopped) {
        // What each rank said last stays with the run: the failure names one rank, but the cause
        // may show on another (a peer that lost its network first).
        for (const auto& w : workers)
            if (!w.lastErrors.empty() && w.rank != result.failedRank)
                deliver(Event::log("warn", w.name() + " " + w.exit->description +
                                               "; its last lines: " + joined(w.lastErrors)));
    }
    if (result.failedRank >= 0) {
        const auto& w = workers[static_cast<size_t>(result.failedRank)];
        result.status = RunStatus::Failed;
        result.error = w.name() + " " + w.exit->description;
        if (!w.lastErrors.empty()) result.error += ": " + joined(w.lastErrors);
        result.error += "; the other ranks were stopped";
        return result;
    }
    const auto& r0 = workers.front();
    if (stopped) {
        result.status = RunStatus::Stopped;
    } else if (const auto last = runStatusFromString(r0.lastStatus); last && isFinal(*last)) {
        result.status = *last;
        if (result.status == RunStatus::Failed && !r0.lastErrors.empty()) result.error = r0.lastErrors.back();
    } else {
        result.status = RunStatus::Failed;
        result.error = r0.name() + " " + r0.exit->description + " without finishing the run";
    }
    return result;
}

namespace {

LaunchResult launchOnce(const LaunchOptions& options, const EventSink& sink, const std::string& program,
                        int port, bool& rendezvousPortTaken) {
    auto ranks = startLocalRanks(options, program, port);
    SuperviseOptions so;
    so.stop = options.stop;
    so.killGraceSec = options.killGraceSec;
    return superviseRanks(ranks, so, sink, &rendezvousPortTaken);
}

}  // namespace

LaunchResult launchLocal(const LaunchOptions& options, const EventSink& sink) {
    if (options.nproc < 1) throw ConfigError("`nproc` must be at least 1");
    const std::string program = options.program.empty() ? siblingProgram("lathectl") : options.program;
    // The free port is probed and released before rank 0 binds it; if another program takes it
    // in between, the rendezvous fails at once and the launch is retried on a new port.
    for (int attempt = 1;; ++attempt) {
        bool portTaken = false;
        auto result = launchOnce(options, sink, program, ephemeralLoopbackPort(), portTaken);
        if (!portTaken || attempt == 3) return result;
        if (sink)
            sink(Event::log("warn", "rendezvous port was taken by another program; retrying on a new port"));
    }
}

}  // namespace lathe::core
