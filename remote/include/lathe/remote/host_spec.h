#pragma once
// Where to reach a remote host and how to authenticate to it.

#include <string>
#include <string_view>

namespace lathe::remote {

// Fields left empty (or 0) come from the ssh client configuration, as with `ssh HOST`: a Host
// block of ~/.ssh/config may give HostName, Port, User, IdentityFile and ProxyJump (libssh 0.10
// turns ProxyJump into `ssh -W`); set fields win over it.
struct HostSpec {
    std::string host;            // a name, an address, or a Host alias of the ssh config
    int port = 0;                // 0: the ssh config's, else 22
    std::string user;            // empty: the ssh config's, else the local user name
    std::string identityFile;    // private key; empty: the ssh config's IdentityFile, ssh-agent, ~/.ssh keys
    std::string knownHostsFile;  // empty: ~/.ssh/known_hosts (from $HOME, not the passwd home)
    std::string sshConfigFile;   // empty: ~/.ssh/config (when it exists); "none": no config file
    int connectTimeoutSec = 10;

    // How messages name the host: "gpu-2", "127.0.0.2:2222", "[::1]:2222" (the port only when set and not
    // 22).
    std::string label() const;
    // "user@host:port" in the form parseHostSpec() reads (user and port only when set/non-22).
    std::string toString() const;
};

// Parses "[user@]host[:port]"; an IPv6 address with a port goes in brackets ("[::1]:2222");
// an unbracketed address with several colons is taken as an IPv6 host without a port. Without a
// port, port stays 0 (the ssh config's, else 22). Other fields keep their defaults. Throws
// std::invalid_argument with a message naming the input, e.g. "host spec 'gpu:99999': port must be a number
// from 1 to 65535".
HostSpec parseHostSpec(std::string_view text);

}  // namespace lathe::remote
