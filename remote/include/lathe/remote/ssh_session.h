#pragma once
// One authenticated SSH connection to one host, for running commands with streamed output.
// libssh stays behind the pimpl: including this header pulls in no libssh headers.
//
// Not thread-safe: use a session from one thread at a time. Cancellation comes from any
// thread through the std::atomic<bool> passed to exec().

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "lathe/remote/errors.h"
#include "lathe/remote/host_spec.h"

namespace lathe::remote {

// What to do with a host key that known_hosts does not list yet. A key that *differs* from
// the listed one is always refused, whatever the policy.
enum class HostKeyPolicy {
    Strict,           // refuse: HostKeyError(Reason::Unknown)
    TrustOnFirstUse,  // append the key to knownHostsFile and continue
};

struct ExecResult {
    int exitStatus = -1;     // the command's exit status; -1 if it died by a signal or was cancelled
    std::string exitSignal;  // "TERM", "KILL", ... when the remote process was killed by a signal
    bool cancelled = false;  // the cancel flag was raised; the remote command was sent SIGTERM
};

// Receives output as it arrives, in chunks of arbitrary size (not split at line ends).
using OutputFn = std::function<void(std::string_view chunk)>;

struct ExecOptions {
    // Raised (from any thread): stop waiting within ~50 ms; the command's process group is sent
    // SIGTERM, the channel is closed and the result says cancelled.
    const std::atomic<bool>* cancel = nullptr;
    // Raised (from any thread): the command is sent SIGTERM and its stdin ends (the lifeline, for
    // a root login whose signals OpenSSH ignores); exec() goes on streaming until it exits.
    const std::atomic<bool>* interrupt = nullptr;
    // The lifeline: stdin stays open for as long as exec() runs, so a command that watches it
    // (lathectl worker --lifeline) ends when this side goes away: the call returns, the
    // connection drops, or this process is killed. Otherwise stdin is at EOF from the start.
    bool keepStdinOpen = false;
    // > 0: past it the command is sent SIGTERM and SshError (Kind::Timeout) is thrown.
    double timeoutSec = 0;
};

namespace detail {
struct SessionAccess;
}

class SshSession {
public:
    explicit SshSession(HostSpec spec);
    ~SshSession();
    SshSession(SshSession&&) noexcept;
    SshSession& operator=(SshSession&&) noexcept;
    SshSession(const SshSession&) = delete;
    SshSession& operator=(const SshSession&) = delete;

    // Connects, verifies the server's host key against the known_hosts file and authenticates
    // with the identity file (or ssh-agent and the default keys). Blocks for at most about
    // connectTimeoutSec per network step. Throws HostKeyError or SshError; on failure the
    // session stays disconnected and connect() may be called again.
    void connect(HostKeyPolicy policy = HostKeyPolicy::Strict);
    bool isConnected() const noexcept;
    void disconnect() noexcept;

    // SHA256 fingerprint of the server's host key ("SHA256:…"); empty before connect().
    const std::string& hostKeyFingerprint() const noexcept;
    const HostSpec& spec() const noexcept;

    // Runs `command` through the remote user's shell (no terminal; stdin is at EOF) and returns
    // when it has exited and all its output has been delivered. Output is passed to the
    // callbacks (either may be empty) on the calling thread as it arrives. Raising *cancel
    // stops waiting within ~50 ms: the command's process group is sent SIGTERM, the channel is
    // closed and the result has cancelled = true. (OpenSSH ignores signal requests when logged
    // in as root; such a command only loses its output channel and dies when it next writes.)
    // `timeoutSec` > 0 bounds the whole call: past it the command is sent SIGTERM and SshError
    // (Kind::Timeout) is thrown. TCP keepalive probes end a connection to a host that vanished
    // (within about 35 s idle, 45 s with data unacknowledged). Throws SshError
    // if the channel cannot be opened or the connection breaks; then isConnected() is false.
    // Any exit before the command has ended sends it SIGTERM.
    ExecResult exec(const std::string& command, const OutputFn& onStdout = {}, const OutputFn& onStderr = {},
                    const std::atomic<bool>* cancel = nullptr, double timeoutSec = 0);
    // The same with every option (ExecOptions).
    ExecResult exec(const std::string& command, const OutputFn& onStdout, const OutputFn& onStderr,
                    const ExecOptions& options);

    // Runs `command`, returns its stdout; throws SshError (Kind::Channel) naming `what` and the
    // first stderr line when it exits non-zero. For short probes: bounded by `timeoutSec`.
    std::string run(const std::string& command, const std::string& what, double timeoutSec = 60);

    // The numeric address of the host at the other end of this connection ("10.0.0.7"): what
    // this machine reaches it at, after the ssh config and name resolution. Empty before connect().
    std::string peerAddress() const;

private:
    friend struct detail::SessionAccess;
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

}  // namespace lathe::remote
