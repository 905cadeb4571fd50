#pragma once
// A real OpenSSH sshd on a loopback address, started for one test and stopped (RAII) when the
// fixture goes out of scope. Everything it needs (host key, client keys, authorized_keys,
// config, pid file, log) lives in a private temporary directory.

#include <sys/types.h>
#include <string>
#include <vector>

#include "lathe/remote/host_spec.h"

namespace lathe::remote::test {

// A directory under /tmp removed with its contents at destruction.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return m_path; }
    std::string file(const std::string& name) const { return m_path + "/" + name; }

private:
    std::string m_path;
};

// A TCP port on `address` that nothing listens on right now.
int freePort(const char* address);

// Runs a shell command, returning its exit status; stdout goes to *out when given.
int runCommand(const std::string& command, std::string* out = nullptr);

std::string readFile(const std::string& path);
void writeFile(const std::string& path, const std::string& text);

// The local user's name (sshd runs as us, so this is who we log in as).
std::string currentUser();

class SshdServer {
public:
    static constexpr const char* kAddress = "127.0.0.2";

    // Empty when a server can be started here, else why not (for LATHE_SKIP).
    static std::string unavailableReason();

    // Listens on `address` (a loopback address such as 127.0.0.2 or 127.0.0.3).
    explicit SshdServer(std::string address = kAddress);
    ~SshdServer();
    SshdServer(const SshdServer&) = delete;
    SshdServer& operator=(const SshdServer&) = delete;

    int port() const { return m_port; }
    const std::string& address() const { return m_address; }
    // The host's public key line ("ssh-ed25519 AAAA… comment") for a known_hosts entry.
    std::string hostPublicKey() const;
    // The sshd processes serving this server's connections (one per connection, children of
    // the listener): killing one drops that connection as a network failure would.
    std::vector<int> connectionPids() const;
    const TempDir& dir() const { return m_dir; }
    // The host key's fingerprint according to ssh-keygen: "SHA256:…".
    const std::string& hostKeyFingerprint() const { return m_fingerprint; }
    std::string clientKey() const { return m_dir.file("client_ed25519"); }
    std::string wrongKey() const { return m_dir.file("wrong_ed25519"); }
    std::string knownHosts() const { return m_dir.file("known_hosts"); }
    std::string log() const { return readFile(m_dir.file("sshd.log")); }

    // Host, port, user, identity and a (not yet existing) known_hosts file for this server.
    HostSpec spec() const;

private:
    void start();
    void stop() noexcept;

    TempDir m_dir;
    std::string m_address;
    int m_port = 0;
    pid_t m_pid = -1;
    std::string m_fingerprint;
};

}  // namespace lathe::remote::test
