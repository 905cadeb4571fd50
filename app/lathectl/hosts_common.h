#pragma once
// The workspace's host inventory as the commands that use it see it (cmd_hosts.cpp).
#include "lathe/core/store.h"
#include "lathe/remote/host_spec.h"

namespace lathe::cli {

// How to reach an inventory host. Only what the record sets is set: the rest stays at
// HostSpec's defaults (ssh config, port, known_hosts, timeout). Throws UsageError for an address
// that does not parse.
remote::HostSpec specFor(const core::HostRecord& h);

}  // namespace lathe::cli
