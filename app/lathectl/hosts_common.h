#pragma once
// The workspace's host inventory as the commands that use it see it (cmd_hosts.cpp).
#include "lathe/core/deploy.h"
#include "lathe/core/store.h"
#include "lathe/remote/host_spec.h"

namespace lathe::cli {

// How to reach an inventory host. Only what the record sets is set: the rest stays at
// HostSpec's defaults (ssh config, port, known_hosts, timeout). Throws UsageError for an address
// that does not parse.
remote::HostSpec specFor(const core::HostRecord& h);

/// Reaches the host of a deployment recorded as "ssh:NAME" through the workspace `db`'s
/// inventory (cmd_serve.cpp).
core::ServerHostFor inventoryHosts(const std::string& db);

}  // namespace lathe::cli
