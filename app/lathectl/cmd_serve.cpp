// lathectl serve / deploy / rollback / undeploy / deployments.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "hosts_common.h"
#include "lathe/core/deploy.h"
#include "lathe/core/executable.h"
#include "lathe/core/http_client.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/monitor.h"
#include "lathe/core/registry.h"
#include "lathe/core/scraper.h"
#include "lathe/core/server.h"
#include "lathe/remote/server_host.h"

namespace fs = std::filesystem;

namespace lathe::cli {
namespace {

struct ServeState {
    CommonOptions common;
    std::string model;
    std::string file;
    std::string name;
    std::string inputShape;
    core::ServeOptions options;
    bool watch = false;
    std::string alertRules;
    std::string tokenFile;
    int64_t fileVersion = 0;  // --version of a --file
    std::string sha256;       // --sha256 of a --file
};

struct DeployState {
    CommonOptions common;
    std::string ref;
    uint16_t port = 0;
    std::string host;  // empty: 127.0.0.1 for a new server, a live one keeps its own
    std::string reason;
    int64_t maxBatch = 0;
    double maxDelayMs = -1;
    std::string batching;
    int64_t maxQueue = 0;
    int instances = 0;
    double readyTimeout = 60;
    std::string alertRules;
};

struct WatchState {
    CommonOptions common;
    std::string model;
    std::string instance;
    std::string alertRules;
};

// The control token (ServeOptions::controlToken) of `lathectl serve`: from $LATHE_SERVER_TOKEN,
// taken once and wiped from this process's environment (its bytes too, which
// /proc/PID/environ would still show), so that nothing the server starts inherits it; or from
// --token-file, which no other user may read. Never a command-line value: `ps` shows those to
// every user. Messages name the file, never its contents.
std::string takeControlToken(const std::string& tokenFile) {
    std::string fromEnv;
    if (char* v = std::getenv("LATHE_SERVER_TOKEN")) {
        fromEnv = v;
        std::memset(v, 0, std::strlen(v));
        ::unsetenv("LATHE_SERVER_TOKEN");
    }
    if (tokenFile.empty()) return fromEnv;
    if (!fromEnv.empty())
        throw UsageError("give the control token through LATHE_SERVER_TOKEN or --token-file, not both");
    const int fd = ::open(tokenFile.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw UsageError("--token-file " + tokenFile + ": " + std::strerror(errno));
    struct FdCloser {
        int fd;
        ~FdCloser() { ::close(fd); }
    } closer{fd};
    struct stat info {};
    if (::fstat(fd, &info) != 0) throw UsageError("--token-file " + tokenFile + ": " + std::strerror(errno));
    if (!S_ISREG(info.st_mode)) throw UsageError("--token-file " + tokenFile + " is not a regular file");
    if (info.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
        throw UsageError("--token-file " + tokenFile + " is open to other users (mode " + mode +
                         "); a token file must be private: chmod 600 " + tokenFile);
    }
    if (info.st_uid != ::geteuid())
        throw UsageError("--token-file " + tokenFile +
                         " belongs to another user; a token file must be the server's own");
    constexpr size_t kMax = 4096 + 2;  // the longest token and a line end
    std::string token(kMax + 1, '\0');
    size_t got = 0;
    for (ssize_t n; got < token.size() && (n = ::read(fd, token.data() + got, token.size() - got)) != 0;) {
        if (n < 0) {
            if (errno == EINTR) continue;
            throw UsageError("--token-file " + tokenFile + ": " + std::strerror(errno));
        }
        got += static_cast<size_t>(n);
    }
    if (got > kMax)
        throw UsageError("--token-file " + tokenFile + " is longer than a token (4096 characters)");
    token.resize(got);
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
    if (token.empty()) throw UsageError("--token-file " + tokenFile + " is empty");
    return token;
}

void runServe(ServeState& st, int& exitCode) {
    // First, before anything can start a process that would inherit it.
    st.options.controlToken = takeControlToken(st.tokenFile);
    const bool hasToken = !st.options.controlToken.empty();
    if (st.model.empty() == st.file.empty())
        throw UsageError("give exactly one of --model NAME[:V|@ALIAS] and --file MODEL.pt");
    if (!st.model.empty() && (st.fileVersion != 0 || !st.sha256.empty()))
        throw UsageError("--version and --sha256 describe a --file; a registered model has its own");
    std::string privateCopyDir;  // a --file's copy with metadata: removed however serving ends
    struct RemoveDir {
        const std::string& dir;
        ~RemoveDir() {
            std::error_code ec;
            if (!dir.empty()) fs::remove_all(dir, ec);
        }
    } removeCopy{privateCopyDir};
    core::ServedModel served;
    std::unique_ptr<core::Registry> registry;
    if (!st.model.empty()) {
        registry = openRegistry(st.common);
        const auto v = registry->resolve(core::parseModelRef(st.model));
        served = {v.name, v.version, v.path};
        st.options.workspace = registry->workspacePath();
    } else {
        if (st.watch) throw UsageError("--watch records into the registry: serve with --model and --db");
        served.name = st.name.empty() ? fs::path(st.file).stem().string() : st.name;
        served.path = st.file;
        served.version = st.fileVersion;
        if (!st.sha256.empty() &&
            (st.sha256.size() != 64 || !std::all_of(st.sha256.begin(), st.sha256.end(), [](unsigned char c) {
                 return std::isxdigit(c) && !std::isupper(c);
             })))
            throw UsageError("--sha256 must be the file's SHA-256: 64 lower-case hex digits");
        try {
            core::readArtifact(st.file);
        } catch (const core::ConfigError& ex) {
            if (st.inputShape.empty())
                throw core::ConfigError(std::string(ex.what()) + "; or serve it as it is with --input-shape");
            // A plain TorchScript file: give it Lathe metadata in a private copy, in a directory
            // of our own (mkdtemp: no other user can plant a link there), removed when serving ends.
            std::string dir = (fs::temp_directory_path() / "lathe-serve-XXXXXX").string();
            if (!::mkdtemp(dir.data()))
                throw core::Error("cannot create a temporary directory in " +
                                  fs::temp_directory_path().string());
            privateCopyDir = dir;
            const auto tmp = (fs::path(dir) / "model.pt").string();
            core::importTorchScript(st.file, parseShape(st.inputShape), tmp);
            served.path = tmp;
        }
    }
    core::InferenceServer server(st.options);  // keeps only the token's digest
    std::fill(st.options.controlToken.begin(), st.options.controlToken.end(), '\0');
    st.options.controlToken.clear();
    std::fprintf(stderr, "loading %s v%lld from %s\n", served.name.c_str(),
                 static_cast<long long>(served.version), served.path.c_str());
    server.load(served, st.sha256);  // says on stderr which graph it runs (--optimize)
    const auto port = server.start();
    const std::string url = "http://" + st.options.host + ":" + std::to_string(port);
    std::printf(
        "serving %s v%lld at %s (%s batching, max batch %lld, max delay %g ms, queue %lld rows, %d I/O "
        "threads, %d instance%s)\n",
        served.name.c_str(), static_cast<long long>(served.version), url.c_str(), st.options.batching.c_str(),
        static_cast<long long>(st.options.maxBatch), st.options.maxDelayMs,
        static_cast<long long>(st.options.maxQueue), st.options.ioThreads, st.options.instances,
        st.options.instances == 1 ? "" : "s");
    std::printf("  POST %s/v2/models/%s/infer   GET %s/metrics\n", url.c_str(), served.name.c_str(),
                url.c_str());
    std::printf("  control API (/v2/repository: load, hot swap): %s\n",
                hasToken ? "needs the bearer token"
                : core::isLoopbackHost(st.options.host)
                    ? "open to this machine (loopback only, no token)"
                    : "refused: listening beyond loopback without a token "
                      "(LATHE_SERVER_TOKEN or --token-file)");
    std::fflush(stdout);
    std::unique_ptr<core::Scraper> scraper;
    if (st.watch) {
        core::AlertRules rules;
        if (!st.alertRules.empty()) {
            std::ifstream in(st.alertRules);
            if (!in) throw UsageError("cannot read --alert-rules " + st.alertRules);
            std::stringstream buf;
            buf << in.rdbuf();
            rules = core::alertRulesFromToml(buf.str());
        }
        scraper = std::make_unique<core::Scraper>(*registry, served.name, url, rules);
        scraper->start();
    }
    auto& stop = installStopHandler();
    server.runUntil(stop);
    if (scraper) scraper->stop();
    removeStopHandler();
    std::fprintf(stderr, "server stopped\n");
    exitCode = kOk;
}

void printDeployment(const core::DeployResult& r, bool json) {
    const auto& d = r.deployment;
    if (json) {
        std::cout << nlohmann::json{{"model", d.model},
                                    {"version", d.version},
                                    {"url", d.url},
                                    {"pid", d.pid},
                                    {"action", d.action},
                                    {"target", d.target},
                                    {"started_server", r.started},
                                    {"previous_version", r.previousVersion},
                                    {"log", d.logPath},
                                    {"id", d.id}}
                         .dump()
                  << std::endl;
        return;
    }
    std::printf("%s v%lld live at %s%s%s\n", d.model.c_str(), static_cast<long long>(d.version),
                d.url.c_str(), d.target.rfind("ssh:", 0) == 0 ? (" on " + d.target.substr(4)).c_str() : "",
                r.previousVersion ? (" (was v" + std::to_string(r.previousVersion) + ")").c_str() : "");
}

// --host: a host of the inventory (the server runs there), else the address a server on this
// machine listens on.
std::shared_ptr<core::ServerHost> inventoryHostNamed(const DeployState& st) {
    if (st.host.empty()) return nullptr;
    try {
        core::Store::validateHostName(st.host);
    } catch (const core::ConfigError&) {
        return nullptr;  // "::1" and the like: an address
    }
    const auto rec = openStore(st.common)->host(st.host);
    if (rec) return remote::sshServerHost(rec->name, specFor(*rec), rec->lathectl);
    in_addr v4{};
    in6_addr v6{};
    if (::inet_pton(AF_INET, st.host.c_str(), &v4) != 1 && ::inet_pton(AF_INET6, st.host.c_str(), &v6) != 1)
        throw UsageError(
            "--host " + st.host +
            ": no such host in the workspace (lathectl hosts list shows them, lathectl hosts add "
            "adds one), and not an IP address for a server on this machine to listen on");
    return nullptr;
}

core::DeployOptions deployOptions(const DeployState& st) {
    core::DeployOptions o;
    o.port = st.port;
    o.on = inventoryHostNamed(st);
    if (!o.on) o.host = st.host;
    o.hostFor = inventoryHosts(st.common.db);
    o.serverProgram = core::executablePath();
    o.reason = st.reason;
    o.readyTimeoutS = st.readyTimeout;
    if (st.maxBatch > 0)
        o.serverArgs.insert(o.serverArgs.end(), {"--max-batch", std::to_string(st.maxBatch)});
    if (st.maxDelayMs >= 0)
        o.serverArgs.insert(o.serverArgs.end(), {"--max-delay-ms", std::to_string(st.maxDelayMs)});
    if (!st.batching.empty()) o.serverArgs.insert(o.serverArgs.end(), {"--batching", st.batching});
    if (st.maxQueue > 0)
        o.serverArgs.insert(o.serverArgs.end(), {"--max-queue", std::to_string(st.maxQueue)});
    if (st.instances > 0)
        o.serverArgs.insert(o.serverArgs.end(), {"--instances", std::to_string(st.instances)});
    if (!st.alertRules.empty()) {
        if (!fs::is_regular_file(st.alertRules)) throw UsageError("--alert-rules: no file " + st.alertRules);
        std::ifstream in(st.alertRules);
        std::stringstream buf;
        buf << in.rdbuf();
        core::alertRulesFromToml(buf.str());  // refuse a bad file here, not in the detached server
        o.serverArgs.insert(o.serverArgs.end(), {"--alert-rules", fs::absolute(st.alertRules).string()});
    }
    if (!st.common.json) o.progress = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
    return o;
}

void addDeployFlags(CLI::App* c, DeployState& st) {
    c->add_option("--port", st.port,
                  "port of a new server (default: the model's last port, else 8500 or the next free)");
    c->add_option("--host", st.host,
                  "where a new server runs: a host of the workspace (lathectl hosts list; the model is "
                  "copied there and served on the address this machine reaches it at), else the address "
                  "a server on this machine listens on (default 127.0.0.1). Its control API needs the "
                  "deployment's own token, which the workspace keeps and deploy/rollback send");
    c->add_option("--reason", st.reason, "why (recorded in the deployment history)");
    c->add_option("--max-batch", st.maxBatch, "a new server's --max-batch");
    c->add_option("--max-delay-ms", st.maxDelayMs, "a new server's --max-delay-ms");
    c->add_option("--batching", st.batching, "a new server's --batching (adaptive or fixed)")
        ->check(CLI::IsMember({"adaptive", "fixed"}));
    c->add_option("--max-queue", st.maxQueue, "a new server's --max-queue");
    c->add_option("--instances", st.instances, "a new server's --instances")->check(CLI::Range(1, 64));
    c->add_option("--ready-timeout", st.readyTimeout, "seconds to wait for the server to become ready");
    c->add_option("--alert-rules", st.alertRules, "a new server's alert thresholds (TOML; see README)");
    addCommonOptions(c, st.common);
}

void runDeployments(const CommonOptions& common, const std::string& model) {
    auto registry = openRegistry(common);
    const auto list = model.empty() ? registry->allDeployments() : registry->deployments(model);
    if (common.json) {
        auto a = nlohmann::json::array();
        for (const auto& d : list)
            a.push_back({{"id", d.id},
                         {"model", d.model},
                         {"version", d.version},
                         {"url", d.url},
                         {"pid", d.pid},
                         {"action", d.action},
                         {"target", d.target},
                         {"actor", d.actor},
                         {"reason", d.reason},
                         {"started_at", d.startedAt},
                         {"ended_at", d.endedAt},
                         {"end_reason", d.endReason},
                         {"live", d.live()},
                         {"up", d.live() && core::deploymentUp(d)},
                         {"log", d.logPath}});
        std::cout << a.dump() << std::endl;
        return;
    }
    if (list.empty()) {
        std::printf("no deployments%s\n", model.empty() ? "" : (" of " + model).c_str());
        return;
    }
    std::printf("%-5s %-16s %-5s %-9s %-14s %-19s %-19s %-6s %s\n", "ID", "MODEL", "VER", "ACTION", "ACTOR",
                "FROM", "TO", "STATE", "URL / REASON");
    for (const auto& d : list) {
        const char* state = !d.live() ? "ended" : core::deploymentUp(d) ? "UP" : "DOWN";
        std::string note = d.url;
        if (d.target.rfind("ssh:", 0) == 0) note += " on " + d.target.substr(4);
        if (!d.reason.empty()) note += "  " + d.reason;
        if (!d.endReason.empty()) note += "  [" + d.endReason + "]";
        std::printf("%-5lld %-16.16s %-5s %-9s %-14.14s %-19s %-19s %-6s %s\n", static_cast<long long>(d.id),
                    d.model.c_str(), ("v" + std::to_string(d.version)).c_str(), d.action.c_str(),
                    d.actor.c_str(), formatTime(d.startedAt).c_str(),
                    d.live() ? "-" : formatTime(d.endedAt).c_str(), state, note.c_str());
    }
}

}  // namespace

// Reaches the host of a deployment recorded as "ssh:NAME" through the workspace's inventory.
core::ServerHostFor inventoryHosts(const std::string& db) {
    return [db](const std::string& target) -> std::shared_ptr<core::ServerHost> {
        if (target.rfind("ssh:", 0) != 0)
            throw core::ConfigError("unknown deployment target '" + target + "'");
        const std::string name = target.substr(4);
        CommonOptions opts;
        opts.db = db;
        const auto rec = openStore(opts)->host(name);
        if (!rec)
            throw core::ConfigError("the deployment runs on host '" + name +
                                    "', which is no longer in the workspace's hosts; add it again (lathectl "
                                    "hosts add " +
                                    name + " --address ...) to reach its server");
        return remote::sshServerHost(name, specFor(*rec), rec->lathectl);
    };
}

void registerServe(CLI::App& app, int& exitCode) {
    auto st = std::make_shared<ServeState>();
    auto* s =
        app.add_subcommand("serve", "serve a model over HTTP (KServe v2 protocol) with dynamic batching");
    s->add_option("--model", st->model, "registered model: NAME, NAME:V or NAME@ALIAS (with --db)");
    s->add_option("--file", st->file, "a model artifact or TorchScript file instead of the registry");
    s->add_option("--name", st->name, "URL name for --file (default: the file name)");
    s->add_option("--input-shape", st->inputShape,
                  "one sample's shape for a plain TorchScript --file, e.g. 64");
    s->add_option("--version", st->fileVersion,
                  "the version a --file is served as (GET /v2/models/NAME; default: none)")
        ->check(CLI::PositiveNumber);
    s->add_option("--sha256", st->sha256,
                  "the SHA-256 a --file must have (a copy on another host): a different file is refused");
    s->add_option("--host", st->options.host, "address to listen on")->capture_default_str();
    s->add_option("--port", st->options.port, "port (0 = any free one)")->capture_default_str();
    s->add_option("--max-batch", st->options.maxBatch, "rows per batch")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    s->add_option("--max-delay-ms", st->options.maxDelayMs,
                  "longest wait of the oldest request for a fuller batch")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 10000.0));
    s->add_option("--batching", st->options.batching,
                  "adaptive: an idle instance runs what is queued at once, requests wait for company only "
                  "while every instance is busy (low latency at light load, full batches under load); "
                  "fixed: a batch waits until it has --max-batch rows or its oldest request has waited "
                  "--max-delay-ms")
        ->capture_default_str()
        ->check(CLI::IsMember({"adaptive", "fixed"}));
    s->add_option("--max-queue", st->options.maxQueue, "rows waiting before requests get 503")
        ->capture_default_str();
    s->add_option("--threads", st->options.ioThreads, "HTTP I/O threads")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    s->add_option("--instances", st->options.instances,
                  "batches computed at once, each by its own worker on its own batch buffer (like Triton's "
                  "instance_group count): more than 1 pays off with cores to spare or with small batches")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    s->add_option("--device", st->options.device,
                  "where batches run: auto (a CUDA GPU when there is one), cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    s->add_option(
         "--optimize", st->options.optimize,
         "on a CPU, freeze the model and apply TorchScript's inference optimisations (linear layers fused "
         "and their weights transposed once, conv-bn folding): auto keeps them when the outputs agree, a "
         "max-batch forward is at least 5% faster and a 1-row one no more than 5% slower; on keeps them "
         "whenever the outputs agree; auto and on also pad batches to sizes whose forward is at least 15% "
         "faster (timed at load, max-batch <= 64); off serves the model as loaded, every batch at its size")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "on", "off"}));
    s->add_option(
        "--compute-threads", st->options.computeThreads,
        "LibTorch and OpenBLAS threads of each instance (0 = the cores the I/O threads leave, shared out "
        "among the instances, at least 1)");
    s->add_option("--max-body", st->options.maxBodyBytes, "largest request body in bytes")
        ->capture_default_str();
    s->add_option("--timeout", st->options.idleTimeoutS, "seconds a client may take to send a request")
        ->capture_default_str();
    s->add_option("--instance-id", st->options.instance,
                  "an identifier echoed by GET /v2 (set by lathectl deploy)");
    s->add_option("--token-file", st->tokenFile,
                  "file holding the control token that /v2/repository requests (load, hot swap, unload) "
                  "must send as `Authorization: Bearer TOKEN`; it must not be open to other users (chmod "
                  "600). Or set LATHE_SERVER_TOKEN (read once, then removed from the environment); never "
                  "on the command line. Without a token the control API answers only on a loopback "
                  "--host (127.0.0.1, ::1) and is refused (403) beyond it; inference, health and /metrics "
                  "never need one. lathectl deploy gives each server a token of its own");
    s->add_flag("--watch", st->watch,
                "scrape this server's metrics into the workspace every second and run alert rules");
    s->add_option("--alert-rules", st->alertRules, "TOML file of alert thresholds (with --watch)");
    addCommonOptions(s, st->common, false);
    s->callback([st, &exitCode] { runServe(*st, exitCode); });

    auto dep = std::make_shared<DeployState>();
    auto* d =
        app.add_subcommand("deploy", "deploy NAME[:V|@ALIAS]: start a local server or hot-swap the live one");
    d->add_option("REF", dep->ref, "NAME, NAME:V or NAME@ALIAS")->required();
    addDeployFlags(d, *dep);
    d->callback([dep] {
        auto registry = openRegistry(dep->common);
        printDeployment(core::deploy(*registry, core::parseModelRef(dep->ref), deployOptions(*dep)),
                        dep->common.json);
    });

    auto rb = std::make_shared<DeployState>();
    auto* r = app.add_subcommand("rollback", "return NAME to the version deployed before the live one");
    r->add_option("NAME", rb->ref, "model name")->required();
    addDeployFlags(r, *rb);
    r->callback([rb] {
        auto registry = openRegistry(rb->common);
        core::checkModelName(rb->ref);
        printDeployment(core::rollback(*registry, rb->ref, deployOptions(*rb)), rb->common.json);
    });

    auto un = std::make_shared<DeployState>();
    auto forget = std::make_shared<bool>(false);
    auto* u = app.add_subcommand("undeploy", "stop NAME's server and end its deployment");
    u->add_option("NAME", un->ref, "model name")->required();
    u->add_flag("--forget", *forget,
                "end the deployment without reaching its server (its host is gone for good); the "
                "server, if it still runs, is left running");
    addCommonOptions(u, un->common, false);
    u->callback([un, forget] {
        auto registry = openRegistry(un->common);
        core::checkModelName(un->ref);
        if (*forget) {
            const auto d = core::forgetDeployment(*registry, un->ref);
            std::printf("%s forgotten; its server (%s, pid %lld%s) was not stopped%s\n", un->ref.c_str(),
                        d.url.c_str(), static_cast<long long>(d.pid),
                        d.target.rfind("ssh:", 0) == 0 ? (" on " + d.target.substr(4)).c_str() : "",
                        d.instance.empty()
                            ? ""
                            : ("; if it still runs, stop it with pkill -f " + d.instance).c_str());
            return;
        }
        core::undeploy(*registry, un->ref, inventoryHosts(un->common.db));
        std::printf("%s undeployed\n", un->ref.c_str());
    });

    auto watch = std::make_shared<WatchState>();
    auto* w = app.add_subcommand("watch",
                                 "scrape a deployment on another host into the workspace until it ends "
                                 "(deploy starts it)");
    w->group("");  // started by deploy, not by hand
    w->add_option("--model", watch->model, "model name")->required();
    w->add_option("--instance", watch->instance, "the deployment's instance id")->required();
    w->add_option("--alert-rules", watch->alertRules, "TOML file of alert thresholds");
    addCommonOptions(w, watch->common, false);
    w->callback([watch] {
        core::AlertRules rules;
        if (!watch->alertRules.empty()) {
            std::ifstream in(watch->alertRules);
            if (!in) throw UsageError("cannot read --alert-rules " + watch->alertRules);
            std::stringstream buf;
            buf << in.rdbuf();
            rules = core::alertRulesFromToml(buf.str());
        }
        auto registry = openRegistry(watch->common);
        auto& stop = installStopHandler();
        const bool watched = core::watchDeployment(*registry, watch->model, watch->instance, rules, stop,
                                                   inventoryHosts(watch->common.db));
        removeStopHandler();
        std::fprintf(stderr, watched ? "watch of %s ended\n" : "%s is watched already\n",
                     watch->model.c_str());
    });

    auto hist = std::make_shared<DeployState>();
    auto* h = app.add_subcommand("deployments",
                                 "deployment history (of NAME, or all) and whether live ones are up");
    h->add_option("NAME", hist->ref, "model name");
    addCommonOptions(h, hist->common);
    h->callback([hist] { runDeployments(hist->common, hist->ref); });
}

}  // namespace lathe::cli
