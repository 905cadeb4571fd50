// core::ServerHost over SSH (server_host.h).
#include "lathe/remote/server_host.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "lathe/core/error.h"
#include "lathe/remote/sftp.h"
#include "lathe/remote/ssh_session.h"

namespace fs = std::filesystem;

namespace lathe::remote {

namespace {

constexpr const char* kModels = ".cache/lathe/models";
constexpr const char* kDeploy = ".cache/lathe/deploy";

class SshServerHost final : public core::ServerHost {
public:
    SshServerHost(std::string name, HostSpec spec, std::string lathectl)
        : m_name(std::move(name)), m_spec(std::move(spec)), m_lathectl(std::move(lathectl)) {}

    std::string target() const override { return "ssh:" + m_name; }

    std::string address() override {
        std::string a = session().peerAddress();
        if (a.empty()) {  // behind ProxyJump: the host's own first address
            a = run("hostname -I 2>/dev/null | cut -d' ' -f1", "asking its address");
            while (!a.empty() && std::isspace(static_cast<unsigned char>(a.back()))) a.pop_back();
        }
        if (a.empty()) fail("cannot tell the address this machine reaches it at");
        return a;
    }

    uint16_t freePort() override {
        // Free on every address of the family: the server listens on all of them.
        const std::string any = address().find(':') != std::string::npos ? "::" : "0.0.0.0";
        const std::string out = run(program() + " free-port --address " + any, "finding a free port");
        try {
            const int port = std::stoi(out);
            if (port > 0 && port < 65536) return static_cast<uint16_t>(port);
        } catch (const std::exception&) {
        }
        fail("lathectl free-port printed no port");
    }

    std::string stageArtifact(const std::string& localPath, const std::string& sha256) override {
        const std::string path =
            std::string(kModels) + "/" + sha256 + fs::path(localPath).extension().string();
        try {
            if (remoteSha256(session(), path) == sha256) return absolute(path);
        } catch (const SshError&) {  // not there yet
        }
        guard([&] { upload(session(), localPath, path, 0644); });
        return absolute(path);
    }

    int64_t startServer(const std::vector<std::string>& serveArgs, const std::string& token,
                        std::string& logPath) override {
        std::string instance;
        for (size_t i = 0; i + 1 < serveArgs.size(); ++i)
            if (serveArgs[i] == "--instance-id") instance = serveArgs[i + 1];
        if (instance.empty()) fail("a server needs its --instance-id");
        // The token travels as a file: local 0600 copy, uploaded with mode 0600, removed here.
        char tmpl[] = "/tmp/lathe-token-XXXXXX";
        const int fd = ::mkstemp(tmpl);
        if (fd < 0) fail("cannot write a private temporary file");
        const bool written = ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
        ::close(fd);
        struct Remove {
            const char* path;
            ~Remove() { ::unlink(path); }
        } removeLocal{tmpl};
        if (!written) fail("cannot write a private temporary file");
        const std::string tokenPath = tokenFile(instance);
        guard([&] { upload(session(), tmpl, tokenPath, 0600); });
        logPath = absolute(std::string(kDeploy) + "/" + instance + ".log");
        // Only the server goes to the background, so $! is its pid (setsid, not a group leader
        // there, does not fork).
        std::string cmd = "cd && umask 077 && { setsid " + program();
        for (const auto& a : serveArgs) cmd += " " + shellQuote(a);
        cmd += " --token-file " + shellQuote(tokenPath) + " >" + shellQuote(logPath) +
               " 2>&1 </dev/null & echo \"lathe-server-pid=$!\"; }";
        // The pid on a line of its own: a login's start-up files may print before it.
        const std::string out = run(cmd, "starting the server");
        std::istringstream lines(out);
        for (std::string line; std::getline(lines, line);)
            if (line.rfind("lathe-server-pid=", 0) == 0) try {
                    return std::stoll(line.substr(17));
                } catch (const std::exception&) {
                }
        fail("the server's start printed no pid");
    }

    void serverStarted(const std::string& instance) override {
        run("rm -f -- " + shellQuote(tokenFile(instance)), "removing the token file");
    }

    bool isServer(int64_t pid, const std::string& instance) override {
        if (pid <= 0 || instance.empty()) return false;
        // Ours (same user) and the deployment's server: `serve … --instance-id INSTANCE` on its
        // command line. Not its executable's name: the inventory's lathectl may be a wrapper
        // script that execs it, and setsid runs for a moment before it. A process gone between
        // two reads is simply not there.
        const std::string p = "/proc/" + std::to_string(pid);
        const std::string out =
            run("if [ \"$(stat -c %u " + p + " 2>/dev/null)\" = \"$(id -u)\" ]; then tr '\\0' '\\n' < " + p +
                    "/cmdline; fi 2>/dev/null; true",
                "looking at the server process");
        std::istringstream lines(out);
        std::vector<std::string> args;
        for (std::string line; std::getline(lines, line);) args.push_back(line);
        bool serve = false;
        for (size_t i = 0; i < args.size(); ++i) {
            serve |= args[i] == "serve";
            if (serve && args[i] == "--instance-id" && i + 1 < args.size()) return args[i + 1] == instance;
        }
        return false;
    }

    void stopServer(int64_t pid, const std::string& instance) override {
        if (isServer(pid, instance)) {
            run("kill -TERM " + std::to_string(pid) + " 2>/dev/null; true", "stopping the server");
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (isServer(pid, instance) && std::chrono::steady_clock::now() < deadline)
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        // The net under it: any process of ours still carrying the instance id (a pid that never
        // came back, a wrapper's child). The bracket keeps the pattern off this shell's own line.
        run("pkill -KILL -u \"$(id -u)\" -f -- " + shellQuote("[-]-instance-id " + instance) + "; true",
            "stopping the server");
        run("rm -f -- " + shellQuote(tokenFile(instance)), "removing the token file");
    }

    std::string logTail(const std::string& logPath) override {
        try {
            const std::string out =
                run("tail -n 8 -- " + shellQuote(logPath) + " 2>/dev/null; true", "reading the log");
            std::string indented;
            std::istringstream lines(out);
            for (std::string l; std::getline(lines, l);) indented += "\n  " + l;
            return indented;
        } catch (const std::exception& ex) {
            return std::string(" (unreadable: ") + ex.what() + ")";
        }
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw core::Error("host " + m_name + ": " + what);
    }

    // SSH failures become core::Error, which deploy reports as they are.
    template <typename F>
    void guard(F&& f) {
        try {
            f();
        } catch (const SshError& ex) {
            m_session.reset();
            throw core::Error(std::string(ex.what()) +
                              (m_name == m_spec.label() ? "" : " (host " + m_name + ")"));
        }
    }

    SshSession& session() {
        if (!m_session || !m_session->isConnected()) {
            m_session = std::make_unique<SshSession>(m_spec);
            guard([&] { m_session->connect(HostKeyPolicy::Strict); });
            guard([&] { m_home = m_session->run("printf %s \"$HOME\"", "finding the home directory", 30); });
        }
        return *m_session;
    }

    // POSIX sh whatever the login shell is (csh, fish: one quoted word is all they run).
    std::string run(const std::string& command, const std::string& what) {
        std::string out;
        SshSession& s = session();
        guard([&] { out = s.run("sh -c " + shellQuote(command), what, 60); });
        return out;
    }

    std::string program() {
        if (m_lathectl.empty()) return "lathectl";
        if (m_lathectl.rfind("~/", 0) == 0) return "\"$HOME\"/" + shellQuote(m_lathectl.substr(2));
        return shellQuote(m_lathectl);
    }
    std::string absolute(const std::string& relative) {
        session();
        return m_home.empty() ? relative : m_home + "/" + relative;
    }
    static std::string tokenFile(const std::string& instance) {
        return std::string(kDeploy) + "/" + instance + ".token";
    }

    std::string m_name;
    HostSpec m_spec;
    std::string m_lathectl;
    std::unique_ptr<SshSession> m_session;
    std::string m_home;
};

}  // namespace

std::shared_ptr<core::ServerHost> sshServerHost(const std::string& name, const HostSpec& spec,
                                                const std::string& lathectl) {
    return std::make_shared<SshServerHost>(name, spec, lathectl);
}

}  // namespace lathe::remote
