// SshSession over libssh. Host keys are checked against an explicitly named known_hosts
// file (libssh would otherwise read the passwd home's file, not $HOME's), ~/.ssh/config is read
// for what the HostSpec leaves open (parsed before the spec's own fields are set, so those win),
// and libssh never logs (it could print key paths and protocol details nobody asked for).

#include "lathe/remote/ssh_session.h"

#include "session_access.h"

#include <libssh/callbacks.h>
#include <libssh/libssh.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

namespace lathe::remote {

namespace {

std::string homeDir() {
    if (const char* home = std::getenv("HOME"); home && *home) return home;
    if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) return pw->pw_dir;
    return "/";
}

std::string expandTilde(const std::string& path) {
    if (path == "~") return homeDir();
    if (path.rfind("~/", 0) == 0) return homeDir() + path.substr(1);
    return path;
}

bool contains(const std::string& haystack, const char* needle) {
    return haystack.find(needle) != std::string::npos;
}

// Asked for a key's passphrase: refuse. Without a callback, libssh hands OpenSSL a null one, and
// OpenSSL then prompts on the controlling terminal, blocking a command (or a GUI started from a
// terminal) until someone types there.
int refusePassphrase(const char*, char*, size_t, int, int, void*) { return -1; }

struct KeyDeleter {
    void operator()(ssh_key k) const noexcept { ssh_key_free(k); }
};
using KeyPtr = std::unique_ptr<std::remove_pointer_t<ssh_key>, KeyDeleter>;

struct ChannelDeleter {
    void operator()(ssh_channel c) const noexcept {
        if (ssh_channel_is_open(c)) ssh_channel_close(c);
        ssh_channel_free(c);
    }
};
using ChannelPtr = std::unique_ptr<std::remove_pointer_t<ssh_channel>, ChannelDeleter>;

}  // namespace

struct SshSession::Impl {
    HostSpec spec;
    ssh_session session = nullptr;
    bool connected = false;
    std::string fingerprint;
    ssh_callbacks_struct sessionCallbacks{};  // lives as long as the session that points at it

    explicit Impl(HostSpec s) : spec(std::move(s)) {}
    ~Impl() { close(); }

    std::string label() const { return spec.label(); }
    std::string libsshError() const { return session ? ssh_get_error(session) : "no session"; }

    void close() noexcept {
        if (session) {
            if (connected) ssh_disconnect(session);
            ssh_free(session);
        }
        session = nullptr;
        connected = false;
    }

    template <typename T>
    void setOption(ssh_options_e option, const T* value, const char* what) {
        if (ssh_options_set(session, option, value) != SSH_OK)
            throw SshError(SshError::Kind::Usage, label(),
                           std::string("invalid ") + what + ": " + libsshError());
    }

    void configure() {
        // A HostSpec built in code (not by parseHostSpec) is checked the same way: libssh would
        // read "alice@gpu" as a user and a host, changing the login and the known_hosts entry.
        if (spec.host.empty() || spec.host.find_first_of(" \t/@") != std::string::npos)
            throw SshError(
                SshError::Kind::Usage, label(),
                "invalid host name '" + spec.host + "' (no spaces, '/' or '@'; give the user separately)");
        if (spec.port < 0 || spec.port > 65535)
            throw SshError(SshError::Kind::Usage, label(), "invalid port " + std::to_string(spec.port));
        session = ssh_new();
        if (!session)
            throw SshError(SshError::Kind::Usage, label(), "cannot create an SSH session (out of memory)");
        const int verbosity = SSH_LOG_NOLOG;
        const bool processConfig = false;  // ssh_connect() must not parse it again over our options
        const long timeout = spec.connectTimeoutSec > 0 ? spec.connectTimeoutSec : 10;
        const std::string sshDir = homeDir() + "/.ssh";
        const std::string knownHosts =
            spec.knownHostsFile.empty() ? sshDir + "/known_hosts" : expandTilde(spec.knownHostsFile);
        setOption(SSH_OPTIONS_LOG_VERBOSITY, &verbosity, "log level");
        setOption(SSH_OPTIONS_PROCESS_CONFIG, &processConfig, "config option");
        setOption(SSH_OPTIONS_SSH_DIR, sshDir.c_str(), "ssh directory");
        setOption(SSH_OPTIONS_HOST, spec.host.c_str(), "host name");
        // The config file first: what it says for this Host (HostName, Port, User, IdentityFile,
        // ProxyJump) fills in; the spec's own fields, set after it, override.
        if (spec.sshConfigFile != "none") {
            const std::string config =
                spec.sshConfigFile.empty() ? sshDir + "/config" : expandTilde(spec.sshConfigFile);
            struct stat st {};
            if (::stat(config.c_str(), &st) == 0) {
                if (ssh_options_parse_config(session, config.c_str()) != SSH_OK)
                    throw SshError(SshError::Kind::Usage, label(),
                                   "cannot use ssh config " + config + ": " + libsshError());
            } else if (!spec.sshConfigFile.empty()) {
                throw SshError(SshError::Kind::Usage, label(), "ssh config " + config + " does not exist");
            }
        }
        if (spec.port > 0) {
            const unsigned int port = static_cast<unsigned int>(spec.port);
            setOption(SSH_OPTIONS_PORT, &port, "port");
        }
        setOption(SSH_OPTIONS_TIMEOUT, &timeout, "timeout");
        setOption(SSH_OPTIONS_KNOWNHOSTS, knownHosts.c_str(), "known_hosts path");
        if (!spec.user.empty()) setOption(SSH_OPTIONS_USER, spec.user.c_str(), "user name");
        sessionCallbacks = {};
        sessionCallbacks.auth_function = refusePassphrase;
        ssh_callbacks_init(&sessionCallbacks);
        ssh_set_callbacks(session, &sessionCallbacks);
    }

    // A host that vanishes without a reset (powered off, a dropped link) would otherwise look like
    // a quiet command until TCP gives up, many minutes later. The kernel probes an idle
    // connection instead (after 15 s, then every 5 s, 4 times) and bounds unacknowledged data to
    // 45 s; either ends the connection, which exec() reports as lost. Unlike an SSH keepalive
    // request, this never blocks the caller waiting for a reply.
    void watchConnection() {
        const int fd = ssh_get_fd(session);
        if (fd < 0) return;
        const int on = 1, idle = 15, interval = 5, count = 4;
        const unsigned int userTimeoutMs = 45000;
        ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
        ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
        ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeoutMs, sizeof userTimeoutMs);
    }

    void openConnection() {
        if (ssh_connect(session) == SSH_OK) {
            watchConnection();
            return;
        }
        const std::string err = libsshError();
        const auto kind = contains(err, "imeout") || contains(err, "timed out") ? SshError::Kind::Timeout
                                                                                : SshError::Kind::Connect;
        if (kind == SshError::Kind::Timeout)
            throw SshError(kind, label(),
                           "no answer within " +
                               std::to_string(spec.connectTimeoutSec > 0 ? spec.connectTimeoutSec : 10) +
                               " s (" + err + ")");
        throw SshError(kind, label(), "cannot connect: " + err);
    }

    // The host as known_hosts names it: "name", or "[name]:port" off port 22 (after the config).
    std::string knownHostsName() const {
        char* host = nullptr;
        std::string name = spec.host;
        if (ssh_options_get(session, SSH_OPTIONS_HOST, &host) == SSH_OK && host) {
            name = host;
            ssh_string_free_char(host);
        }
        unsigned int port = 22;
        ssh_options_get_port(session, &port);
        return port == 22 ? name : "[" + name + "]:" + std::to_string(port);
    }

    std::string serverFingerprint(std::string* keyType) {
        ssh_key raw = nullptr;
        if (ssh_get_server_publickey(session, &raw) != SSH_OK || !raw)
            throw HostKeyError(HostKeyError::Reason::Unusable, label(), {},
                               "cannot read the server's host key: " + libsshError());
        KeyPtr key(raw);
        if (keyType) keyType->assign(ssh_key_type_to_char(ssh_key_type(key.get())));
        unsigned char* hash = nullptr;
        size_t hashLen = 0;
        if (ssh_get_publickey_hash(key.get(), SSH_PUBLICKEY_HASH_SHA256, &hash, &hashLen) != SSH_OK)
            throw HostKeyError(HostKeyError::Reason::Unusable, label(), {},
                               "cannot hash the server's host key");
        char* text = ssh_get_fingerprint_hash(SSH_PUBLICKEY_HASH_SHA256, hash, hashLen);
        ssh_clean_pubkey_hash(&hash);
        std::string out = text ? text : "";
        ssh_string_free_char(text);
        return out;
    }

    void verifyHostKey(HostKeyPolicy policy) {
        std::string keyType;
        fingerprint = serverFingerprint(&keyType);
        char* khPath = nullptr;
        ssh_options_get(session, SSH_OPTIONS_KNOWNHOSTS, &khPath);
        const std::string knownHosts = khPath ? khPath : "known_hosts";
        ssh_string_free_char(khPath);

        switch (ssh_session_is_known_server(session)) {
            case SSH_KNOWN_HOSTS_OK:
                return;
            case SSH_KNOWN_HOSTS_CHANGED:
                throw HostKeyError(HostKeyError::Reason::Changed, label(), fingerprint,
                                   "host key differs from the one in " + knownHosts + " (server offered " +
                                       keyType + " " + fingerprint +
                                       "); someone may be intercepting the connection, or the host was "
                                       "reinstalled; if so, remove its old line: ssh-keygen -R '" +
                                       knownHostsName() + "' -f " + knownHosts);
            case SSH_KNOWN_HOSTS_OTHER:
                throw HostKeyError(HostKeyError::Reason::Other, label(), fingerprint,
                                   "known_hosts " + knownHosts +
                                       " lists a different key type for this host (server "
                                       "offered " +
                                       keyType + " " + fingerprint + ")");
            case SSH_KNOWN_HOSTS_NOT_FOUND:
            case SSH_KNOWN_HOSTS_UNKNOWN:
                if (policy != HostKeyPolicy::TrustOnFirstUse)
                    throw HostKeyError(
                        HostKeyError::Reason::Unknown, label(), fingerprint,
                        "host key " + keyType + " " + fingerprint + " is not in " + knownHosts +
                            "; compare it with the host's own (ssh-keygen -lf on the host), then "
                            "add it with lathectl hosts trust HOST (it shows the key and asks)");
                if (ssh_session_update_known_hosts(session) != SSH_OK)
                    throw HostKeyError(
                        HostKeyError::Reason::Unusable, label(), fingerprint,
                        "cannot add host key " + fingerprint + " to " + knownHosts + ": " + libsshError());
                return;
            case SSH_KNOWN_HOSTS_ERROR:
            default:
                throw HostKeyError(
                    HostKeyError::Reason::Unusable, label(), fingerprint,
                    "cannot check host key " + fingerprint + " against " + knownHosts + ": " + libsshError());
        }
    }

    std::string userName() const {
        char* user = nullptr;
        if (ssh_options_get(session, SSH_OPTIONS_USER, &user) != SSH_OK || !user) return spec.user;
        std::string out = user;
        ssh_string_free_char(user);
        return out;
    }

    void authenticate() {
        const std::string user = userName();
        int rc = SSH_AUTH_ERROR;
        std::string tried;
        if (!spec.identityFile.empty()) {
            const std::string path = expandTilde(spec.identityFile);
            ssh_key raw = nullptr;
            // No passphrase and no prompt callback: an encrypted key fails here, by design; the
            // way to use one is through ssh-agent with identityFile left empty.
            if (ssh_pki_import_privkey_file(path.c_str(), nullptr, refusePassphrase, nullptr, &raw) !=
                    SSH_OK ||
                !raw)
                throw SshError(SshError::Kind::Auth, label(),
                               "cannot load identity file " + path +
                                   " (missing, unreadable, not a private key, or passphrase-protected; for a "
                                   "protected key, add it to ssh-agent and leave the identity file empty)");
            KeyPtr key(raw);
            rc = ssh_userauth_publickey(session, nullptr, key.get());
            tried = "the key in " + path;
        } else {
            rc = ssh_userauth_publickey_auto(session, nullptr, nullptr);
            tried = "keys from ssh-agent and " + homeDir() + "/.ssh";
        }
        switch (rc) {
            case SSH_AUTH_SUCCESS:
                return;
            case SSH_AUTH_DENIED:
                throw SshError(SshError::Kind::Auth, label(),
                               "authentication failed for user '" + user + "': server rejected " + tried);
            case SSH_AUTH_PARTIAL:
                throw SshError(
                    SshError::Kind::Auth, label(),
                    "authentication for user '" + user +
                        "' needs a further method (e.g. a one-time code), which lathe does not support");
            default:
                throw SshError(SshError::Kind::Auth, label(),
                               "authentication error for user '" + user + "': " + libsshError());
        }
    }

    void connect(HostKeyPolicy policy) {
        close();
        fingerprint.clear();
        try {
            configure();
            openConnection();
            connected = true;  // so close() sends a proper disconnect from here on
            verifyHostKey(policy);
            authenticate();
        } catch (...) {
            close();
            throw;
        }
    }
};

SshSession::SshSession(HostSpec spec) : m_impl(std::make_unique<Impl>(std::move(spec))) {}
SshSession::~SshSession() = default;
SshSession::SshSession(SshSession&&) noexcept = default;
SshSession& SshSession::operator=(SshSession&&) noexcept = default;

void SshSession::connect(HostKeyPolicy policy) {
    if (!m_impl) throw SshError(SshError::Kind::Usage, "?", "connect() on a moved-from session");
    m_impl->connect(policy);
}
bool SshSession::isConnected() const noexcept {
    return m_impl && m_impl->connected && m_impl->session && ssh_is_connected(m_impl->session) != 0;
}
void SshSession::disconnect() noexcept {
    if (m_impl) m_impl->close();
}
const std::string& SshSession::hostKeyFingerprint() const noexcept { return m_impl->fingerprint; }
const HostSpec& SshSession::spec() const noexcept { return m_impl->spec; }

ExecResult SshSession::exec(const std::string& command, const OutputFn& onStdout, const OutputFn& onStderr,
                            const std::atomic<bool>* cancel, double timeoutSec) {
    ExecOptions options;
    options.cancel = cancel;
    options.timeoutSec = timeoutSec;
    return exec(command, onStdout, onStderr, options);
}

std::string SshSession::run(const std::string& command, const std::string& what, double timeoutSec) {
    std::string out, err;
    ExecOptions options;
    options.timeoutSec = timeoutSec;
    const auto res = exec(
        command, [&](std::string_view c) { out.append(c); },
        [&](std::string_view c) {
            if (err.size() < 4096) err.append(c);
        },
        options);
    if (res.exitStatus != 0) {
        std::string first = err.substr(0, err.find('\n'));
        throw SshError(SshError::Kind::Channel, m_impl->label(),
                       what + " failed (" +
                           (res.exitSignal.empty() ? "exit status " + std::to_string(res.exitStatus)
                                                   : "signal " + res.exitSignal) +
                           ")" + (first.empty() ? "" : ": " + first));
    }
    return out;
}

std::string SshSession::peerAddress() const {
    if (!m_impl || !m_impl->session || !m_impl->connected) return {};
    const int fd = ssh_get_fd(m_impl->session);
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return {};
    char host[NI_MAXHOST] = {0};
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&sa), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) !=
        0)
        return {};
    return host;
}

ExecResult SshSession::exec(const std::string& command, const OutputFn& onStdout, const OutputFn& onStderr,
                            const ExecOptions& options) {
    const std::atomic<bool>* cancel = options.cancel;
    const double timeoutSec = options.timeoutSec;
    if (!m_impl) throw SshError(SshError::Kind::Usage, "?", "exec() on a moved-from session");
    Impl& d = *m_impl;
    if (!d.connected)
        throw SshError(SshError::Kind::Usage, d.label(),
                       "not connected: connect() first (again after a lost connection)");

    // Filled in by libssh callbacks while packets are processed on this thread.
    struct Status {
        ExecResult result;
        bool exited = false;
    } status;

    ChannelPtr channel(ssh_channel_new(d.session));
    if (!channel)
        throw SshError(SshError::Kind::Channel, d.label(), "cannot create a channel: " + d.libsshError());

    // Only exit status and signal use callbacks; data stays in libssh's buffers for the reads.
    ssh_channel_callbacks_struct callbacks{};
    callbacks.userdata = &status;
    callbacks.channel_exit_status_function = [](ssh_session, ssh_channel, int exitStatus, void* userdata) {
        auto* st = static_cast<Status*>(userdata);
        st->result.exitStatus = exitStatus;
        st->exited = true;
    };
    callbacks.channel_exit_signal_function = [](ssh_session, ssh_channel, const char* signal, int,
                                                const char*, const char*, void* userdata) {
        auto* st = static_cast<Status*>(userdata);
        st->result.exitSignal = signal ? signal : "";
        st->result.exitStatus = -1;
        st->exited = true;
    };
    ssh_callbacks_init(&callbacks);
    ssh_add_channel_callbacks(channel.get(), &callbacks);
    // libssh keeps a closed channel alive until the server confirms the close, and may then
    // still deliver its late exit-signal/exit-status; the callbacks (and `status`) live on
    // this stack frame, so they must be detached before we return, however we return.
    struct CallbackGuard {
        ssh_channel channel;
        ssh_channel_callbacks cb;
        ~CallbackGuard() { ssh_remove_channel_callbacks(channel, cb); }
    } callbackGuard{channel.get(), &callbacks};

    if (ssh_channel_open_session(channel.get()) != SSH_OK)
        throw SshError(SshError::Kind::Channel, d.label(),
                       "cannot open a session channel: " + d.libsshError());
    if (ssh_channel_request_exec(channel.get(), command.c_str()) != SSH_OK)
        throw SshError(SshError::Kind::Channel, d.label(), "cannot start the command: " + d.libsshError());
    // Whatever ends this call before the command has exited (an exception from a callback or a
    // lost connection, a timeout) asks the remote side to stop it: a command must not run on
    // unwatched. Declared after the callback guard, so it runs before the callbacks go.
    struct StopGuard {
        ssh_channel channel;
        ssh_session session;
        const Status& status;
        ~StopGuard() {
            if (!status.exited && ssh_is_connected(session) != 0 && ssh_channel_is_open(channel))
                ssh_channel_request_send_signal(channel, "TERM");
        }
    } stopGuard{channel.get(), d.session, status};
    // There is no stdin to give: say so at once, so a command that reads it ends instead of
    // hanging. With the lifeline, stdin stays open until this call ends (the channel closes).
    if (!options.keepStdinOpen) ssh_channel_send_eof(channel.get());
    bool interrupted = false;

    const auto broken = [&d](const char* when) {
        const std::string why = d.libsshError();
        d.connected = false;  // isConnected() says so; connect() starts afresh
        return SshError(SshError::Kind::Protocol, d.label(),
                        std::string("connection lost ") + when + ": " + why);
    };

    char buffer[16384];
    const auto drain = [&](int isStderr, const OutputFn& sink) {
        int n;
        while ((n = ssh_channel_read_nonblocking(channel.get(), buffer, sizeof buffer, isStderr)) > 0)
            if (sink) sink(std::string_view(buffer, static_cast<std::size_t>(n)));
        if (n == SSH_ERROR) throw broken("while reading output");
    };

    // One event loop on the session's socket: wait (at most 50 ms, so a cancel is noticed
    // quickly) for any packet, then take whatever either stream has. After the output ends we
    // keep waiting for the exit status: a program may close its output and run on.
    struct Event {
        ssh_event ev;
        ssh_session session;
        ~Event() {
            ssh_event_remove_session(ev, session);
            ssh_event_free(ev);
        }
    };
    Event event{ssh_event_new(), d.session};
    if (!event.ev || ssh_event_add_session(event.ev, d.session) != SSH_OK)
        throw SshError(SshError::Kind::Protocol, d.label(),
                       "cannot watch the connection: " + d.libsshError());

    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto lastHeartbeat = start;
    bool outputEnded = false;
    while (true) {
        // The lifeline's heartbeat: a line every 5 s, so the command can tell a silent network
        // cut (its sshd not noticing) from a quiet launcher.
        if (options.keepStdinOpen && !interrupted && Clock::now() - lastHeartbeat > std::chrono::seconds(5)) {
            lastHeartbeat = Clock::now();
            if (ssh_channel_is_open(channel.get()) && ssh_channel_write(channel.get(), "\n", 1) == SSH_ERROR)
                throw broken("while writing to the command's stdin");
        }
        // Output and completion first: a command that has finished reports its real result even
        // when a cancel or the deadline arrives at the same moment.
        drain(0, onStdout);
        drain(1, onStderr);
        if (!outputEnded && ssh_channel_is_eof(channel.get())) outputEnded = true;
        if (outputEnded && (status.exited || ssh_channel_is_closed(channel.get()))) break;
        if (!status.exited && ssh_is_connected(d.session) == 0) throw broken("while the command was running");
        if (!interrupted && options.interrupt && options.interrupt->load(std::memory_order_relaxed)) {
            interrupted = true;
            ssh_channel_request_send_signal(channel.get(), "TERM");
            if (options.keepStdinOpen) ssh_channel_send_eof(channel.get());
        }
        if (cancel && cancel->load(std::memory_order_relaxed)) {
            // OpenSSH (>= 7.9) delivers this with killpg, so the shell's children stop too. It
            // refuses signals for root logins (no privilege separation there); then the command
            // only loses its channel and ends when it next writes output (SIGPIPE).
            ssh_channel_request_send_signal(channel.get(), "TERM");
            ssh_channel_close(channel.get());
            status.result.cancelled = true;
            status.result.exitStatus = -1;
            return status.result;
        }
        if (timeoutSec > 0 && Clock::now() - start > std::chrono::duration<double>(timeoutSec))
            throw SshError(SshError::Kind::Timeout, d.label(),
                           "the command did not finish within " +
                               std::to_string(static_cast<int64_t>(timeoutSec)) + " s; it was sent SIGTERM");
        if (ssh_event_dopoll(event.ev, 50) == SSH_ERROR) throw broken("while waiting for output");
    }
    return status.result;
}

namespace detail {
ssh_session SessionAccess::native(SshSession& s) {
    if (!s.m_impl || !s.m_impl->connected)
        throw SshError(SshError::Kind::Usage, s.m_impl ? s.m_impl->label() : "?",
                       "not connected: connect() first (again after a lost connection)");
    return s.m_impl->session;
}
void SessionAccess::markLost(SshSession& s) noexcept {
    if (s.m_impl) s.m_impl->connected = false;
}
std::string SessionAccess::label(const SshSession& s) { return s.m_impl ? s.m_impl->label() : "?"; }
std::string SessionAccess::error(const SshSession& s) {
    return s.m_impl ? s.m_impl->libsshError() : "no session";
}
}  // namespace detail

}  // namespace lathe::remote
