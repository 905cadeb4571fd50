// The SSH launcher: checks every host, stages the run's files, starts one `lathectl worker --lifeline`
// per slot over its own SSH channel and hands them to core::superviseRanks, the supervisor local
// runs use; rank 0's checkpoints come back by SFTP as they are written.
#include "lathe/remote/launcher.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "lathe/core/checkpoint.h"
#include "lathe/core/error.h"
#include "lathe/core/executable.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/sha256.h"
#include "lathe/remote/sftp.h"
#include "lathe/remote/ssh_session.h"

namespace fs = std::filesystem;

namespace lathe::remote {

namespace {

constexpr const char* kStageRoot = ".cache/lathe/stage";
constexpr const char* kRunRoot = ".cache/lathe/runs";

std::string hostUnameOs() {
    std::string out;
    if (FILE* p = ::popen("uname -s; uname -m", "r")) {
        char buf[256];
        while (std::fgets(buf, sizeof buf, p)) out += buf;
        ::pclose(p);
    }
    return out;
}

// A path as a shell word; a leading "~/" becomes "$HOME"/… so the remote shell expands it.
std::string shellPath(const std::string& path) {
    if (path.rfind("~/", 0) == 0) return "\"$HOME\"/" + shellQuote(path.substr(2));
    return shellQuote(path);
}

std::map<std::string, std::string> keyValues(const std::string& text) {
    std::map<std::string, std::string> kv;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
        const auto eq = line.find('=');
        if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return kv;
}

// The directory of liblathe_core.so: the libraries a staged lathectl takes along.
std::string ownLibraryDir() {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&core::sha256File), &info) == 0 || !info.dli_fname) return {};
    std::error_code ec;
    const auto p = fs::canonical(info.dli_fname, ec);
    return ec ? std::string() : p.parent_path().string();
}

struct Staging {
    std::string program;  // local lathectl
    std::string tag;      // version + digest prefix: one directory per distinct build
    std::vector<std::string> libraries;
    std::string os;  // "Linux\nx86_64\n" of this machine
};

Staging stagingFor(const RemoteLaunchOptions& o) {
    Staging s;
    s.program = o.localProgram.empty() ? core::siblingProgram("lathectl") : o.localProgram;
    std::string version = o.expectedVersion;
    for (char& c : version)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.') c = '-';
    s.tag = version + "-" + core::sha256File(s.program).substr(0, 12);
    if (const auto dir = ownLibraryDir(); !dir.empty())
        for (const char* lib : {"liblathe_core.so", "liblathe_torch.so"})
            if (fs::exists(dir + "/" + lib)) s.libraries.push_back(dir + "/" + lib);
    s.os = hostUnameOs();
    return s;
}

// Remote commands are POSIX sh, run through `sh -c` so that a login shell that is not (csh,
// fish) only has to pass one quoted word on.
std::string posixShell(const std::string& command) { return "sh -c " + shellQuote(command); }

std::string probeCommand(const RemoteHost& h, const std::string& stageTag) {
    std::string c =
        "echo \"os=$(uname -s)\"; echo \"arch=$(uname -m)\"; echo \"cores=$(nproc 2>/dev/null)\"; ";
    c += h.lathectl.empty() ? "p=$(command -v lathectl 2>/dev/null); " : "p=" + shellPath(h.lathectl) + "; ";
    c += "if [ -n \"$p\" ] && [ -x \"$p\" ]; then echo \"lathectl=$p\"; "
         "echo \"version=$(\"$p\" --version 2>&1 | head -n 1)\"; fi; ";
    const std::string stage = std::string("\"$HOME\"/") + kStageRoot + "/" + shellQuote(stageTag);
    c +=
        "s=" + stage +
        "/bin/lathectl; if [ -x \"$s\" ]; then echo \"staged=$s\"; echo \"staged_version=$(LD_LIBRARY_PATH=" +
        stage + "/lib \"$s\" --version 2>&1 | head -n 1)\"; fi; true";
    return posixShell(c);
}

struct HostState {
    RemoteHost host;
    std::unique_ptr<SshSession> control;  // checks, transfers and clean-up
    HostReport report;
    std::string libraryPath;  // LD_LIBRARY_PATH for a staged lathectl
    int firstRank = 0;
};

void checkOne(HostState& h, const RemoteLaunchOptions& o, const Staging& staging) {
    HostReport& r = h.report;
    r.name = h.host.name;
    const std::string who =
        "host " + h.host.name + (h.host.name == h.host.spec.label() ? "" : " (" + h.host.spec.label() + ")");
    try {
        h.control = std::make_unique<SshSession>(h.host.spec);
        h.control->connect(HostKeyPolicy::Strict);
        r.hostKey = h.control->hostKeyFingerprint();
        r.address = h.control->peerAddress();
        if (r.address.empty()) {  // reached through a proxy (ProxyJump): ask the host itself
            const std::string own = h.control->run(posixShell("hostname -I 2>/dev/null | cut -d' ' -f1"),
                                                   "asking its address", 30);
            r.address = own.substr(0, own.find_first_of(" \n"));
        }
        if (r.address.empty()) {
            r.problem =
                who + ": cannot tell its network address (through a proxy, and `hostname -I` says nothing)";
            return;
        }
        const auto kv = keyValues(h.control->run(probeCommand(h.host, staging.tag), "the host probe", 60));
        r.os = kv.count("os") ? kv.at("os") : "";
        r.arch = kv.count("arch") ? kv.at("arch") : "";
        try {
            r.cores = kv.count("cores") ? std::stoi(kv.at("cores")) : 0;
        } catch (const std::exception&) {
            r.cores = 0;
        }
        const auto found = kv.find("lathectl");
        const auto version = kv.find("version");
        if (found != kv.end() && version != kv.end() && version->second == o.expectedVersion) {
            r.lathectl = found->second;
            r.lathectlVersion = version->second;
        } else if (kv.count("staged") && kv.count("staged_version") &&
                   kv.at("staged_version") == o.expectedVersion) {
            r.lathectl = kv.at("staged");
            r.lathectlVersion = kv.at("staged_version");
            h.libraryPath = fs::path(r.lathectl).parent_path().parent_path().string() + "/lib";
        } else if (o.stage) {
            if (r.os + "\n" + r.arch + "\n" != staging.os) {
                r.problem = who + ": cannot stage lathectl: the host runs " + r.os + " " + r.arch +
                            ", this lathectl is built for " + staging.os.substr(0, staging.os.find('\n')) +
                            " " +
                            staging.os.substr(staging.os.find('\n') + 1,
                                              staging.os.size() - staging.os.find('\n') - 2);
                return;
            }
            const std::string dir = std::string(kStageRoot) + "/" + staging.tag;
            upload(*h.control, staging.program, dir + "/bin/lathectl", 0755);
            for (const auto& lib : staging.libraries)
                upload(*h.control, lib, dir + "/lib/" + fs::path(lib).filename().string(), 0755);
            const auto again =
                keyValues(h.control->run(probeCommand(h.host, staging.tag), "the host probe", 60));
            if (!again.count("staged_version") || again.at("staged_version") != o.expectedVersion) {
                r.problem = who + ": the staged lathectl does not start there (it printed '" +
                            (again.count("staged_version") ? again.at("staged_version") : std::string()) +
                            "'); install Lathe's dependencies on the host (packaging/deps-debian.sh)";
                return;
            }
            r.lathectl = again.at("staged");
            r.lathectlVersion = again.at("staged_version");
            r.staged = true;
            h.libraryPath = fs::path(r.lathectl).parent_path().parent_path().string() + "/lib";
        } else if (found == kv.end()) {
            r.problem = who + ": no lathectl " +
                        (h.host.lathectl.empty() ? "on the PATH of a non-interactive login"
                                                 : "at " + h.host.lathectl) +
                        "; install it there, give its path (lathectl hosts add " + h.host.name +
                        " --lathectl PATH), or pass --stage to upload this one";
            return;
        } else {
            r.problem = who + ": lathectl at " + found->second + " is '" +
                        (version == kv.end() ? std::string("?") : version->second) + "', this is '" +
                        o.expectedVersion + "'; install the same version there, or pass --stage";
            return;
        }
        if (r.cores > 0 && h.host.slots > r.cores)
            r.problem = who + ": " + std::to_string(h.host.slots) + " slots asked, the host has " +
                        std::to_string(r.cores) + " cores";
        else
            r.ok = true;
    } catch (const SshError& ex) {
        r.problem = ex.what();
        if (h.host.name != h.host.spec.label()) r.problem = "host " + h.host.name + ": " + r.problem;
    } catch (const std::exception& ex) {
        r.problem = who + ": " + ex.what();
    }
}

std::vector<std::unique_ptr<HostState>> checkAll(const RemoteLaunchOptions& o) {
    if (o.hosts.empty()) throw core::ConfigError("no hosts to launch on");
    const Staging staging = stagingFor(o);
    std::vector<std::unique_ptr<HostState>> hosts;
    int rank = 0;
    for (const auto& h : o.hosts) {
        if (h.slots < 1) throw core::ConfigError("host " + h.name + ": slots must be at least 1");
        auto s = std::make_unique<HostState>();
        s->host = h;
        s->firstRank = rank;
        rank += h.slots;
        hosts.push_back(std::move(s));
    }
    std::vector<std::thread> threads;
    for (auto& h : hosts) threads.emplace_back([&h, &o, &staging] { checkOne(*h, o, staging); });
    for (auto& t : threads) t.join();
    return hosts;
}

// One rank over SSH: its own connection and channel, run on a thread that turns the command's
// output into the two pipes the supervisor reads.
class RemoteRank final : public core::RankProcess {
public:
    RemoteRank(std::string name, HostSpec spec, std::string command) : m_name(std::move(name)) {
        int out[2], err[2];
        if (::pipe2(out, O_CLOEXEC) != 0) throw core::Error("pipe failed");
        if (::pipe2(err, O_CLOEXEC) != 0) {
            ::close(out[0]);
            ::close(out[1]);
            throw core::Error("pipe failed");
        }
        m_out = out[0];
        m_err = err[0];
        m_thread = std::thread([this, spec = std::move(spec), command = std::move(command), wo = out[1],
                                we = err[1]] { run(spec, command, wo, we); });
    }
    ~RemoteRank() override {
        m_cancel = true;
        if (m_thread.joinable()) m_thread.join();
        ::close(m_out);
        ::close(m_err);
    }
    int stdoutFd() const override { return m_out; }
    int stderrFd() const override { return m_err; }
    std::optional<core::RankExit> reap() override {
        if (!m_done.load()) return std::nullopt;
        if (m_thread.joinable()) m_thread.join();
        return m_exit;
    }
    void terminate() override { m_interrupt = true; }
    void kill() override { m_cancel = true; }
    std::string where() const override { return "on " + m_name; }
    // When its first output arrived (steady clock; zero before): the worker runs by then.
    std::chrono::steady_clock::time_point firstOutput() const {
        return std::chrono::steady_clock::time_point(
            std::chrono::steady_clock::duration(m_firstOutput.load()));
    }

private:
    static void writeAll(int fd, std::string_view data) {
        while (!data.empty()) {
            const ssize_t n = ::write(fd, data.data(), data.size());
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return;
            data.remove_prefix(static_cast<size_t>(n));
        }
    }

    void run(const HostSpec& spec, const std::string& command, int wo, int we) {
        core::RankExit exit;
        try {
            SshSession session(spec);
            // sshd drops unauthenticated connections beyond MaxStartups (10 by default) at random:
            // a host with many slots gets a few tries, spaced out.
            for (int attempt = 1;; ++attempt) {
                try {
                    session.connect(HostKeyPolicy::Strict);
                    break;
                } catch (const HostKeyError&) {
                    throw;
                } catch (const SshError& ex) {
                    const bool transient = ex.kind() == SshError::Kind::Connect ||
                                           ex.kind() == SshError::Kind::Timeout ||
                                           ex.kind() == SshError::Kind::Protocol;
                    if (!transient || attempt == 4 || m_cancel || m_interrupt) throw;
                    std::this_thread::sleep_for(std::chrono::milliseconds(250 * attempt));
                }
            }
            if (m_cancel || m_interrupt) {  // stopped before it started: nothing to say
                exit.clean = true;
                exit.description = "was not started (the run was ending)";
                m_exit = exit;
                ::close(wo);
                ::close(we);
                m_done = true;
                return;
            }
            ExecOptions eo;
            eo.cancel = &m_cancel;
            eo.interrupt = &m_interrupt;
            eo.keepStdinOpen = true;
            const auto res = session.exec(
                command,
                [this, wo](std::string_view c) {
                    if (m_firstOutput.load() == 0)
                        m_firstOutput.store(std::chrono::steady_clock::now().time_since_epoch().count());
                    writeAll(wo, c);
                },
                [we](std::string_view c) { writeAll(we, c); }, eo);
            if (res.cancelled) {
                exit.description = "was stopped (its SSH channel was closed; the lifeline ends it there)";
            } else if (!res.exitSignal.empty()) {
                // Not the SIGTERM our own stop sent (a rank still starting has no handler yet).
                exit.abrupt = !(m_interrupt && res.exitSignal == "TERM");
                exit.description = "was killed by signal " + res.exitSignal;
            } else {
                exit.clean = res.exitStatus == 0 || res.exitStatus == 130;
                exit.description = "exited with status " + std::to_string(res.exitStatus);
            }
        } catch (const std::exception& ex) {
            exit.abrupt = true;
            exit.description = std::string("lost its connection: ") + ex.what();
        }
        m_exit = exit;
        ::close(wo);
        ::close(we);
        m_done = true;
    }

    std::string m_name;
    int m_out = -1, m_err = -1;
    std::atomic<bool> m_cancel{false}, m_interrupt{false}, m_done{false};
    std::atomic<std::chrono::steady_clock::rep> m_firstOutput{0};
    core::RankExit m_exit;
    std::thread m_thread;
};

std::string randomTag() {
    std::random_device rd;
    std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    std::string s;
    for (int i = 0; i < 10; ++i) s += digits[gen() % 36];
    return s;
}

// Runs `command` on the host's control session, reconnecting once if it broke while idle.
void runControl(HostState& h, const std::string& command, const std::string& what) {
    for (int attempt = 0;; ++attempt) {
        try {
            if (!h.control || !h.control->isConnected()) {
                h.control = std::make_unique<SshSession>(h.host.spec);
                h.control->connect(HostKeyPolicy::Strict);
            }
            h.control->run(posixShell(command), what, 60);
            return;
        } catch (const SshError& ex) {
            h.control.reset();
            if (attempt == 1 || ex.kind() == SshError::Kind::HostKey || ex.kind() == SshError::Kind::Auth)
                throw;
        }
    }
}

// Whatever happened, nothing of the run stays on the hosts: its processes (the lifeline has ended
// them already; this is the net under it), on every host first, then its directory (on a shared
// home, removing it while another host's rank still runs would fail on busy files). Hosts in
// parallel; one that cannot be reached now is named in the log.
void cleanUp(std::vector<std::unique_ptr<HostState>>& hosts, const std::string& runDir,
             const core::EventSink& sink) {
    const std::string tag = fs::path(runDir).filename().string();
    // The bracket keeps the pattern from matching this shell's own command line.
    const std::string pattern = "[" + tag.substr(0, 1) + "]" + tag.substr(1);
    std::vector<std::string> problems(hosts.size());
    const auto onAll = [&](const std::function<void(HostState&)>& step) {
        std::vector<std::thread> threads;
        for (size_t i = 0; i < hosts.size(); ++i)
            threads.emplace_back([&, i] {
                if (!problems[i].empty()) return;
                try {
                    step(*hosts[i]);
                } catch (const std::exception& ex) {
                    problems[i] = ex.what();
                }
            });
        for (auto& t : threads) t.join();
    };
    onAll([&](HostState& h) {
        runControl(h, "pkill -KILL -f -- " + shellQuote(pattern) + "; true", "stopping the run's processes");
    });
    onAll(
        [&](HostState& h) { runControl(h, "rm -rf -- " + shellQuote(runDir), "removing the run's files"); });
    for (size_t i = 0; i < hosts.size(); ++i)
        if (!problems[i].empty() && sink) try {
                sink(core::Event::log(
                    "warn", "host " + hosts[i]->host.name +
                                ": could not remove the run's files and processes: " + problems[i]));
            } catch (...) {  // the workspace cannot take it either: nothing more to do here
            }
}

// Rank 0's checkpoints, fetched on a thread of their own (with their own connection) so that a
// large file on a slow link never holds up the supervisor: it keeps reading every rank's output
// and can stop the run meanwhile. A checkpoint file rewritten before it was fetched (rank 0 went on
// to the next epoch) is skipped: its newer event follows.
class CheckpointFetcher {
public:
    CheckpointFetcher(const HostState& host, std::string localDir)
        : m_name(host.host.name), m_spec(host.host.spec), m_dir(std::move(localDir)) {
        m_thread = std::thread([this] { loop(); });
    }
    ~CheckpointFetcher() {
        {
            std::lock_guard<std::mutex> lk(m_mutex);
            m_closing = true;
            m_abandon = true;
        }
        m_cv.notify_all();
        if (m_thread.joinable()) m_thread.join();
    }
    void add(const core::Event& e) {
        {
            std::lock_guard<std::mutex> lk(m_mutex);
            // The same file again: only the newest event can still be fetched.
            const auto name = fs::path(e.text).filename();
            m_pending.erase(
                std::remove_if(m_pending.begin(), m_pending.end(),
                               [&](const core::Event& p) { return fs::path(p.text).filename() == name; }),
                m_pending.end());
            m_pending.push_back(e);
        }
        m_cv.notify_all();
    }
    // Fetched checkpoints (under their local paths) and what the fetcher has to say, in order.
    std::vector<core::Event> take() {
        std::lock_guard<std::mutex> lk(m_mutex);
        return std::exchange(m_ready, {});
    }
    // Waits until everything asked for is fetched: a stopped run's last checkpoint is what it
    // resumes from. After a stop request it gives up after `stopGraceSec` more.
    void finish(const std::atomic<bool>* stop, int stopGraceSec = 120) {
        std::unique_lock<std::mutex> lk(m_mutex);
        m_closing = true;
        m_cv.notify_all();
        std::optional<std::chrono::steady_clock::time_point> giveUpAt;
        while (!m_cv.wait_for(lk, std::chrono::milliseconds(200),
                              [&] { return m_pending.empty() && !m_busy; })) {
            if (stop && stop->load() && !giveUpAt)
                giveUpAt = std::chrono::steady_clock::now() + std::chrono::seconds(stopGraceSec);
            if (giveUpAt && std::chrono::steady_clock::now() > *giveUpAt) {
                m_abandon = true;
                m_ready.push_back(
                    core::Event::log("warn", "gave up waiting for the last checkpoint from " + m_name));
                break;
            }
        }
    }

private:
    void loop() {
        std::unique_ptr<SshSession> session;
        for (;;) {
            core::Event e;
            {
                std::unique_lock<std::mutex> lk(m_mutex);
                m_cv.wait(lk, [&] { return !m_pending.empty() || m_closing; });
                if (m_pending.empty() || m_abandon) return;
                e = m_pending.front();
                m_pending.erase(m_pending.begin());
                m_busy = true;
            }
            std::vector<core::Event> out;
            const std::string target = m_dir + "/" + fs::path(e.text).filename().string();
            for (int attempt = 0; attempt < 2; ++attempt) {
                try {
                    if (!session || !session->isConnected()) {
                        session = std::make_unique<SshSession>(m_spec);
                        session->connect(HostKeyPolicy::Strict);
                    }
                    const auto t = download(*session, e.text, target);
                    // The file is the checkpoint the event announced, not a later one written over it.
                    const auto info = core::readCheckpointInfo(target);
                    if (info.sha256 != e.sha256) {
                        out.push_back(core::Event::log(
                            "info", "checkpoint of epoch " + std::to_string(static_cast<int64_t>(e.value)) +
                                        " was replaced on " + m_name + " before it could be fetched"));
                    } else {
                        // A model-parallel run's other stages and shards, which rank 0 wrote
                        // beside it, come too (before the event, so the run's checkpoint is whole
                        // when it is recorded).
                        uint64_t bytes = t.bytes;
                        int files = 1;
                        for (int stage = 0;; ++stage) {
                            bool stageFound = false;
                            for (int shard = stage == 0 ? 1 : 0;; ++shard) {
                                const auto there = core::shardCheckpointPath(e.text, stage, shard);
                                if (!remoteFileExists(*session, there)) break;
                                bytes +=
                                    download(*session, there, core::shardCheckpointPath(target, stage, shard))
                                        .bytes;
                                ++files;
                                stageFound = true;
                            }
                            if (stage > 0 && !stageFound) break;
                        }
                        core::Event local = e;
                        local.text = target;
                        out.push_back(local);
                        out.push_back(core::Event::log(
                            "info",
                            "fetched " + fs::path(target).filename().string() +
                                (files > 1 ? " and " + std::to_string(files - 1) + " stage/shard file(s)"
                                           : std::string()) +
                                " from " + m_name + " (" + std::to_string(bytes) +
                                " bytes, SHA-256 checked)"));
                    }
                    break;
                } catch (const std::exception& ex) {
                    session.reset();
                    if (attempt == 1)
                        out.push_back(core::Event::log("error", std::string("checkpoint not fetched from ") +
                                                                    m_name + ": " + ex.what()));
                }
            }
            std::lock_guard<std::mutex> lk(m_mutex);
            for (auto& o : out) m_ready.push_back(std::move(o));
            m_busy = false;
            m_cv.notify_all();
        }
    }

    std::string m_name;
    HostSpec m_spec;
    std::string m_dir;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::vector<core::Event> m_pending, m_ready;
    bool m_closing = false, m_abandon = false, m_busy = false;
    std::thread m_thread;
};

}  // namespace

std::vector<HostReport> checkHosts(const RemoteLaunchOptions& options) {
    auto hosts = checkAll(options);
    std::vector<HostReport> out;
    for (auto& h : hosts) out.push_back(h->report);
    return out;
}

namespace {
core::LaunchResult launchChecked(const core::LaunchOptions& base, const RemoteLaunchOptions& options,
                                 const core::EventSink& sink);
}

core::LaunchResult launchRemote(const core::LaunchOptions& base, const RemoteLaunchOptions& options,
                                const core::EventSink& sink) {
    // Transfers and probes fail with SshError: the run fails with its message like any other error.
    try {
        return launchChecked(base, options, sink);
    } catch (const SshError& ex) {
        throw core::Error(ex.what());
    }
}

namespace {

core::LaunchResult launchChecked(const core::LaunchOptions& base, const RemoteLaunchOptions& options,
                                 const core::EventSink& sink) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const auto ms = [](Clock::duration d) {
        return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    int total = 0;
    for (const auto& h : options.hosts) total += h.slots;
    if (total != base.nproc)
        throw core::ConfigError("the hosts' slots add up to " + std::to_string(total) +
                                " ranks, the run asks for " + std::to_string(base.nproc));
    auto log = [&](const std::string& level, const std::string& text) {
        if (sink) sink(core::Event::log(level, text));
    };
    auto hosts = checkAll(options);
    std::string problems;
    for (const auto& h : hosts)
        if (!h->report.ok) problems += (problems.empty() ? "" : "; ") + h->report.problem;
    if (!problems.empty()) throw core::ConfigError("not launched, nothing was started: " + problems);
    const auto tChecked = Clock::now();
    for (const auto& h : hosts)
        log("info",
            "host " + h->host.name + " (" + h->report.address + "): " + h->report.os + " " + h->report.arch +
                ", " + std::to_string(h->report.cores) + " cores, " + h->report.lathectlVersion + " at " +
                h->report.lathectl + (h->report.staged ? " (staged now)" : "") + "; ranks " +
                std::to_string(h->firstRank) + ".." + std::to_string(h->firstRank + h->host.slots - 1));

    HostState& first = *hosts.front();
    const std::string master = options.masterAddr.empty() ? first.report.address : options.masterAddr;
    if (master.empty())
        throw core::ConfigError("cannot tell the address of host " + first.host.name +
                                "; give --master-addr");
    const std::string libEnv0 =
        first.libraryPath.empty() ? "" : "LD_LIBRARY_PATH=" + shellQuote(first.libraryPath) + " ";
    const std::string portText =
        first.control->run(posixShell(libEnv0 + shellQuote(first.report.lathectl) + " free-port --address " +
                                      shellQuote(master)),
                           "finding a free port on " + first.host.name + " for " + master, 60);
    int port = 0;
    try {
        port = std::stoi(portText);
    } catch (const std::exception&) {
    }
    if (port <= 0 || port > 65535)
        throw core::ConfigError("host " + first.host.name + ": cannot use " + master +
                                " as the master address (" + portText.substr(0, portText.find('\n')) +
                                "); give --master-addr");

    const std::string tag =
        (base.owner.workspaceId.empty() ? std::string("run") : base.owner.workspaceId.substr(0, 8)) + "-" +
        std::to_string(base.owner.runId) + "-" + randomTag();
    const std::string runDir = std::string(kRunRoot) + "/" + tag;
    struct CleanAll {
        std::vector<std::unique_ptr<HostState>>& hosts;
        const std::string& runDir;
        const core::EventSink& sink;
        ~CleanAll() {
            try {
                cleanUp(hosts, runDir, sink);
            } catch (...) {  // a destructor, maybe while unwinding: never terminate over clean-up
            }
        }
    } cleanAll{hosts, runDir, sink};

    const std::string resumeName =
        base.resumeFrom.empty() ? "" : fs::path(base.resumeFrom).filename().string();
    // Files the run reads by a path in its config (the PPO agent's policy, a distillation
    // teacher) travel with it: uploaded into the run's directory, the config pointed at the copies.
    std::string configToSend = base.configPath;
    std::vector<std::pair<std::string, std::string>> inputs;  // local path, remote path
    struct RemoveFile {
        std::string path;
        ~RemoveFile() {
            std::error_code ec;
            if (!path.empty()) fs::remove(path, ec);
        }
    } rewritten;
    if (!base.inputFiles.empty()) {
        std::ifstream in(base.configPath, std::ios::binary);
        std::stringstream text;
        text << in.rdbuf();
        if (!in) throw core::Error("cannot read " + base.configPath);
        auto spec = core::parseRunSpec(text.str(), base.configPath, false);
        for (const auto& [key, local] : base.inputFiles) {
            const std::string there = runDir + "/inputs/" + key + "-" + fs::path(local).filename().string();
            core::setSpecValue(spec, key, there);
            inputs.emplace_back(local, there);
        }
        rewritten.path = base.configPath + ".remote-" + tag;
        std::ofstream out(rewritten.path, std::ios::binary | std::ios::trunc);
        out << core::toToml(spec);
        if (!out) throw core::Error("cannot write " + rewritten.path);
        configToSend = rewritten.path;
    }
    {
        // One thread per host: each uses only its own session.
        std::vector<std::string> errors(hosts.size());
        std::vector<std::thread> threads;
        for (size_t i = 0; i < hosts.size(); ++i)
            threads.emplace_back([&, i] {
                try {
                    upload(*hosts[i]->control, configToSend, runDir + "/config.toml");
                    for (const auto& [local, there] : inputs) upload(*hosts[i]->control, local, there);
                    if (!base.resumeFrom.empty()) {
                        upload(*hosts[i]->control, base.resumeFrom, runDir + "/resume/" + resumeName);
                        // A model-parallel run's other stages and shards: each rank reads its own.
                        for (const auto& c : core::checkpointCompanions(base.resumeFrom))
                            upload(*hosts[i]->control, c,
                                   runDir + "/resume/" + fs::path(c).filename().string());
                    }
                } catch (const std::exception& ex) {
                    errors[i] = ex.what();
                }
            });
        for (auto& t : threads) t.join();
        for (const auto& e : errors)
            if (!e.empty()) throw core::Error("uploading the run's files failed: " + e);
    }
    log("info", "run files uploaded to ~/" + runDir + " on " + std::to_string(hosts.size()) +
                    " host(s); rendezvous at " + master + ":" + std::to_string(port));

    const auto tStaged = Clock::now();
    std::vector<std::unique_ptr<core::RankProcess>> ranks;
    std::vector<RemoteRank*> remoteRanks;
    for (auto& h : hosts) {
        const int threads = std::max(1, h->report.cores / h->host.slots);
        for (int local = 0; local < h->host.slots; ++local) {
            const int rank = h->firstRank + local;
            std::string env = "RANK=" + std::to_string(rank) + " LOCAL_RANK=" + std::to_string(local) +
                              " WORLD_SIZE=" + std::to_string(base.nproc) +
                              " LOCAL_WORLD_SIZE=" + std::to_string(h->host.slots) +
                              " MASTER_ADDR=" + shellQuote(master) + " MASTER_PORT=" + std::to_string(port) +
                              " LATHE_BIND_ADDR=" + shellQuote(h->report.address) +
                              " OMP_NUM_THREADS=" + std::to_string(threads) +
                              " OPENBLAS_NUM_THREADS=" + std::to_string(threads);
            if (!h->libraryPath.empty()) env += " LD_LIBRARY_PATH=" + shellQuote(h->libraryPath);
            // Paths from the login's home, so the run directory's name is on the worker's command
            // line: the clean-up finds any process of the run by it.
            std::string cmd = "exec env " + env + " " + shellQuote(h->report.lathectl) + " worker " +
                              shellQuote(runDir + "/config.toml") + " --lifeline --checkpoint-dir " +
                              shellQuote(runDir + "/checkpoints");
            if (!resumeName.empty()) cmd += " --resume " + shellQuote(runDir + "/resume/" + resumeName);
            if (!base.dataVersion.empty()) cmd += " --data-version " + shellQuote(base.dataVersion);
            if (!base.owner.workspaceId.empty())
                cmd +=
                    " --owner " + shellQuote(base.owner.workspaceId + ":" + std::to_string(base.owner.runId));
            auto r = std::make_unique<RemoteRank>(h->host.name, h->host.spec, cmd);
            remoteRanks.push_back(r.get());
            ranks.push_back(std::move(r));
        }
    }

    // Rank 0's checkpoints come home as they are written, under their local path, so resume and
    // model registration work as for a local run.
    std::error_code ec;
    if (!base.checkpointDir.empty()) fs::create_directories(base.checkpointDir, ec);
    std::unique_ptr<CheckpointFetcher> fetcher;
    if (!base.checkpointDir.empty()) fetcher = std::make_unique<CheckpointFetcher>(first, base.checkpointDir);
    // How long the launch took, once every rank has spoken (bench_remote_launch reads this line).
    bool timed = false;
    const auto noteLaunchTime = [&] {
        if (timed) return;
        Clock::time_point last{};
        for (const auto* r : remoteRanks) {
            if (r->firstOutput() == Clock::time_point{}) return;
            last = std::max(last, r->firstOutput());
        }
        timed = true;
        log("info", "launch timing: hosts checked in " + ms(tChecked - t0) + " ms, run files staged in " +
                        ms(tStaged - tChecked) + " ms, all " + std::to_string(remoteRanks.size()) +
                        " ranks running " + ms(last - tStaged) + " ms later; " + ms(last - t0) +
                        " ms in all");
    };
    const auto deliverFetched = [&] {
        if (!fetcher || !sink) return;
        for (const auto& f : fetcher->take()) sink(f);
    };
    const core::EventSink fetching = [&](const core::Event& e) {
        noteLaunchTime();
        deliverFetched();
        if (e.type == core::Event::Type::Checkpoint && fetcher) {
            fetcher->add(e);
            return;
        }
        if (sink) sink(e);
    };
    core::SuperviseOptions so;
    so.stop = base.stop;
    so.killGraceSec = base.killGraceSec;
    auto result = core::superviseRanks(ranks, so, fetching);
    ranks.clear();  // every channel closed: the lifelines of ranks still running end now
    if (fetcher) {
        fetcher->finish(base.stop);
        deliverFetched();
    }
    return result;
}

}  // namespace

}  // namespace lathe::remote
