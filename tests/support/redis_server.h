#pragma once
// A real redis-server (Debian's redis-server package) on a free loopback port, for the data
// pipeline's cache tests: started with no persistence, killed (SIGKILL, as a crash) on demand and
// at the end of the test.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "run_process.h"

namespace lathe::test {

class RedisServer {
public:
    static bool available() {
        return runShell("command -v redis-server && command -v redis-cli").exitCode == 0;
    }

    /// Starts it on 127.0.0.1:`port`; false when it did not answer PING within 10 s.
    bool start(int port) {
        m_port = port;
        m_pid = ::fork();
        if (m_pid == 0) {
            const std::string p = std::to_string(port);
            const int null = ::open("/dev/null", O_WRONLY);
            if (null >= 0) {
                ::dup2(null, 1);
                ::dup2(null, 2);
            }
            ::execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", "--maxmemory",
                     "256mb", static_cast<char*>(nullptr));
            ::_exit(127);
        }
        for (int i = 0; i < 100; ++i) {
            if (runShell("redis-cli -h 127.0.0.1 -p " + std::to_string(port) + " ping").out.find("PONG") !=
                std::string::npos)
                return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return false;
    }
    void kill() {
        if (m_pid <= 0) return;
        ::kill(m_pid, SIGKILL);
        int status = 0;
        ::waitpid(m_pid, &status, 0);
        m_pid = -1;
    }
    /// `redis-cli` with `args` against this server.
    std::string cli(const std::string& args) const {
        return runShell("redis-cli -h 127.0.0.1 -p " + std::to_string(m_port) + " " + args).out;
    }
    int port() const { return m_port; }
    std::string url() const { return "redis://127.0.0.1:" + std::to_string(m_port); }
    ~RedisServer() { kill(); }

private:
    pid_t m_pid = -1;
    int m_port = 0;
};

}  // namespace lathe::test
