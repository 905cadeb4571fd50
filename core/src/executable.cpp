#include "lathe/core/executable.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "lathe/core/error.h"

extern char** environ;

namespace lathe::core {

std::string executablePath() {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) throw Error("cannot find the path of this program (/proc/self/exe)");
    return std::string(buf, static_cast<size_t>(n));
}

std::string siblingProgram(const std::string& name) {
    const std::filesystem::path self(executablePath());
    if (self.filename() == name) return self.string();
    const auto sibling = self.parent_path() / name;
    std::error_code ec;
    if (std::filesystem::exists(sibling, ec)) return sibling.string();
    throw Error("cannot find " + name + " next to " + self.string());
}

std::string signalName(int sig) {
    switch (sig) {
        case SIGSEGV:
            return "SIGSEGV (segmentation fault)";
        case SIGABRT:
            return "SIGABRT (aborted)";
        case SIGBUS:
            return "SIGBUS (bus error)";
        case SIGFPE:
            return "SIGFPE (arithmetic error)";
        case SIGILL:
            return "SIGILL (illegal instruction)";
        case SIGKILL:
            return "SIGKILL (killed)";
        case SIGTERM:
            return "SIGTERM (terminated)";
        default:
            return "signal " + std::to_string(sig);
    }
}

namespace {

struct Fd {
    int fd = -1;
    ~Fd() { reset(); }
    void reset() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
};

}  // namespace

ProgramResult runProgram(const std::string& program, const std::vector<std::string>& args, double timeoutS,
                         size_t maxOutputBytes) {
    // Close-on-exec pipes: a fork elsewhere in this process (another thread) must not inherit
    // their write ends, or this side would never see end-of-file.
    int outPipe[2], errPipe[2];
    if (::pipe2(outPipe, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
    Fd outRead{outPipe[0]}, outWrite{outPipe[1]};
    if (::pipe2(errPipe, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
    Fd errRead{errPipe[0]}, errWrite{errPipe[1]};

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, outWrite.fd, STDOUT_FILENO);  // dup2 clears CLOEXEC
    posix_spawn_file_actions_adddup2(&actions, errWrite.fd, STDERR_FILENO);
    std::vector<std::string> argStore;
    argStore.reserve(args.size() + 1);
    argStore.push_back(program);
    argStore.insert(argStore.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argStore) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw Error("cannot start " + program + ": " + std::strerror(rc));
    outWrite.reset();
    errWrite.reset();

    ProgramResult result;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS);
    char buf[65536];
    while (outRead.fd >= 0 || errRead.fd >= 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            result.timedOut = true;
            ::kill(pid, SIGKILL);
            break;
        }
        pollfd fds[2];
        nfds_t n = 0;
        for (Fd* f : {&outRead, &errRead})
            if (f->fd >= 0) fds[n++] = {f->fd, POLLIN, 0};
        const int ready = ::poll(fds, n, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
        if (ready < 0 && errno != EINTR) {
            ::kill(pid, SIGKILL);
            break;
        }
        for (nfds_t i = 0; i < n; ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            Fd& f = fds[i].fd == outRead.fd ? outRead : errRead;
            std::string& into = &f == &outRead ? result.out : result.err;
            const ssize_t got = ::read(f.fd, buf, sizeof buf);
            if (got > 0) {
                const size_t keep = std::min(static_cast<size_t>(got),
                                             maxOutputBytes - std::min(maxOutputBytes, into.size()));
                into.append(buf, keep);
            } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
                f.reset();
            }
        }
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && !result.timedOut) result.exitCode = WEXITSTATUS(status);
    if (WIFSIGNALED(status) && !result.timedOut) result.signal = WTERMSIG(status);
    return result;
}

}  // namespace lathe::core
