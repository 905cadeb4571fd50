#pragma once
// Deployments on another host: core::ServerHost over SSH. The artifact goes by SFTP (SHA-256
// checked), the server starts detached (`setsid`) so it outlives the connection, its control
// token reaches it as a private file (mode 0600, removed once it has been read), and it is only
// ever signalled after its /proc entry shows it is the deployment's own `lathectl serve`.

#include <memory>
#include <string>

#include "lathe/core/deploy.h"
#include "lathe/remote/host_spec.h"

namespace lathe::remote {

// `name`: the workspace's host name (the target is "ssh:NAME"); `lathectl`: its lathectl there
// (empty: the one on its PATH). Connects on first use, with strict host-key checking.
std::shared_ptr<core::ServerHost> sshServerHost(const std::string& name, const HostSpec& spec,
                                                const std::string& lathectl);

}  // namespace lathe::remote
