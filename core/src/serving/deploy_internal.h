#pragma once
// What deploy.cpp shares with the rollout controller (rollout.cpp): the per-model lock every
// change of a deployment takes, control requests' headers, detached processes. Private to core.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/registry.h"
#include "workspace/file_lock.h"

namespace lathe::core::deploy_detail {

/// The lock of one model's deploys, rollbacks, undeploys and rollout steps, across processes
/// (waits for another holder).
std::unique_ptr<FileLock> lockModel(const Registry& registry, const std::string& model);
/// `Authorization: Bearer` for a server's control API; none for a server without a token.
std::map<std::string, std::string> controlHeaders(const std::string& token);
/// Starts `args` detached (double fork, setsid), stdout and stderr to `logPath`; returns its pid.
int64_t spawnDetached(const std::vector<std::string>& args, const std::string& logPath);
/// Whether a deployment's target is another host ("ssh:NAME").
bool remoteTarget(const std::string& target);
/// "host gpu-a" / "this machine".
std::string placeOf(const std::string& target);
/// The version the server at `url` serves under `model` (0: no answer, or not that model).
int64_t servedVersion(const std::string& url, const std::string& model, double timeoutS);

}  // namespace lathe::core::deploy_detail
