#pragma once
// TCP port probing on this machine (ports.cpp): the launcher's rendezvous port and deploy's
// choice of a server port.
#include <cstdint>
#include <string>

namespace lathe::core {

/// A port the kernel has just handed out on 127.0.0.1 (bound to port 0, then released). Throws Error.
int ephemeralLoopbackPort();

/// Whether `port` can be bound on `host` (an IPv4 address; anything else means loopback) now.
bool portFree(const std::string& host, uint16_t port);

}  // namespace lathe::core
