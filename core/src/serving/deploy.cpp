// Local deployments: a detached `lathectl serve` per model, started once and hot-swapped after.
// POSIX only; no LibTorch here.
#include "lathe/core/deploy.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "lathe/core/events.h"
#include "lathe/core/monitor.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace lathe::core {
namespace {

void say(const DeployOptions& o, const std::string& text) {
    if (o.progress) o.progress(text);
}

uint16_t portOf(const std::string& url) {
    const auto colon = url.rfind(':');
    if (colon == std::string::npos) return 0;
    try {
        return static_cast<uint16_t>(std::stoi(url.substr(colon + 1)));
    } catch (...) {
        return 0;
    }
}

bool portFree(const std::string& host, uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

// Running and not a zombie: an orphaned server is reaped by init, but not every container's
// init reaps promptly.
bool alive(int64_t pid) {
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) != 0) return false;
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

// Only a process that is really a Lathe server may be signalled: a recorded pid may have been
// reused by something else since.
bool isServer(int64_t pid) {
    if (!alive(pid)) return false;
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return cmd.find(std::string("serve") + '\0') != std::string::npos;
}

std::string logTail(const std::string& path, size_t lines = 8) {
    std::ifstream in(path);
    std::vector<std::string> all;
    for (std::string l; std::getline(in, l);) all.push_back(l);
    std::string out;
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "\n  " + all[i];
    return out;
}

// Double fork: the server is re-parented to init, so it outlives this process (a command or the
// GUI) and never lingers as our zombie; setsid keeps a Ctrl+C in our terminal away from it.
int64_t spawnDetached(const std::vector<std::string>& args, const std::string& logPath) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    int pipeFd[2];
    if (::pipe2(pipeFd, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
    const int logFd = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logFd < 0) throw Error("cannot open server log " + logPath + ": " + std::strerror(errno));
    const int nullFd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t child = ::fork();
    if (child < 0) throw Error(std::string("fork: ") + std::strerror(errno));
    if (child == 0) {
        ::setsid();
        const pid_t grandchild = ::fork();
        if (grandchild != 0) {
            const int64_t pid = grandchild;
            (void)!::write(pipeFd[1], &pid, sizeof pid);
            ::_exit(grandchild > 0 ? 0 : 1);
        }
        ::dup2(nullFd, 0);
        ::dup2(logFd, 1);
        ::dup2(logFd, 2);
        ::execv(argv[0], argv.data());
        const std::string msg = std::string("cannot start ") + argv[0] + ": " + std::strerror(errno) + "\n";
        (void)!::write(2, msg.data(), msg.size());
        ::_exit(127);
    }
    ::close(pipeFd[1]);
    ::close(logFd);
    if (nullFd >= 0) ::close(nullFd);
    int64_t pid = 0;
    const auto n = ::read(pipeFd[0], &pid, sizeof pid);
    ::close(pipeFd[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    if (n != sizeof pid || pid <= 0) throw Error("could not start the server process");
    return pid;
}

// A nonce, not a secret: it only tells the server this deploy started from any other one that
// may answer on the same port.
std::string instanceToken() {
    std::random_device rd;
    char buf[33];
    std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    return buf;
}

std::string serverInstance(const std::string& url) {
    try {
        const auto r = httpRequest("GET", url + "/v2", {}, 1.0);
        if (r.status != 200) return {};
        return json::parse(r.body).value("instance", std::string());
    } catch (...) {
        return {};
    }
}

int64_t servedVersion(const std::string& url, const std::string& model, double timeoutS) {
    const auto r = httpRequest("GET", url + "/v2/models/" + model, {}, timeoutS);
    if (r.status != 200) return 0;
    try {
        const auto j = json::parse(r.body);
        return std::stoll(j.at("versions").at(0).get<std::string>());
    } catch (...) {
        return 0;
    }
}

}  // namespace

bool deploymentUp(const Deployment& d, double timeoutS) {
    try {
        return httpRequest("GET", d.url + "/v2/health/ready", {}, timeoutS).status == 200;
    } catch (const Error&) {
        return false;
    }
}

DeployResult deploy(Registry& registry, const ModelRef& ref, const DeployOptions& o) {
    const auto v = registry.resolve(ref);
    say(o, ref.str() == v.name + ":" + std::to_string(v.version) ? "deploying " + ref.str()
                                                                   : "deploying " + ref.str() + " (v" + std::to_string(v.version) + ")");
    DeployResult result;
    auto live = registry.liveDeployment(v.name);
    if (live && live->target == "local" && isServer(live->pid) && deploymentUp(*live)) {
        if (o.port != 0 && o.port != portOf(live->url))
            throw ConfigError(v.name + " is live at " + live->url + "; undeploy it first to move it to port " +
                              std::to_string(o.port));
        result.previousVersion = live->version;
        if (live->version == v.version && o.action == "deploy")
            throw ConfigError(v.name + " v" + std::to_string(v.version) + " is already live at " + live->url);
        say(o, "hot-swapping " + v.name + " v" + std::to_string(live->version) + " -> v" + std::to_string(v.version) +
                   " at " + live->url);
        const json body{{"parameters", {{"version", std::to_string(v.version)}}}};
        const auto r = httpRequest("POST", live->url + "/v2/repository/models/" + v.name + "/load", body.dump(),
                                   o.readyTimeoutS);
        if (r.status != 200) {
            std::string why = r.body;
            try {
                why = json::parse(r.body).at("error").get<std::string>();
            } catch (...) {
            }
            throw Error("the server at " + live->url + " refused v" + std::to_string(v.version) + " (HTTP " +
                        std::to_string(r.status) + "): " + why + "; v" + std::to_string(live->version) +
                        " keeps serving");
        }
        if (servedVersion(live->url, v.name, 5) != v.version)
            throw Error("the server at " + live->url + " answered the load but does not serve v" +
                        std::to_string(v.version));
        Deployment d = *live;
        d.id = 0;
        d.version = v.version;
        d.actor = o.actor;
        d.action = o.action;
        d.reason = o.reason;
        d.startedAt = 0;
        d.endedAt = 0;
        d.endReason.clear();
        d.id = registry.recordDeployment(d);
        result.deployment = d;
        say(o, v.name + " v" + std::to_string(v.version) + " is live at " + d.url);
        return result;
    }
    if (live) {
        // Recorded as live but not answering: its server died or the machine restarted.
        registry.endDeployment(live->id, "server not running");
        result.previousVersion = live->version;
    }
    if (o.serverProgram.empty()) throw ConfigError("deploy needs the path of lathectl to start a server");
    const bool pickPort = o.port == 0;
    const uint16_t preferred = live && portOf(live->url) ? portOf(live->url) : 8500;
    auto freePort = [&](uint16_t from) -> uint16_t {
        for (uint32_t p = from; p < uint32_t{from} + 100 && p <= 65535; ++p)
            if (portFree(o.host, static_cast<uint16_t>(p))) return static_cast<uint16_t>(p);
        throw Error("no free port from " + std::to_string(from) + " upwards; pass --port");
    };
    uint16_t port = o.port;
    if (pickPort) port = freePort(preferred);
    else if (!portFree(o.host, port))
        throw Error("port " + std::to_string(port) + " on " + o.host + " is in use; choose another with --port");
    const auto dir = fs::path(registry.workspacePath()).parent_path() / "deployments";
    std::error_code ec;
    fs::create_directories(dir, ec);
    Deployment d;
    d.model = v.name;
    d.version = v.version;
    d.target = "local";
    d.actor = o.actor;
    d.action = o.action;
    d.reason = o.reason;
    const std::string token = instanceToken();
    // Another program (or another deploy) may take a free port between our check and the
    // server's bind: then the server exits saying so, and a picked port moves on.
    for (int attempt = 0;; ++attempt) {
        const auto logPath = (dir / (v.name + "-" + std::to_string(static_cast<int64_t>(nowSeconds())) + "-" +
                                     std::to_string(port) + ".log"))
                                 .string();
        std::vector<std::string> args{o.serverProgram, "serve",    "--db",   registry.workspacePath(),
                                      "--model",       v.name + ":" + std::to_string(v.version),
                                      "--host",        o.host,     "--port", std::to_string(port),
                                      "--instance-id", token,      "--watch"};
        args.insert(args.end(), o.serverArgs.begin(), o.serverArgs.end());
        say(o, "starting a server on " + o.host + ":" + std::to_string(port) + " (log " + logPath + ")");
        const int64_t pid = spawnDetached(args, logPath);
        d.url = "http://" + o.host + ":" + std::to_string(port);
        d.pid = pid;
        d.logPath = logPath;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.readyTimeoutS);
        bool retry = false;
        for (;;) {
            if (!alive(pid)) {
                const auto tail = logTail(logPath);
                if (pickPort && attempt < 5 && tail.find("in use") != std::string::npos) {
                    port = freePort(static_cast<uint16_t>(port + 1));
                    retry = true;
                    break;
                }
                throw Error("the server for " + v.name + " exited before it was ready; its log " + logPath +
                            " ends:" + tail);
            }
            // Ours (not another server that answers on this port), ready, and serving the version.
            if (serverInstance(d.url) == token && deploymentUp(d, 1.0) && servedVersion(d.url, v.name, 2) == v.version)
                break;
            if (std::chrono::steady_clock::now() > deadline) {
                ::kill(static_cast<pid_t>(pid), SIGTERM);
                throw Error("the server for " + v.name + " was not ready within " +
                            std::to_string(static_cast<int>(o.readyTimeoutS)) + " s; stopped it. Log " + logPath +
                            ":" + logTail(logPath));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        if (!retry) break;
    }
    d.id = registry.recordDeployment(d);
    result.deployment = d;
    result.started = true;
    say(o, v.name + " v" + std::to_string(v.version) + " is live at " + d.url + " (pid " + std::to_string(d.pid) + ")");
    return result;
}

DeployResult rollback(Registry& registry, const std::string& model, const DeployOptions& options) {
    const auto history = registry.deployments(model);
    if (history.empty() || !history.front().live())
        throw ConfigError(model + " is not deployed; nothing to roll back (see `lathectl deployments " + model + "`)");
    const auto current = history.front().version;
    for (size_t i = 1; i < history.size(); ++i) {
        if (history[i].version == current) continue;
        DeployOptions o = options;
        o.action = "rollback";
        if (o.reason.empty()) o.reason = "rollback from v" + std::to_string(current);
        return deploy(registry, {model, history[i].version, {}}, o);
    }
    throw ConfigError(model + " has no earlier version in its deployment history to roll back to (live: v" +
                      std::to_string(current) + ")");
}

void undeploy(Registry& registry, const std::string& model) {
    const auto live = registry.liveDeployment(model);
    if (!live) throw ConfigError(model + " is not deployed");
    if (live->target == "local" && isServer(live->pid)) {
        const auto pid = static_cast<pid_t>(live->pid);
        ::kill(pid, SIGTERM);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (alive(pid) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (alive(pid)) ::kill(pid, SIGKILL);
    }
    registry.endDeployment(live->id, "undeployed");
}

}  // namespace lathe::core
