// Deployments: a detached `lathectl serve` per model, started once and hot-swapped after, on this
// machine or on a host of the inventory (through a ServerHost). POSIX only; no LibTorch here.
#include "lathe/core/deploy.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include "deploy_internal.h"
#include "lathe/core/events.h"
#include "lathe/core/executable.h"
#include "lathe/core/http_client.h"
#include "lathe/core/monitor.h"
#include "lathe/core/rollout.h"
#include "lathe/core/scraper.h"
#include "lathe/core/store.h"
#include "ports.h"
#include "workspace/file_lock.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace lathe::core {
namespace {

std::string seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
}

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

// Running and not a zombie: an orphaned server is reaped by init, but not every container's
// init reaps promptly.
bool alive(int64_t pid) {
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) != 0) return false;
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

std::vector<std::string> commandLine(int64_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::vector<std::string> args;
    for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
    return args;
}

// The program a process runs (the target of /proc/PID/exe), without the " (deleted)" the kernel
// appends once that file was replaced: a rebuilt or upgraded lathectl whose server still runs.
// Empty when it cannot be read (gone, or another user's).
std::string executableOf(int64_t pid) {
    std::error_code ec;
    std::string target = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
    if (ec) return {};
    const std::string deleted = " (deleted)";
    if (target.size() > deleted.size() &&
        target.compare(target.size() - deleted.size(), deleted.size(), deleted) == 0)
        target.resize(target.size() - deleted.size());
    return target;
}

// Whether `pid` is the server a deployment started: a live process running the `lathectl`
// executable (its /proc/PID/exe, which argv[0] cannot fake) with `serve` as its first argument
// and the deployment's own --instance-id nonce. A recorded pid may have been reused since (after
// a reboot, by anything, even by another model's server), and only our own server may be
// signalled or hot-swapped. A record without a nonce (written before the workspace stored one)
// is never trusted: nothing tells its server from a process that reused the pid.
bool isServerOf(const Deployment& d) {
    if (d.instance.empty() || !alive(d.pid)) return false;
    if (fs::path(executableOf(d.pid)).filename() != "lathectl") return false;
    const auto args = commandLine(d.pid);
    if (args.size() < 2 || args[1] != "serve") return false;
    for (size_t i = 2; i + 1 < args.size(); ++i)
        if (args[i] == "--instance-id") return args[i + 1] == d.instance;
    return false;
}

// A record without a nonce whose pid runs something that looks like its server (`serve` and
// `--model NAME:` in its arguments). Never acted on: it only decides whether to tell the user
// to stop that process by hand.
bool mayBeLegacyServer(const Deployment& d) {
    if (!d.instance.empty() || !alive(d.pid)) return false;
    const auto args = commandLine(d.pid);
    if (std::find(args.begin(), args.end(), "serve") == args.end()) return false;
    for (size_t i = 0; i + 1 < args.size(); ++i)
        if (args[i] == "--model" && args[i + 1].rfind(d.model + ":", 0) == 0) return true;
    return false;
}

const char* const kLegacyEnd = "recorded without an instance id: not trusted as running";

std::string legacyAdvice(const Deployment& d) {
    return d.model + " v" + std::to_string(d.version) + "'s deployment (pid " + std::to_string(d.pid) + ", " +
           d.url +
           ") was recorded without an instance id, so its pid cannot be told from another process's and "
           "was not signalled; the record is ended. Pid " +
           std::to_string(d.pid) + " runs a `serve` for it: if `ps -o args= -p " + std::to_string(d.pid) +
           "` shows that server, stop it with `kill " + std::to_string(d.pid) + "`";
}

// SIGTERM to a server this deploy started, unless its pid has gone (and may be reused). Right
// after the spawn the process may not have reached its exec yet: give it a moment to become
// `lathectl serve` rather than leave it running without a record.
void stopStarted(int64_t pid, const std::string& model, const std::string& token) {
    Deployment d;
    d.pid = pid;
    d.model = model;
    d.instance = token;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (alive(pid) && !isServerOf(d) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (isServerOf(d)) ::kill(static_cast<pid_t>(pid), SIGTERM);
}

// One deploy, rollback or undeploy of a model at a time, across processes (the GUI and a
// terminal): two deploys that both found no live server would each start one, and the record of
// the first would be ended while its process kept running. Another one under way is waited for
// (a start takes seconds).
FileLock modelLock(const Registry& registry, const std::string& model) {
    checkModelName(model);
    return FileLock(
        (fs::path(Store::filesDirFor(registry.workspacePath())) / "deployments" / (model + ".lock")).string(),
        true);
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
// `env`: NAME=VALUE entries the server gets on top of ours (replacing ours of the same name) —
// in its environment only, never on its command line, which every user can read.
int64_t spawnDetached(const std::vector<std::string>& args, const std::string& logPath,
                      const std::vector<std::string>& env = {}) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // Built before the fork: nothing may allocate between fork and exec.
    std::vector<char*> envp;
    for (char** e = environ; e && *e; ++e) {
        const std::string_view entry(*e);
        const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& mine) {
            const auto name = mine.substr(0, mine.find('=') + 1);
            return entry.substr(0, name.size()) == name;
        });
        if (!replaced) envp.push_back(*e);
    }
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    int pipeFd[2];
    if (::pipe2(pipeFd, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
    const int logFd = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logFd < 0) {
        const int err = errno;
        ::close(pipeFd[0]);
        ::close(pipeFd[1]);
        throw Error("cannot open server log " + logPath + ": " + std::strerror(err));
    }
    const int nullFd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t child = ::fork();
    if (child < 0) {
        const int err = errno;
        for (int fd : {pipeFd[0], pipeFd[1], logFd, nullFd})
            if (fd >= 0) ::close(fd);
        throw Error(std::string("fork: ") + std::strerror(err));
    }
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
        ::execve(argv[0], argv.data(), envp.data());
        // Only async-signal-safe calls between fork and exit: the parent may be the multithreaded
        // GUI, and an allocation here could wait forever on a malloc lock held by another thread.
        static const char kPrefix[] = "cannot start ", kSuffix[] = ": exec failed\n";
        (void)!::write(2, kPrefix, sizeof kPrefix - 1);
        (void)!::write(2, argv[0], std::strlen(argv[0]));
        (void)!::write(2, kSuffix, sizeof kSuffix - 1);
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

// A deployment's control token: 32 bytes from OpenSSL's CSPRNG, in hex. The server demands it
// as `Authorization: Bearer` on its /v2/repository API (load, hot swap, unload). A secret: kept in
// the workspace and the server's environment only, never printed, logged or put on a command line.
std::string controlToken() {
    unsigned char bytes[32];
    if (RAND_bytes(bytes, sizeof bytes) != 1)
        throw Error("cannot make a deployment token: the system's random source failed");
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * sizeof bytes);
    for (unsigned char b : bytes) {
        out.push_back(kHex[b >> 4]);
        out.push_back(kHex[b & 15]);
    }
    OPENSSL_cleanse(bytes, sizeof bytes);
    return out;
}

// The headers a control request to a deployment's server carries: its token, when it has one
// (servers deployed before tokens existed listen on loopback and take control requests without).
std::map<std::string, std::string> controlHeaders(const std::string& token) {
    if (token.empty()) return {};
    return {{"Authorization", "Bearer " + token}};
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

// 0 when the server does not answer in time, or answers without the model.
int64_t servedVersion(const std::string& url, const std::string& model, double timeoutS) {
    try {
        const auto r = httpRequest("GET", url + "/v2/models/" + model, {}, timeoutS);
        if (r.status != 200) return 0;
        const auto j = json::parse(r.body);
        return std::stoll(j.at("versions").at(0).get<std::string>());
    } catch (...) {
        return 0;
    }
}

// "127.0.0.1" of "http://127.0.0.1:8500".
std::string hostOf(const std::string& url) {
    const auto start = url.find("://");
    const auto from = start == std::string::npos ? 0 : start + 3;
    const auto colon = url.rfind(':');
    return colon == std::string::npos || colon < from ? url.substr(from) : url.substr(from, colon - from);
}

// The load of `v` into the live server at `live.url`. The answer to the load request may be lost
// (a timeout, a dropped connection) while the server goes on and switches anyway, so what the
// server serves afterwards decides, never the request alone.
// `token`: the server's control token ("" for a server deployed before tokens existed).
// `remotePath`: for a server without a registry (on another host), the artifact's path there.
void hotSwap(const Deployment& live, const ModelVersion& v, const DeployOptions& o, const std::string& token,
             const std::string& remotePath = {}) {
    json body{{"parameters", {{"version", std::to_string(v.version)}}}};
    if (!remotePath.empty()) {
        body["parameters"]["path"] = remotePath;
        body["parameters"]["sha256"] = v.sha256;
    }
    std::string lost;
    std::optional<HttpResult> r;
    try {
        r = httpRequest("POST", live.url + "/v2/repository/models/" + v.name + "/load", body.dump(),
                        o.readyTimeoutS, "application/json", controlHeaders(token));
    } catch (const Error& ex) {
        lost = ex.what();
    }
    if (r && r->status != 200) {
        std::string why = r->body;
        try {
            why = json::parse(r->body).at("error").get<std::string>();
        } catch (...) {
        }
        throw Error("the server at " + live.url + " refused v" + std::to_string(v.version) + " (HTTP " +
                    std::to_string(r->status) + "): " + why + "; v" + std::to_string(live.version) +
                    " keeps serving");
    }
    // After a lost answer the load may still be running: give it as long again as we waited.
    const double graceS = lost.empty() ? 5.0 : std::min(o.readyTimeoutS, 120.0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(graceS);
    int64_t served = 0;
    for (;;) {
        served = servedVersion(live.url, v.name, 2);
        if (served == v.version || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (served == v.version) return;
    const std::string now = served > 0 ? "it serves v" + std::to_string(served) : "it does not answer";
    if (lost.empty())
        throw Error("the server at " + live.url + " answered the load but does not serve v" +
                    std::to_string(v.version) + " (" + now + ")");
    throw Error("loading v" + std::to_string(v.version) + " into the server at " + live.url + " failed (" +
                lost + ") and after " + std::to_string(static_cast<int>(graceS)) + " s more " + now +
                "; the deployment history still names v" + std::to_string(live.version) +
                ". If the load finishes later, deploy v" + std::to_string(v.version) + " again to record it");
}

// A new server's control token is in the workspace before the server exists (a hot swap must
// find it), and forgotten again unless its deployment is recorded.
struct ForgetUnlessRecorded {
    Registry& registry;
    const std::string& instance;
    bool recorded = false;
    ~ForgetUnlessRecorded() {
        if (recorded) return;
        try {
            registry.forgetDeploymentToken(instance);
        } catch (...) {  // its server was stopped: the token opens nothing
        }
    }
};

// The record of a hot swap: the live deployment's server (pid, URL, instance) with the new
// version and who did it.
Deployment swappedRecord(const Deployment& live, const ModelVersion& v, const DeployOptions& o) {
    Deployment d = live;
    d.id = 0;
    d.version = v.version;
    d.actor = o.actor;
    d.action = o.action;
    d.reason = o.reason;
    d.startedAt = 0;
    d.endedAt = 0;
    d.endReason.clear();
    return d;
}

bool remoteTarget(const std::string& target) { return target.rfind("ssh:", 0) == 0; }

// "host gpu-a" for the target "ssh:gpu-a", as messages name it.
std::string placeOf(const std::string& target) {
    return remoteTarget(target) ? "host " + target.substr(4) : target == "local" ? "this machine" : target;
}

std::shared_ptr<ServerHost> hostOfTarget(const DeployOptions& o, const std::string& target) {
    if (o.on && o.on->target() == target) return o.on;
    if (!o.hostFor)
        throw ConfigError("the deployment runs on " + placeOf(target) + ", which this program cannot reach");
    return o.hostFor(target);
}

// Records `d` (a few tries when the workspace is busy), or says what serves and how to record it.
int64_t recordSwapped(Registry& registry, const Deployment& d, const std::string& url,
                      const ModelVersion& v) {
    for (int attempt = 0;; ++attempt) {
        try {
            return registry.recordDeployment(d);
        } catch (const std::exception& ex) {
            if (attempt >= 2)
                throw Error(url + " now serves " + v.name + " v" + std::to_string(v.version) +
                            ", but the deployment history could not be updated (" + ex.what() +
                            "); run `lathectl deploy " + v.name + ":" + std::to_string(v.version) +
                            "` again to record it");
            std::this_thread::sleep_for(std::chrono::seconds(1));
        }
    }
}

// A server on another host cannot write to this workspace: a local `lathectl watch` scrapes its
// /metrics into it (the dashboard, alerts) for as long as the deployment lives, and exits when it
// ends. One per server: a second one started for the same server (a hot swap) leaves at once.
void startWatcher(Registry& registry, const DeployOptions& o, const Deployment& d,
                  const std::string& alertRules) {
    if (o.serverProgram.empty()) {
        say(o, "no local lathectl to watch " + d.url + ": its metrics are not recorded in the workspace");
        return;
    }
    try {
        const auto dir = fs::path(Store::filesDirFor(registry.workspacePath())) / "deployments";
        std::error_code ec;
        fs::create_directories(dir, ec);
        const auto log = (dir / (d.model + "-watch-" + d.instance.substr(0, 8) + ".log")).string();
        std::vector<std::string> args{o.serverProgram, "watch", "--db",       registry.workspacePath(),
                                      "--model",       d.model, "--instance", d.instance};
        if (!alertRules.empty()) args.insert(args.end(), {"--alert-rules", alertRules});
        spawnDetached(args, log);
    } catch (const std::exception& ex) {
        say(o, std::string("could not start the metrics watcher (") + ex.what() +
                   "); the server runs, its metrics are not recorded");
    }
}

// `--alert-rules FILE` of the server flags: read here by the watcher, not by the remote server.
std::string takeAlertRules(std::vector<std::string>& args) {
    std::string rules;
    for (size_t i = 0; i + 1 < args.size();) {
        if (args[i] == "--alert-rules") {
            rules = args[i + 1];
            args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                       args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
        } else {
            ++i;
        }
    }
    return rules;
}

// A deployment on another host (o.on, or a live one recorded there): the same steps as on this
// machine, each through the ServerHost. A host that cannot be reached changes nothing: its
// server is never written off as gone.
DeployResult deployElsewhere(Registry& registry, const ModelVersion& v, const std::optional<Deployment>& live,
                             const DeployOptions& o) {
    DeployResult result;
    if (live && remoteTarget(live->target) && (!o.on || o.on->target() == live->target)) {
        auto host = hostOfTarget(o, live->target);
        if (host->isServer(live->pid, live->instance)) {
            if (!deploymentUp(*live, 1.0) && !deploymentUp(*live, 10.0))
                throw Error(
                    v.name + "'s server on " + placeOf(live->target) + " (pid " + std::to_string(live->pid) +
                    ", " + live->url +
                    ") is running but does not answer /v2/health/ready; nothing was changed. Its log " +
                    live->logPath + " there ends:" + host->logTail(live->logPath));
            if (serverInstance(live->url) != live->instance)
                throw Error("the server answering at " + live->url + " is not the one recorded for " +
                            v.name + "; nothing was changed");
            if (o.port != 0 && o.port != portOf(live->url))
                throw ConfigError(v.name + " is live at " + live->url +
                                  "; undeploy it first to move it to port " + std::to_string(o.port));
            if (!o.serverArgs.empty()) {
                std::string flags;
                for (const auto& a : o.serverArgs)
                    if (a.rfind("--", 0) == 0) flags += (flags.empty() ? "" : " ") + a;
                throw ConfigError(v.name + " is live at " + live->url + " on " + placeOf(live->target) +
                                  " and a version change hot-swaps it, so " + flags +
                                  " would not apply; undeploy it first to start a server with them");
            }
            result.previousVersion = live->version;
            if (live->version == v.version && o.action == "deploy")
                throw ConfigError(v.name + " v" + std::to_string(v.version) + " is already live at " +
                                  live->url);
            say(o, "copying " + v.name + " v" + std::to_string(v.version) + " to " + placeOf(live->target));
            const std::string path = host->stageArtifact(v.path, v.sha256);
            say(o, "hot-swapping " + v.name + " v" + std::to_string(live->version) + " -> v" +
                       std::to_string(v.version) + " at " + live->url);
            hotSwap(*live, v, o, registry.deploymentToken(live->instance), path);
            Deployment d = swappedRecord(*live, v, o);
            d.id = recordSwapped(registry, d, live->url, v);
            result.deployment = d;
            startWatcher(registry, o, d, {});  // a watcher lost with this machine's restart comes back
            say(o, v.name + " v" + std::to_string(v.version) + " is live at " + d.url);
            return result;
        }
        registry.endDeployment(live->id, "server not running");
        result.previousVersion = live->version;
    } else if (live) {
        throw ConfigError(v.name + " is live at " + live->url + " on " + placeOf(live->target) +
                          "; undeploy it first to move it to " +
                          (o.on ? placeOf(o.on->target()) : std::string("this machine")));
    }
    // A new server: on the host asked for, else where the recorded one ran (it is gone).
    const auto host = o.on ? o.on : hostOfTarget(o, live->target);
    const std::string address = host->address();
    const uint16_t port = o.port != 0 ? o.port : host->freePort();
    say(o, "copying " + v.name + " v" + std::to_string(v.version) + " to " + placeOf(host->target()));
    const std::string path = host->stageArtifact(v.path, v.sha256);
    Deployment d;
    d.model = v.name;
    d.version = v.version;
    d.target = host->target();
    d.actor = o.actor;
    d.action = o.action;
    d.reason = o.reason;
    d.instance = instanceToken();
    // Clients reach it at the address this machine reached the host at; it listens on all of
    // the host's addresses of that family (a cloud host's public address is often not on any of
    // its interfaces).
    const bool v6 = address.find(':') != std::string::npos;
    const std::string listenOn = v6 ? "::" : "0.0.0.0";
    d.url = "http://" + (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
    const std::string secret = controlToken();
    registry.storeDeploymentToken(d.instance, secret);
    ForgetUnlessRecorded forget{registry, d.instance};
    std::vector<std::string> serverArgs = o.serverArgs;
    const std::string alertRules = takeAlertRules(serverArgs);
    std::vector<std::string> args{
        "serve",    "--file", path,     "--name", v.name,   "--version",          std::to_string(v.version),
        "--sha256", v.sha256, "--host", listenOn, "--port", std::to_string(port), "--instance-id",
        d.instance};
    args.insert(args.end(), serverArgs.begin(), serverArgs.end());
    say(o, "starting a server on " + placeOf(host->target()) + " at " + d.url);
    // Whatever goes wrong from the start until the deployment is recorded stops the server (by
    // its instance id when its pid never came back): none runs without a record.
    const auto stopIt = [&](const std::string& why) {
        try {
            host->stopServer(d.pid, d.instance);
        } catch (const std::exception& ex) {
            throw Error(why + "; and its server could not be stopped (" + ex.what() + "): stop it on " +
                        placeOf(host->target()) + " with pkill -f " + d.instance);
        }
    };
    try {
        d.pid = host->startServer(args, secret, d.logPath);
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::duration<double>(o.readyTimeoutS);
        for (;;) {
            if (serverInstance(d.url) == d.instance && deploymentUp(d, 1.0) &&
                servedVersion(d.url, v.name, 2) == v.version)
                break;
            if (!host->isServer(d.pid, d.instance))
                throw Error("the server for " + v.name + " on " + placeOf(host->target()) +
                            " exited before it was ready; its log " + d.logPath +
                            " there ends:" + host->logTail(d.logPath));
            if (std::chrono::steady_clock::now() > deadline)
                throw Error("the server for " + v.name + " on " + placeOf(host->target()) +
                            " was not ready within " + seconds(o.readyTimeoutS) + " s; stopped it. Its log " +
                            d.logPath + " there ends:" + host->logTail(d.logPath));
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        d.id = registry.recordDeployment(d);
    } catch (const std::exception& ex) {
        stopIt(ex.what());
        throw;
    }
    try {
        host->serverStarted(d.instance);  // the token file goes; stopServer removes it too
    } catch (const std::exception& ex) {
        say(o, std::string("note: ") + ex.what());
    }
    forget.recorded = true;
    result.deployment = d;
    result.started = true;
    startWatcher(registry, o, d, alertRules);
    say(o, v.name + " v" + std::to_string(v.version) + " is live at " + d.url + " on " +
               placeOf(host->target()) + " (pid " + std::to_string(d.pid) + " there)");
    return result;
}

DeployResult deployLocked(Registry& registry, const ModelVersion& v, const ModelRef& ref,
                          const DeployOptions& o) {
    say(o, ref.str() == v.name + ":" + std::to_string(v.version)
               ? "deploying " + ref.str()
               : "deploying " + ref.str() + " (v" + std::to_string(v.version) + ")");
    DeployResult result;
    auto live = registry.liveDeployment(v.name);
    if (o.on || (live && remoteTarget(live->target))) return deployElsewhere(registry, v, live, o);
    if (live && live->target == "local" && isServerOf(*live)) {
        // Our server's process is running: it is hot-swapped or nothing happens. It is never
        // written off as dead while it runs, which would leave it serving with no record.
        if (!deploymentUp(*live, 1.0) && !deploymentUp(*live, 10.0))
            throw Error(
                v.name + "'s server (pid " + std::to_string(live->pid) + ", " + live->url +
                ") is running but does not answer /v2/health/ready; nothing was changed. Look at its log " +
                live->logPath + ", or stop it with `lathectl undeploy " + v.name + "` and deploy again");
        if (!live->instance.empty() && serverInstance(live->url) != live->instance)
            throw Error("the server answering at " + live->url + " is not the one recorded for " + v.name +
                        " (pid " + std::to_string(live->pid) + "); nothing was changed");
        if (o.port != 0 && o.port != portOf(live->url))
            throw ConfigError(v.name + " is live at " + live->url +
                              "; undeploy it first to move it to port " + std::to_string(o.port));
        if (!o.host.empty() && o.host != hostOf(live->url))
            throw ConfigError(v.name + " is live at " + live->url +
                              "; undeploy it first to move it to host " + o.host);
        if (!o.serverArgs.empty()) {
            std::string flags;
            for (const auto& a : o.serverArgs)
                if (a.rfind("--", 0) == 0) flags += (flags.empty() ? "" : " ") + a;
            throw ConfigError(v.name + " is live at " + live->url +
                              " and a version change hot-swaps it, so " + flags +
                              " would not apply; undeploy it first to start a server with them");
        }
        result.previousVersion = live->version;
        if (live->version == v.version && o.action == "deploy")
            throw ConfigError(v.name + " v" + std::to_string(v.version) + " is already live at " + live->url);
        say(o, "hot-swapping " + v.name + " v" + std::to_string(live->version) + " -> v" +
                   std::to_string(v.version) + " at " + live->url);
        hotSwap(*live, v, o, registry.deploymentToken(live->instance));
        Deployment d = swappedRecord(*live, v, o);
        // The server already serves the new version: its record must follow (a busy workspace
        // gets a few more chances), or the error says exactly what serves and how to record it.
        for (int attempt = 0;; ++attempt) {
            try {
                d.id = registry.recordDeployment(d);
                break;
            } catch (const std::exception& ex) {
                if (attempt >= 2)
                    throw Error(live->url + " now serves " + v.name + " v" + std::to_string(v.version) +
                                ", but the deployment history could not be updated (" + ex.what() +
                                "); run `lathectl deploy " + v.name + ":" + std::to_string(v.version) +
                                "` again to record it");
                std::this_thread::sleep_for(std::chrono::seconds(1));
            }
        }
        result.deployment = d;
        say(o, v.name + " v" + std::to_string(v.version) + " is live at " + d.url);
        return result;
    }
    if (live) {
        // Recorded as live but its process is gone: it died, or the machine restarted. A record
        // without a nonce is treated the same, whatever runs under its pid (see isServerOf).
        if (live->target == "local" && live->instance.empty()) {
            registry.endDeployment(live->id, kLegacyEnd);
            if (mayBeLegacyServer(*live))
                say(o, legacyAdvice(*live) + "; until then it keeps " + live->url +
                           (o.port == 0 ? ", and the new server takes another port" : ""));
        } else {
            registry.endDeployment(live->id, "server not running");
        }
        result.previousVersion = live->version;
    }
    if (o.serverProgram.empty()) throw ConfigError("deploy needs the path of lathectl to start a server");
    const std::string host = o.host.empty() ? "127.0.0.1" : o.host;
    const bool pickPort = o.port == 0;
    const uint16_t preferred = live && portOf(live->url) ? portOf(live->url) : 8500;
    auto freePort = [&](uint32_t from) -> uint16_t {
        for (uint32_t p = from; p < from + 100 && p <= 65535; ++p)
            if (portFree(host, static_cast<uint16_t>(p))) return static_cast<uint16_t>(p);
        throw Error("no free port from " + std::to_string(from) + " upwards; pass --port");
    };
    uint16_t port = o.port;
    if (pickPort)
        port = freePort(preferred);
    else if (!portFree(host, port))
        throw Error("port " + std::to_string(port) + " on " + host +
                    " is in use; choose another with --port");
    const auto dir = fs::path(Store::filesDirFor(registry.workspacePath())) / "deployments";
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
    d.instance = token;
    // The server's control token is in the workspace before the server exists (a hot swap must
    // find it), and forgotten again unless the deployment is recorded.
    const std::string secret = controlToken();
    registry.storeDeploymentToken(token, secret);
    ForgetUnlessRecorded forget{registry, token};
    // Another program (or another deploy) may take a free port between our check and the
    // server's bind: then the server exits saying so, and a picked port moves on.
    for (int attempt = 0;; ++attempt) {
        const auto logPath = (dir / (v.name + "-" + std::to_string(static_cast<int64_t>(nowSeconds())) + "-" +
                                     std::to_string(port) + ".log"))
                                 .string();
        std::vector<std::string> args{o.serverProgram, "serve",
                                      "--db",          registry.workspacePath(),
                                      "--model",       v.name + ":" + std::to_string(v.version),
                                      "--host",        host,
                                      "--port",        std::to_string(port),
                                      "--instance-id", token,
                                      "--watch"};
        args.insert(args.end(), o.serverArgs.begin(), o.serverArgs.end());
        say(o, "starting a server on " + host + ":" + std::to_string(port) + " (log " + logPath + ")");
        const int64_t pid = spawnDetached(args, logPath, {"LATHE_SERVER_TOKEN=" + secret});
        d.url = "http://" + host + ":" + std::to_string(port);
        d.pid = pid;
        d.logPath = logPath;
        bool retry = false;
        // Whatever goes wrong from here until the deployment is recorded (a timeout, a failed
        // request, a busy workspace) stops the server: none runs without a record.
        try {
            const auto deadline =
                std::chrono::steady_clock::now() + std::chrono::duration<double>(o.readyTimeoutS);
            for (;;) {
                if (!alive(pid)) {
                    const auto tail = logTail(logPath);
                    if (pickPort && attempt < 5 && port < 65535 && tail.find("in use") != std::string::npos) {
                        port = freePort(uint32_t{port} + 1);
                        retry = true;
                        break;
                    }
                    throw Error("the server for " + v.name + " exited before it was ready; its log " +
                                logPath + " ends:" + tail);
                }
                // Ours (not another server that answers on this port), ready, and serving the version.
                if (serverInstance(d.url) == token && deploymentUp(d, 1.0) &&
                    servedVersion(d.url, v.name, 2) == v.version)
                    break;
                if (std::chrono::steady_clock::now() > deadline)
                    throw Error("the server for " + v.name + " was not ready within " +
                                seconds(o.readyTimeoutS) + " s; stopped it. Log " + logPath + ":" +
                                logTail(logPath));
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
            if (!retry) d.id = registry.recordDeployment(d);
        } catch (...) {
            stopStarted(pid, v.name, token);
            throw;
        }
        if (!retry) break;
    }
    forget.recorded = true;
    result.deployment = d;
    result.started = true;
    say(o, v.name + " v" + std::to_string(v.version) + " is live at " + d.url + " (pid " +
               std::to_string(d.pid) + ")");
    return result;
}

void checkTimeout(const DeployOptions& o) {
    if (!std::isfinite(o.readyTimeoutS) || !(o.readyTimeoutS > 0))
        throw ConfigError("--ready-timeout must be a positive number of seconds, got " +
                          seconds(o.readyTimeoutS));
}

}  // namespace

namespace deploy_detail {

std::unique_ptr<FileLock> lockModel(const Registry& registry, const std::string& model) {
    checkModelName(model);
    return std::make_unique<FileLock>(
        (fs::path(Store::filesDirFor(registry.workspacePath())) / "deployments" / (model + ".lock")).string(),
        true);
}
std::map<std::string, std::string> controlHeaders(const std::string& token) {
    return core::controlHeaders(token);
}
int64_t spawnDetached(const std::vector<std::string>& args, const std::string& logPath) {
    return core::spawnDetached(args, logPath);
}
bool remoteTarget(const std::string& target) { return core::remoteTarget(target); }
std::string placeOf(const std::string& target) { return core::placeOf(target); }
int64_t servedVersion(const std::string& url, const std::string& model, double timeoutS) {
    return core::servedVersion(url, model, timeoutS);
}

}  // namespace deploy_detail

bool watchDeployment(Registry& registry, const std::string& model, const std::string& instance,
                     const AlertRules& rules, const std::atomic<bool>& stop, const ServerHostFor& hostFor) {
    checkModelName(model);
    if (instance.empty() || instance.size() > 64 ||
        !std::all_of(instance.begin(), instance.end(), [](unsigned char c) { return std::isalnum(c); }))
        throw ConfigError("--instance must be a deployment's instance id (letters and digits)");
    FileLock lock((fs::path(Store::filesDirFor(registry.workspacePath())) / "deployments" /
                   ("watch-" + instance + ".lock"))
                      .string(),
                  false);
    if (!lock.held()) return false;
    auto current = [&] {
        const auto live = registry.liveDeployment(model);
        return live && live->instance == instance ? live : std::nullopt;
    };
    std::optional<Deployment> live;
    for (int attempt = 0;; ++attempt) {  // a workspace busy with the deploy that started us
        try {
            live = current();
            break;
        } catch (const std::exception&) {
            if (attempt >= 20 || stop.load()) throw;
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
        }
    }
    if (!live) return true;
    Scraper scraper(registry, model, live->url, rules);
    scraper.setServerHosts(hostFor);
    scraper.start();
    auto next = std::chrono::steady_clock::now();
    while (!stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (std::chrono::steady_clock::now() < next) continue;
        next = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        try {
            if (!current()) break;         // undeployed, or replaced by another server
        } catch (const std::exception&) {  // a busy workspace: look again in a second
        }
    }
    scraper.stop();
    return true;
}

Deployment forgetDeployment(Registry& registry, const std::string& model) {
    const auto lock = modelLock(registry, model);
    const auto live = registry.liveDeployment(model);
    if (!live) throw ConfigError(model + " is not deployed");
    registry.endDeployment(live->id, "forgotten: its server was not stopped");
    for (const auto& a : registry.alerts(model))
        if (a.resolvedAt == 0) registry.resolveAlert(a.id, nowSeconds());
    return *live;
}

bool deploymentUp(const Deployment& d, double timeoutS) {
    try {
        return httpRequest("GET", d.url + "/v2/health/ready", {}, timeoutS).status == 200;
    } catch (const Error&) {
        return false;
    }
}

namespace {

// A rollout under way whose controller is gone (this machine restarted, or it was killed) would
// sit unjudged with its split lost: after a deploy or rollback of its model the controller runs
// again, to put the split back on a new server of the baseline or to end the rollout that another
// version replaced. Called without the model's lock (the controller takes it).
void restartRolloutController(Registry& registry, const std::string& model, const DeployOptions& o) {
    if (o.serverProgram.empty()) return;
    try {
        RolloutOptions ro;
        ro.actor = o.actor;
        ro.controllerProgram = o.serverProgram;
        ro.hostFor = o.hostFor;
        ro.progress = o.progress;
        ensureRolloutController(registry, model, ro);
    } catch (const std::exception& ex) {
        say(o, std::string("the rollout of ") + model + " has no controller (" + ex.what() +
                   "): start it with `lathectl rollout resume " + model + "`");
    }
}

// The version before the live one, deployed again (the model's lock is held).
DeployResult rollbackLocked(Registry& registry, const std::string& model, const DeployOptions& options) {
    const auto history = registry.deployments(model);  // newest first
    if (history.empty() || !history.front().live())
        throw ConfigError(model + " is not deployed; nothing to roll back (see `lathectl deployments " +
                          model + "`)");
    const auto current = history.front().version;
    // Like `kubectl rollout undo`: the version that served before the live one, so a second
    // rollback undoes the first.
    for (size_t i = 1; i < history.size(); ++i) {
        const auto version = history[i].version;
        if (version == current) continue;
        DeployOptions o = options;
        o.action = "rollback";
        if (o.reason.empty()) o.reason = "rollback from v" + std::to_string(current);
        const ModelRef ref{model, version, {}};
        return deployLocked(registry, registry.resolve(ref), ref, o);
    }
    throw ConfigError(model + " has no earlier version in its deployment history to roll back to (live: v" +
                      std::to_string(current) + ")");
}

}  // namespace

DeployResult deploy(Registry& registry, const ModelRef& ref, const DeployOptions& o) {
    checkTimeout(o);
    const auto v = registry.resolve(ref);
    DeployResult result;
    {
        const auto lock = modelLock(registry, v.name);
        result = deployLocked(registry, v, ref, o);
    }
    restartRolloutController(registry, v.name, o);
    return result;
}

DeployResult rollback(Registry& registry, const std::string& model, const DeployOptions& options) {
    checkTimeout(options);
    DeployResult result;
    {
        const auto lock = modelLock(registry, model);
        result = rollbackLocked(registry, model, options);
    }
    restartRolloutController(registry, model, options);
    return result;
}

std::string rollbackOnAlert(Registry& registry, const std::string& model, const std::string& alert,
                            double withinS, const ServerHostFor& hostFor) {
    const auto live = registry.liveDeployment(model);
    if (!live) return {};
    const double age = nowSeconds() - live->startedAt;
    if (age > withinS) return {};  // not right after a deploy: the alert is only recorded
    const std::string which = model + " v" + std::to_string(live->version);
    if (live->action == "rollback")
        return which + " is a rollback already; the alert (" + alert + ") does not roll back again";
    if (registry.activeRollout(model)) return {};  // the rollout's controller judges the candidate
    DeployOptions o;
    o.actor = "auto";
    o.reason = "alert " + std::to_string(static_cast<int>(age)) + " s after v" +
               std::to_string(live->version) + " was deployed: " + alert;
    o.serverProgram = executablePath();
    o.hostFor = hostFor;
    try {
        const auto r = rollback(registry, model, o);
        return "automatic rollback of " + which + " to v" + std::to_string(r.deployment.version) + ": " +
               alert;
    } catch (const std::exception& ex) {
        return "automatic rollback of " + which + " failed: " + ex.what();
    }
}

void undeploy(Registry& registry, const std::string& model, const ServerHostFor& hostFor) {
    const auto lock = modelLock(registry, model);
    const auto live = registry.liveDeployment(model);
    if (!live) throw ConfigError(model + " is not deployed");
    if (remoteTarget(live->target)) {
        // A host that cannot be reached throws here: the record stays live (its server may run).
        if (!hostFor)
            throw ConfigError(model + " runs on " + placeOf(live->target) +
                              ", which this program cannot reach");
        const std::string forget =
            " (to end the deployment without stopping its server: lathectl undeploy " + model + " --forget)";
        try {
            hostFor(live->target)->stopServer(live->pid, live->instance);
        } catch (const ConfigError& ex) {
            throw ConfigError(ex.what() + forget);
        } catch (const Error& ex) {
            throw Error(ex.what() + forget);
        }
        registry.endDeployment(live->id, "undeployed");
        for (const auto& a : registry.alerts(model))
            if (a.resolvedAt == 0) registry.resolveAlert(a.id, nowSeconds());
        return;
    }
    const bool legacy = live->target == "local" && live->instance.empty();
    if (live->target == "local" && isServerOf(*live)) {
        const auto pid = static_cast<pid_t>(live->pid);
        ::kill(pid, SIGTERM);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (alive(pid) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (alive(pid)) ::kill(pid, SIGKILL);
    }
    registry.endDeployment(live->id, legacy ? std::string("undeployed; ") + kLegacyEnd : "undeployed");
    // A server that stopped cleanly resolved its open alerts itself; one that was killed could not.
    for (const auto& a : registry.alerts(model))
        if (a.resolvedAt == 0) registry.resolveAlert(a.id, nowSeconds());
    // The record is ended either way; what may still run is the user's to stop, and they are told.
    if (legacy && mayBeLegacyServer(*live)) throw Error(legacyAdvice(*live));
}

}  // namespace lathe::core
