#pragma once
// A fork server for `lathectl` commands (tuning/fork_server.cpp): a study starts many short
// `lathectl train` processes, and every fresh one spends about 0.7 s loading LibTorch and the
// ~430 shared libraries Debian's build of it needs before its first step, which is most of a
// small trial (0.9-1.7 s for a spirals trial of 36 epochs here). The server is one `lathectl
// __fork-server` process that loads LibTorch once and then forks a new process per command.
//
// Each command is still a process of its own (seeds, thread pools and signal handlers are
// per process), started with no signal blocked or handled, stdin from /dev/null and its output
// in the files given. It is a child of the process that asked for it, as an exec'd child would
// be: the server forks twice and the asking process is made the child subreaper
// (PR_SET_CHILD_SUBREAPER), so the command is reparented to it. The asker waits for it, signals
// it and sees how it ended with the usual waitpid(); the command gets SIGINT when the asker
// dies (PR_SET_PDEATHSIG, set once it is the asker's child).
//
// A server that cannot start, or any failure to fork, is reported, never fatal: the caller
// starts that command the usual way (fork and exec). LATHE_FORK_SERVER=0 turns it off.
#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lathe::core {

class ForkServer {
public:
    /// Starts `program __fork-server FD` and waits (at most `timeoutSeconds`) until it has
    /// loaded LibTorch and checked that forking it is safe (a process with threads of its own
    /// left after a fork is not). Returns nullptr with `why` set when it cannot be used:
    /// LATHE_FORK_SERVER=0, no child subreaper, the program failed to start or answer.
    static std::unique_ptr<ForkServer> start(const std::string& program, std::string* why,
                                             double timeoutSeconds = 60);
    ~ForkServer();  // ends the server (its commands go on) and restores the subreaper setting
    ForkServer(const ForkServer&) = delete;
    ForkServer& operator=(const ForkServer&) = delete;

    /// Starts `program args...` as a forked copy of the server, stdout appended to `outPath`,
    /// stderr to `errPath`. Returns its pid (this process's child), or -1 with `why` set; after
    /// a failure the server is closed and every later call fails at once. `maybeStarted` says
    /// whether the command may have started all the same (the request went out, no answer came
    /// back): then it must not simply be started again another way.
    pid_t spawn(const std::vector<std::string>& args, const std::string& outPath, const std::string& errPath,
                std::string* why, bool* maybeStarted = nullptr);

    /// Has the server parse the data file of the run config at `configPath` (the study's base
    /// config) now, so that every command forked after it finds the file parsed instead of
    /// parsing it again (digits and csv: data sets; data::preloadData). True when it kept it;
    /// false with `why` set otherwise: nothing to read ahead (another kind of data set), the
    /// config or the file could not be read (the commands will say so themselves), or the server
    /// failed, after which it is closed as after a failed spawn.
    bool prepare(const std::string& configPath, std::string* why, double timeoutSeconds = 300);
    bool usable() const { return m_fd >= 0; }
    pid_t serverPid() const { return m_pid; }

private:
    ForkServer() = default;
    void close();
    int m_fd = -1;
    pid_t m_pid = -1;
    int m_subreaperBefore = 0;
};

/// The memory of the server's own argv strings (contiguous, from argv[0] to the end of the last):
/// a forked command writes its command line there, so that ps and top show what it runs rather
/// than `lathectl __fork-server`. Null: leave it.
struct ArgvArea {
    char* start = nullptr;
    size_t size = 0;
};

/// The server's side, run by `lathectl __fork-server FD PADDING`: loads LibTorch, says "ready"
/// on `fd` (a SOCK_SEQPACKET socket), then for each request forks a process that calls
/// `run(argv)` (argv[0] is the program) and exits with what it returns. Returns when the
/// asking process closes its end or dies.
int serveForks(int fd, const ArgvArea& area, const std::function<int(std::vector<std::string>)>& run);

/// The threads of this process (from /proc/self/task): the server forks only while it is 1.
int threadCount();

}  // namespace lathe::core
