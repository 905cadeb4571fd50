// The fork server for lathectl commands (lathe/core/fork_server.h).
//
// Protocol, over a SOCK_SEQPACKET socket pair (one message per request or answer):
//   server -> asker, once:  "ready" | "error <why>"
//   asker -> server:        "spawn\0<stdout path>\0<stderr path>\0<argv[0]>\0<argv[1]>\0..."
//   server -> asker:        "pid <N>" | "error <why>"
// For each request the server forks a middle process that forks the command and exits at once:
// the command is orphaned and reparented to the asker, its child subreaper. The middle process
// hands the command's pid back through a pipe, and the server answers only after reaping the
// middle one, so by the time the asker reads the pid the command is already its child.
#include "lathe/core/fork_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>

#include "data/raw.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/sha256.h"
#include "lathe/core/torch_runtime.h"
#include "threads.h"

namespace lathe::core {
namespace {

constexpr size_t kMaxMessage = 256 * 1024;

bool sendText(int fd, const std::string& text) {
    return ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

// One message; false on EOF, an error or when `timeoutMs` passed (< 0: no limit). A signal does
// not restart the wait from the beginning.
bool receive(int fd, std::string& out, int timeoutMs) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    pollfd p{fd, POLLIN, 0};
    for (;;) {
        int left = -1;
        if (timeoutMs >= 0)
            left =
                static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          deadline - std::chrono::steady_clock::now())
                                                          .count()));
        const int r = ::poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        break;
    }
    out.resize(kMaxMessage);
    for (;;) {
        const ssize_t n = ::recv(fd, out.data(), out.size(), MSG_TRUNC);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || static_cast<size_t>(n) > out.size()) return false;  // EOF, error or too long
        out.resize(static_cast<size_t>(n));
        return true;
    }
}

// Fields each ended by a NUL (so an empty last argument survives); nothing if the text is not.
std::vector<std::string> splitNul(const std::string& s) {
    std::vector<std::string> parts;
    if (s.empty() || s.back() != '\0') return parts;
    size_t pos = 0;
    while (pos < s.size()) {
        const size_t end = s.find('\0', pos);
        parts.push_back(s.substr(pos, end - pos));
        pos = end + 1;
    }
    return parts;
}

void unblockAllSignals() {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// In the command's process: wait to be the asker's child, then become a fresh command.
// The files a command writes, opened by the server before it forks (a path that cannot be
// opened is answered as an error, with nothing started): stdin, stdout, stderr.
struct Stdio {
    int in = -1, out = -1, err = -1;
    void close() {
        for (int* fd : {&in, &out, &err})
            if (*fd >= 0) ::close(std::exchange(*fd, -1));
    }
};

// What ps and top show for the process (/proc/PID/cmdline is the memory of the server's own
// argv, which the asker padded for this): the command's arguments, NUL-separated, cut to fit.
void showCommandLine(const ArgvArea& area, const std::vector<std::string>& argv) {
    if (!area.start || area.size < 2) return;
    std::memset(area.start, 0, area.size);
    size_t at = 0;
    for (const auto& a : argv) {
        if (at + 1 >= area.size) break;
        const size_t n = std::min(a.size(), area.size - 1 - at);
        std::memcpy(area.start + at, a.data(), n);
        at += n + 1;  // the NUL after it (already zero)
    }
}

[[noreturn]] void becomeCommand(pid_t asker, pid_t middle, Stdio io, const ArgvArea& area,
                                const std::vector<std::string>& parts,
                                const std::function<int(std::vector<std::string>)>& run) {
    // The middle process exits right after forking us; the kernel then hands us to the asker.
    for (int i = 0; ::getppid() == middle && i < 200000; ++i) ::usleep(50);
    // Only now: a death signal set earlier would have fired when the middle process exited.
    ::prctl(PR_SET_PDEATHSIG, SIGINT);
    if (::getppid() != asker) ::_exit(130);  // the asker is gone, or is not our parent
    for (int s = 1; s < NSIG; ++s)
        if (s != SIGKILL && s != SIGSTOP) ::signal(s, SIG_DFL);
    unblockAllSignals();
    // dup2 clears close-on-exec on 0-2; the originals (close-on-exec) are closed.
    if (::dup2(io.in, 0) < 0 || ::dup2(io.out, 1) < 0 || ::dup2(io.err, 2) < 0) ::_exit(127);
    for (int fd : {io.in, io.out, io.err})
        if (fd > 2) ::close(fd);
    showCommandLine(area, std::vector<std::string>(parts.begin() + 3, parts.end()));
    int code = 70;
    try {
        code = run(std::vector<std::string>(parts.begin() + 3, parts.end()));
    } catch (...) {
    }
    // Out without the static destructors: LibTorch's deregister thousands of operators (about a
    // tenth of a short trial), and a command has closed its workspace and joined its threads by
    // the time it returns. Only the streams need flushing.
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    ::_exit(code);
}

}  // namespace

int threadCount() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/task")) {
        while (const dirent* e = ::readdir(d))
            if (e->d_name[0] != '.') ++n;
        ::closedir(d);
    }
    return n;
}

// ---- The asker's side ---------------------------------------------------------------------------

std::unique_ptr<ForkServer> ForkServer::start(const std::string& program, std::string* why,
                                              double timeoutSeconds) {
    const auto fail = [&](const std::string& text) {
        if (why) *why = text;
        return std::unique_ptr<ForkServer>();
    };
    if (const char* v = std::getenv("LATHE_FORK_SERVER"); v && std::string(v) == "0") return fail("");
    int before = 0;
    ::prctl(PR_GET_CHILD_SUBREAPER, &before);
    // A subreaper while the server is forked, so that it and the processes it forks carry the
    // kernel's "has a subreaper above" mark; after that only while a command is being handed over
    // (spawn), so that other orphans (a crashed trial's workers) go to init as before.
    if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return fail(std::string("cannot become a child subreaper: ") + std::strerror(errno));
    std::unique_ptr<ForkServer> s(new ForkServer);
    s->m_subreaperBefore = before;
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return fail(std::string("socketpair: ") + std::strerror(errno));
    // The server's end is moved to 3 or above in the child (stdio may have been closed here, and
    // the dup2s below must not overwrite it); its number is decided here, before the fork.
    const int serverEnd = sv[1] > 2 ? sv[1] : ::fcntl(sv[1], F_DUPFD_CLOEXEC, 3);
    if (serverEnd < 0) {
        const int e = errno;
        ::close(sv[0]);
        ::close(sv[1]);
        return fail(std::string("fcntl: ") + std::strerror(e));
    }
    if (serverEnd != sv[1]) ::close(sv[1]);
    // The padding is room for each trial's own command line in ps (serveForks' ArgvArea).
    std::vector<std::string> all{program, "__fork-server", std::to_string(serverEnd), std::string(1024, ' ')};
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        unblockAllSignals();
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // nothing to save: it only forks
        if (::getppid() != parent) ::_exit(127);
        ::fcntl(serverEnd, F_SETFD, 0);  // the one descriptor the server keeps across exec
        const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            ::dup2(null, 0);
            ::dup2(null, 1);
            ::dup2(null, 2);
        }
        ::execv(program.c_str(), argv.data());
        ::_exit(127);
    }
    const int e = errno;
    ::close(serverEnd);
    s->m_fd = sv[0];
    s->m_pid = pid;
    if (pid < 0) {
        s->m_pid = -1;
        return fail(std::string("cannot start it: ") + std::strerror(e));
    }
    std::string answer;
    if (!receive(s->m_fd, answer, static_cast<int>(std::lround(timeoutSeconds * 1000))))
        return fail(program + " __fork-server did not answer");
    if (answer != "ready") return fail(answer.rfind("error ", 0) == 0 ? answer.substr(6) : answer);
    ::prctl(PR_SET_CHILD_SUBREAPER, s->m_subreaperBefore);
    return s;
}

ForkServer::~ForkServer() {
    close();
    ::prctl(PR_SET_CHILD_SUBREAPER, m_subreaperBefore);  // as it was, whatever failed where
}

void ForkServer::close() {
    if (m_fd >= 0) ::close(m_fd);
    m_fd = -1;
    if (m_pid > 0) {
        ::kill(m_pid, SIGKILL);
        int status = 0;
        while (::waitpid(m_pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    m_pid = -1;
}

pid_t ForkServer::spawn(const std::vector<std::string>& args, const std::string& outPath,
                        const std::string& errPath, std::string* why, bool* maybeStarted) {
    bool sent = false;
    const auto fail = [&](const std::string& text) {
        if (why) *why = text;
        if (maybeStarted) *maybeStarted = sent;
        close();
        ::prctl(PR_SET_CHILD_SUBREAPER, m_subreaperBefore);
        return pid_t{-1};
    };
    if (maybeStarted) *maybeStarted = false;
    if (m_fd < 0) return fail("the fork server is closed");
    if (args.empty()) return fail("no program");
    std::string request;
    for (const auto* field : {"spawn", outPath.c_str(), errPath.c_str()})
        request.append(field).push_back('\0');
    for (const auto& a : args) request.append(a).push_back('\0');
    if (request.size() > kMaxMessage) return fail("the command line is too long for the fork server");
    // The command is reparented to us when the server's middle process exits, which happens
    // before the answer is sent.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (!sendText(m_fd, request))
        return fail(std::string("cannot reach the fork server: ") + std::strerror(errno));
    sent = true;
    std::string answer;
    if (!receive(m_fd, answer, 30000)) return fail("the fork server did not answer");
    ::prctl(PR_SET_CHILD_SUBREAPER, m_subreaperBefore);
    if (answer.rfind("error ", 0) == 0) {
        sent = false;  // the server answers an error only when it started nothing
        return fail(answer.substr(6));
    }
    if (answer.rfind("pid ", 0) != 0) return fail("the fork server answered " + answer);
    const long pid = std::strtol(answer.c_str() + 4, nullptr, 10);
    if (pid <= 0) return fail("the fork server answered " + answer);
    // Ours now (reparented before the answer was sent)? Checked without reaping it.
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        ::kill(static_cast<pid_t>(pid), SIGKILL);  // our server's command, run where we cannot see it
        return fail("process " + std::to_string(pid) + " from the fork server is not this process's child");
    }
    return static_cast<pid_t>(pid);
}

bool ForkServer::prepare(const std::string& configPath, std::string* why, double timeoutSeconds) {
    const auto fail = [&](const std::string& text) {
        if (why) *why = text;
        return false;
    };
    if (m_fd < 0) return fail("the fork server is closed");
    std::string request;
    for (const auto* field : {"prepare", configPath.c_str()}) request.append(field).push_back('\0');
    if (request.size() > kMaxMessage) return fail("the config's path is too long");
    std::string answer;
    if (!sendText(m_fd, request) ||
        !receive(m_fd, answer, static_cast<int>(std::lround(timeoutSeconds * 1000)))) {
        close();  // as after a failed spawn: nothing more is asked of it
        return fail("the fork server did not answer");
    }
    if (answer == "ok kept") return true;
    if (answer == "ok") return fail("nothing to read ahead");
    return fail(answer.rfind("error ", 0) == 0 ? answer.substr(6) : "the fork server answered " + answer);
}

// ---- The server's side ----------------------------------------------------------------------------

int serveForks(int fd, const ArgvArea& area, const std::function<int(std::vector<std::string>)>& run) {
    const pid_t asker = ::getppid();
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != asker || asker == 1) return 1;
    try {
        loadTorchRuntime();
    } catch (const std::exception& e) {
        sendText(fd, std::string("error ") + e.what());
        return 1;
    }
    // Trials run with one compute thread unless told otherwise: set it here once, so that a
    // trial that asks for one finds it set and leaves OpenBLAS's pool stopped (restarting it
    // costs a spinning worker, see setComputeThreads).
    setComputeThreads(1);
    // OpenSSL initialises itself (reads its configuration, loads its default provider) on the
    // first digest, which every trial takes (a checkpoint's hash): once here instead.
    (void)sha256Hex("", 0);
    // Forking is safe only if no thread of ours is left running: a thread holding a lock at the
    // fork leaves it held in the copy. OpenBLAS, which starts its pool when loaded, stops it
    // before a fork (pthread_atfork); anything else that started one would show here.
    const pid_t probe = ::fork();
    if (probe == 0) ::_exit(0);
    if (probe > 0) ::waitpid(probe, nullptr, 0);
    if (const int n = threadCount(); probe < 0 || n != 1) {
        sendText(fd,
                 "error the server runs " + std::to_string(n) + " threads after a fork: not safe to fork");
        return 1;
    }
    if (!sendText(fd, "ready")) return 1;
    std::string request;
    for (;;) {
        if (!receive(fd, request, -1)) return 0;  // the asker closed its end, or died
        const auto parts = splitNul(request);
        if (parts.size() == 2 && parts[0] == "prepare") {
            // The study's base config: its data file is parsed here once, and each command
            // forked from now on finds it parsed (data::preloadData).
            std::string answer = "ok";
            try {
                if (data::preloadData(loadRunSpec(parts[1]))) answer = "ok kept";
            } catch (const std::exception& e) {
                answer = std::string("error ") + e.what();
            }
            if (const int n = threadCount(); n != 1) {
                sendText(fd, "error the server runs " + std::to_string(n) +
                                 " threads after reading the data set: not safe to fork");
                return 1;
            }
            sendText(fd, answer);
            continue;
        }
        if (parts.size() < 4 || parts[0] != "spawn") {
            sendText(fd, "error malformed request");
            continue;
        }
        Stdio io;
        io.in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        io.out = ::open(parts[1].c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        io.err = ::open(parts[2].c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (io.in < 0 || io.out < 0 || io.err < 0) {
            const int e = errno;
            io.close();
            sendText(fd, "error cannot open a trial's log file " + parts[2] + ": " + std::strerror(e));
            continue;
        }
        int pipeFd[2];
        if (::pipe2(pipeFd, O_CLOEXEC) != 0) {
            io.close();
            sendText(fd, std::string("error pipe: ") + std::strerror(errno));
            continue;
        }
        const pid_t middle = ::fork();
        if (middle == 0) {
            ::close(pipeFd[0]);
            const pid_t self = ::getpid();
            const pid_t command = ::fork();
            if (command == 0) {
                ::close(pipeFd[1]);
                ::close(fd);
                becomeCommand(asker, self, io, area, parts, run);
            }
            const int e[2] = {static_cast<int>(command), errno};
            [[maybe_unused]] const auto w = ::write(pipeFd[1], e, sizeof e);
            ::_exit(0);
        }
        const int forkErr = errno;
        ::close(pipeFd[1]);
        io.close();
        int e[2] = {-1, 0};
        if (middle < 0) {
            e[1] = forkErr;
        } else {
            while (::waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
            }
            if (::read(pipeFd[0], e, sizeof e) != static_cast<ssize_t>(sizeof e)) e[0] = -1;
        }
        ::close(pipeFd[0]);
        if (e[0] > 0)
            sendText(fd, "pid " + std::to_string(e[0]));
        else
            sendText(fd, std::string("error fork: ") + std::strerror(e[1] ? e[1] : EAGAIN));
    }
}

}  // namespace lathe::core
