#pragma once
// Deploy, roll back and undeploy registered models. A local deployment is a detached
// `lathectl serve` process (it outlives the command or GUI that started it) whose pid, URL and log
// are recorded in the workspace; deploying to a model that already has a live server hot-swaps the
// version through the server's repository API instead of restarting it. Remote targets (SSH) will
// sit beside the local launcher behind the same functions.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lathe/core/registry.h"

namespace lathe::core {

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
void undeploy(Registry& registry, const std::string& model);
/// Whether a deployment's server answers /v2/health/ready now.
bool deploymentUp(const Deployment& d, double timeoutS = 1.0);

}  // namespace lathe::core
