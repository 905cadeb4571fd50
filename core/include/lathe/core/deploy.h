#pragma once
// Deploy, roll back and undeploy registered models. A local deployment is a detached
// `lathectl serve` process (it outlives the command or GUI that started it) whose pid, URL and log
// are recorded in the workspace; deploying to a model that already has a live server hot-swaps the
// version through the server's repository API instead of restarting it. A deployment on another
// host runs the same server there, started and stopped through a ServerHost (over SSH:
// lathe::remote::sshServerHost), with the artifact copied there and checked.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/monitor.h"
#include "lathe/core/registry.h"

namespace lathe::core {

/// Where a server runs when it is not this machine: how to put a model there, start, recognise
/// and stop its server. Every call may throw Error (the host cannot be reached: nothing is
/// decided about its server then).
class ServerHost {
public:
    virtual ~ServerHost() = default;
    /// The deployment's recorded target, "ssh:NAME".
    virtual std::string target() const = 0;
    /// The address the server listens on and clients reach it at.
    virtual std::string address() = 0;
    /// A TCP port free on all of the host's addresses (of address()'s family) now.
    virtual uint16_t freePort() = 0;
    /// The artifact's path there, copied if it is not there yet (SHA-256 checked).
    virtual std::string stageArtifact(const std::string& localPath, const std::string& sha256) = 0;
    /// Starts `lathectl serve` with `serveArgs` there, detached (it outlives the connection), with
    /// `token` as its control token by a private file, never its command line. Returns its pid
    /// there; `logPath` receives the path of its log there.
    virtual int64_t startServer(const std::vector<std::string>& serveArgs, const std::string& token,
                                std::string& logPath) = 0;
    /// The server has read its token: the file goes.
    virtual void serverStarted(const std::string& instance) = 0;
    /// Whether `pid` there is ours and the `lathectl serve` with this --instance-id.
    virtual bool isServer(int64_t pid, const std::string& instance) = 0;
    /// SIGTERM to that server (only if it is it), then SIGKILL after 10 s to any process of ours
    /// there with this --instance-id (`pid` 0: its start did not say).
    virtual void stopServer(int64_t pid, const std::string& instance) = 0;
    /// The last lines of a log there.
    virtual std::string logTail(const std::string& logPath) = 0;
};

/// Reaches the host of a recorded target ("ssh:gpu-a"); throws Error when it is unknown.
using ServerHostFor = std::function<std::shared_ptr<ServerHost>(const std::string& target)>;

struct DeployOptions {
    uint16_t port = 0;          // 0 = the model's current port, else 8500 (or the next free one)
    std::string host;           // a new server's address; empty = 127.0.0.1 (a live server keeps its own)
    std::string serverProgram;  // path of lathectl (required to start a server)
    std::vector<std::string> serverArgs;  // extra `lathectl serve` flags (--max-batch 16 ...)
    std::string actor = "user";
    std::string action = "deploy";  // recorded; rollback() sets "rollback"
    std::string reason;
    double readyTimeoutS = 60;
    std::function<void(const std::string&)> progress;  // human-readable steps
    /// A new server's host; empty: this machine.
    std::shared_ptr<ServerHost> on;
    /// Reaches the host of a live deployment elsewhere (hot swap, rollback).
    ServerHostFor hostFor;
};

struct DeployResult {
    Deployment deployment;
    bool started = false;  // a new server process was started (else hot swap)
    int64_t previousVersion = 0;
};

/// Resolves `ref`, then starts a server or hot-swaps the live one, waits until /v2/health/ready
/// and the served version are right, and records the deployment. On failure nothing is recorded
/// and a running server keeps its old version. Throws Error/NotFoundError.
DeployResult deploy(Registry& registry, const ModelRef& ref, const DeployOptions& options);
/// Deploys the version that served before the live one (action "rollback"). Throws Error when
/// there is no earlier version in the history.
DeployResult rollback(Registry& registry, const std::string& model, const DeployOptions& options);
/// Stops the model's server (SIGTERM, then SIGKILL after 10 s) and ends its deployment. Only a
/// process that is the deployment's own `lathectl serve` (executable, `serve`, --instance-id) is
/// signalled. A record without an instance id (older workspaces) is ended without signalling
/// anything; when its pid still runs something that looks like its server, Error says how to stop
/// it by hand (after the record was ended).
void undeploy(Registry& registry, const std::string& model, const ServerHostFor& hostFor = {});
/// Ends `model`'s live deployment without reaching its server (a host gone for good, removed
/// from the inventory): its record ends as "forgotten", its token is dropped, its alerts resolve.
/// Returns the record as it was, for saying where the server may still run. Throws ConfigError
/// when nothing is deployed.
Deployment forgetDeployment(Registry& registry, const std::string& model);
/// Scrapes the live deployment `instance` of `model` into the workspace (as `lathectl serve --watch`
/// does for a server on this machine: the dashboard's metrics, alerts) until `stop` is raised or
/// that deployment ends (undeployed, or replaced by another server). What `lathectl watch` runs
/// for a server on another host, started by deploy. Returns false at once when another watcher
/// has this instance. Throws ConfigError for a bad model name or instance id. `hostFor` reaches the
/// server's host when an alert rule rolls it back.
bool watchDeployment(Registry& registry, const std::string& model, const std::string& instance,
                     const AlertRules& rules, const std::atomic<bool>& stop,
                     const ServerHostFor& hostFor = {});
/// What an alert rule with `action = "rollback"` does when its alert fires: rolls `model` back to
/// the version before the live one (actor "auto", the alert as the reason) when the live
/// deployment began less than `withinS` ago, is not a rollback itself (so it happens once and
/// never flaps between two versions) and no rollout is under way (its controller judges then).
/// Returns one line saying what happened or why nothing did; empty when the rule does not apply.
/// `hostFor` reaches a deployment on another host (without it, only local ones roll back).
std::string rollbackOnAlert(Registry& registry, const std::string& model, const std::string& alert,
                            double withinS, const ServerHostFor& hostFor = {});
/// Whether a deployment's server answers /v2/health/ready now.
bool deploymentUp(const Deployment& d, double timeoutS = 1.0);

}  // namespace lathe::core
