#include "sshd_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

extern char** environ;

namespace lathe::remote::test {

namespace {
constexpr const char* kSshd = "/usr/sbin/sshd";

sockaddr_in loopback(const char* address, int port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, address, &sa.sin_addr);
    return sa;
}

bool accepts(const char* address, int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    const sockaddr_in sa = loopback(address, port);
    const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0;
    ::close(fd);
    return ok;
}
}  // namespace

TempDir::TempDir() {
    char tmpl[] = "/tmp/lathe-remote-test-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    m_path = tmpl;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(m_path, ec);
}

int freePort(const char* address) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa = loopback(address, 0);
    socklen_t len = sizeof sa;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
        if (fd >= 0) ::close(fd);
        throw std::runtime_error(std::string("cannot find a free port on ") + address);
    }
    const int port = ntohs(sa.sin_port);
    ::close(fd);
    return port;
}

int runCommand(const std::string& command, std::string* out) {
    FILE* p = ::popen(command.c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
        if (out) out->append(buf, n);
    const int status = ::pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string readFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

void writeFile(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + path);
}

std::string currentUser() {
    const passwd* pw = ::getpwuid(::geteuid());
    return pw ? pw->pw_name : "root";
}

std::string SshdServer::unavailableReason() {
    if (::access(kSshd, X_OK) != 0) return "OpenSSH server not installed (/usr/sbin/sshd missing)";
    if (runCommand("command -v ssh-keygen >/dev/null 2>&1") != 0) return "ssh-keygen not installed";
    return {};
}

SshdServer::SshdServer(std::string address) : m_address(std::move(address)) {
    for (const char* key : {"host_ed25519", "client_ed25519", "wrong_ed25519"}) {
        const std::string cmd = "ssh-keygen -q -t ed25519 -N '' -C lathe-test -f '" + m_dir.file(key) + "'";
        if (runCommand(cmd) != 0) throw std::runtime_error("ssh-keygen failed: " + cmd);
    }
    writeFile(m_dir.file("authorized_keys"), readFile(m_dir.file("client_ed25519.pub")));
    std::string fp;
    runCommand("ssh-keygen -l -E sha256 -f '" + m_dir.file("host_ed25519.pub") + "'", &fp);
    // "256 SHA256:abc… comment (ED25519)"
    std::istringstream fields(fp);
    std::string bits;
    fields >> bits >> m_fingerprint;
    ::mkdir("/run/sshd", 0755);  // privilege separation directory; fine if it exists
    start();
}

SshdServer::~SshdServer() { stop(); }

void SshdServer::start() {
    std::string lastLog;
    for (int attempt = 0; attempt < 3; ++attempt) {
        m_port = freePort(m_address.c_str());
        std::ostringstream conf;
        conf << "ListenAddress " << m_address << "\n"
             << "Port " << m_port << "\n"
             << "HostKey " << m_dir.file("host_ed25519") << "\n"
             << "AuthorizedKeysFile " << m_dir.file("authorized_keys") << "\n"
             << "PidFile " << m_dir.file("sshd.pid") << "\n"
             << "PasswordAuthentication no\n"
             << "KbdInteractiveAuthentication no\n"
             << "PubkeyAuthentication yes\n"
             << "PermitRootLogin prohibit-password\n"
             << "StrictModes no\n"
             << "UsePAM no\n"
             << "Subsystem sftp internal-sftp\n"
             << "LogLevel VERBOSE\n";
        writeFile(m_dir.file("sshd_config"), conf.str());

        const std::string confPath = m_dir.file("sshd_config");
        const std::string logPath = m_dir.file("sshd.log");
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, logPath.c_str(),
                                         O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
        const char* argv[] = {kSshd, "-f", confPath.c_str(), "-D", "-e", nullptr};
        const int rc =
            ::posix_spawn(&m_pid, kSshd, &actions, nullptr, const_cast<char* const*>(argv), environ);
        posix_spawn_file_actions_destroy(&actions);
        if (rc != 0) throw std::runtime_error("cannot start sshd");

        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < deadline) {
            int status = 0;
            if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
                m_pid = -1;
                break;  // exited: port taken or bad config; the log says which
            }
            if (accepts(m_address.c_str(), m_port)) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        stop();
        lastLog = log();
    }
    throw std::runtime_error("sshd did not start; its log:\n" + lastLog);
}

void SshdServer::stop() noexcept {
    if (m_pid <= 0) return;
    ::kill(m_pid, SIGTERM);
    for (int i = 0; i < 200; ++i) {
        if (::waitpid(m_pid, nullptr, WNOHANG) == m_pid) {
            m_pid = -1;
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(m_pid, SIGKILL);
    ::waitpid(m_pid, nullptr, 0);
    m_pid = -1;
}

std::string SshdServer::hostPublicKey() const {
    std::string key = readFile(m_dir.file("host_ed25519.pub"));
    while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
    return key;
}

std::vector<int> SshdServer::connectionPids() const {
    // Every sshd process below the listener (the per-connection monitor and its session
    // processes), not the commands they run.
    std::vector<int> pids;
    if (m_pid <= 0) return pids;
    std::string out;
    runCommand("ps -eo pid=,ppid=,comm=", &out);
    std::vector<std::tuple<int, int, std::string>> procs;
    std::istringstream in(out);
    int pid, ppid;
    std::string comm;
    while (in >> pid >> ppid >> comm) procs.emplace_back(pid, ppid, comm);
    std::vector<int> frontier{m_pid};
    while (!frontier.empty()) {
        const int parent = frontier.back();
        frontier.pop_back();
        for (const auto& [p, pp, c] : procs)
            if (pp == parent && c == "sshd") {
                pids.push_back(p);
                frontier.push_back(p);
            }
    }
    return pids;
}

HostSpec SshdServer::spec() const {
    HostSpec spec;
    spec.host = m_address;
    spec.port = m_port;
    spec.user = currentUser();
    spec.identityFile = clientKey();
    spec.knownHostsFile = knownHosts();
    spec.connectTimeoutSec = 5;
    return spec;
}

}  // namespace lathe::remote::test
