#pragma once
// Typed failures of remote operations. Messages start with "host <label>: " and say what
// happened in words a user can act on; they never contain key material or passphrases.

#include <stdexcept>
#include <string>

namespace lathe::remote {

class SshError : public std::runtime_error {
public:
    enum class Kind {
        Connect,   // name resolution failed, connection refused, network unreachable
        Timeout,   // no answer within connectTimeoutSec
        HostKey,   // see HostKeyError
        Auth,      // no key accepted, identity file unusable
        Channel,   // opening a session or starting a command failed
        Protocol,  // the connection broke or the server misbehaved mid-session
        Transfer,  // an SFTP upload or download failed or arrived different (size, SHA-256)
        Usage,     // the API was misused (e.g. exec() before connect())
    };

    SshError(Kind kind, std::string host, const std::string& what)
        : std::runtime_error("host " + host + ": " + what), m_kind(kind), m_host(std::move(host)) {}

    Kind kind() const noexcept { return m_kind; }
    // The host label as in HostSpec::label().
    const std::string& host() const noexcept { return m_host; }

private:
    Kind m_kind;
    std::string m_host;
};

// The server's host key could not be verified against known_hosts.
class HostKeyError : public SshError {
public:
    enum class Reason {
        Unknown,   // no entry for this host (and trust-on-first-use was not requested)
        Changed,   // an entry exists with a different key: possible man-in-the-middle
        Other,     // an entry exists for another key type only
        Unusable,  // known_hosts could not be read or the server key could not be obtained
    };

    HostKeyError(Reason reason, std::string host, std::string fingerprint, const std::string& what)
        : SshError(Kind::HostKey, std::move(host), what),
          m_reason(reason),
          m_fingerprint(std::move(fingerprint)) {}

    Reason reason() const noexcept { return m_reason; }
    // "SHA256:<base64>", as `ssh-keygen -l -E sha256` prints it; empty when unavailable.
    const std::string& fingerprint() const noexcept { return m_fingerprint; }

private:
    Reason m_reason;
    std::string m_fingerprint;
};

}  // namespace lathe::remote
