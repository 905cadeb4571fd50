// Running a study: trials as `lathectl train` processes, sampling, ASHA, resume (tuner.h).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/executable.h"
#include "lathe/core/fork_server.h"
#include "lathe/core/store.h"
#include "lathe/core/tuner.h"
#include "torch_backend.h"
#include "tuning/ppo_types.h"
#include "tuning/search.h"

namespace fs = std::filesystem;

namespace lathe::core {

const std::vector<std::string>& objectiveMetrics() {
    static const std::vector<std::string> keys = {"val/accuracy", "val/loss",           "train/accuracy",
                                                  "train/loss",   "perf/samples_per_s", "perf/step_ms"};
    return keys;
}

namespace {

std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

std::string fmtExact(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

nlohmann::json parseJson(const std::string& text, const std::string& what) {
    try {
        return text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
    } catch (const std::exception& e) {
        throw StoreError(what + " is not readable JSON (" + e.what() + ")");
    }
}

struct Settings {
    int64_t trials = 20;
    int parallel = 1;
    uint64_t seed = 0;
    std::string budgetKey = "epochs";
    double minBudget = 1, maxBudget = 1, eta = 3;
    int64_t ppoInterval = 1;
    int startupTrials = 10;
    std::vector<std::string> hosts;

    static Settings from(const std::string& text) {
        const auto j = parseJson(text, "the study's settings");
        Settings s;
        s.trials = j.value("trials", s.trials);
        s.parallel = j.value("parallel", s.parallel);
        s.seed = j.value("seed", s.seed);
        s.budgetKey = j.value("budget_key", s.budgetKey);
        s.minBudget = j.value("min_budget", s.minBudget);
        s.maxBudget = j.value("max_budget", s.maxBudget);
        s.eta = j.value("eta", s.eta);
        s.ppoInterval = j.value("ppo_interval", s.ppoInterval);
        s.startupTrials = j.value("startup_trials", s.startupTrials);
        if (j.contains("hosts"))
            for (const auto& h : j["hosts"]) s.hosts.push_back(h.get<std::string>());
        return s;
    }
};

tuning::SearchSpace spaceOf(const StudyRecord& s) {
    tuning::SearchSpace space;
    for (const auto& text : s.space) space.params.push_back(tuning::parseParam(text));
    space.check();
    return space;
}

tuning::Direction directionOf(const StudyRecord& s) {
    return s.direction == "min" ? tuning::Direction::Minimize : tuning::Direction::Maximize;
}

// The objective's value at the end of epoch `budget` of a run: the last point recorded at or
// before the step where train/epoch reached it.
std::optional<double> valueAtEpoch(const Store& store, int64_t runId, const std::string& objective,
                                   double budget) {
    const auto epochs = store.metrics(runId, "train/epoch");
    int64_t step = -1;
    for (const auto& p : epochs)
        if (p.value >= budget - 1e-9) {
            step = p.step;
            break;
        }
    if (step < 0) return std::nullopt;
    std::optional<double> v;
    for (const auto& p : store.metrics(runId, objective))
        if (p.step <= step) v = p.value;
    return v;
}

// A trial process: `lathectl train …` with its output in files, SIGINT when we die.
struct Child {
    pid_t pid = 0;
    int64_t trialId = 0;
    int64_t number = 0;
    std::string host;  // placement ("" = local)
    int slot = -1;     // its index in the study's hosts (an entry may be named twice: gpu-a:1,gpu-a:1)
    std::string errPath;
    bool pruning = false;  // we stopped it at a rung
    double prunedAt = 0;
    double prunedValue = 0;
    std::string pruneReason;
};

pid_t spawn(const std::string& program, const std::vector<std::string>& args, const std::string& outPath,
            const std::string& errPath) {
    std::vector<std::string> all{program};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (out < 0 || err < 0 || in < 0) {
        for (int fd : {out, err, in})
            if (fd >= 0) ::close(fd);
        throw Error("cannot open a trial's log file " + errPath + ": " + std::strerror(errno));
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        // The trial starts with no signal blocked, whatever this thread blocks.
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        // The trial stops (gracefully, recorded as stopped) when the study's process dies.
        ::prctl(PR_SET_PDEATHSIG, SIGINT);
        if (::getppid() != parent) ::_exit(130);
        ::dup2(in, 0);
        ::dup2(out, 1);
        ::dup2(err, 2);
        ::execv(program.c_str(), argv.data());
        ::_exit(127);
    }
    const int e = errno;
    ::close(out);
    ::close(err);
    ::close(in);
    if (pid < 0) throw Error(std::string("cannot start a trial: ") + std::strerror(e));
    return pid;
}

std::string lastLine(const std::string& path) {
    std::ifstream in(path);
    std::string line, last;
    while (std::getline(in, line))
        if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
    return last;
}

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// The FIFO through which a trial at one of ASHA's rungs wakes its study (lathectl train
// --study-wake): the study reads it, the trials write a byte to it and do not wait. The study
// holds a write end too, so that the FIFO does not read as closed between trials. Where it cannot
// be made (a file system without FIFOs), the study finds the rungs by polling, as before.
class RungWake {
public:
    RungWake() = default;
    RungWake(const RungWake&) = delete;
    RungWake& operator=(const RungWake&) = delete;
    ~RungWake() {
        if (m_read >= 0) ::close(m_read);
        if (m_write >= 0) ::close(m_write);
        if (!m_path.empty()) ::unlink(m_path.c_str());
    }
    void open(const std::string& path) {
        ::unlink(path.c_str());  // one left by a study that was killed
        if (::mkfifo(path.c_str(), 0600) != 0) return;
        m_path = path;
        m_read = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        m_write = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (m_read < 0 || m_write < 0) {
            if (m_read >= 0) ::close(m_read);
            if (m_write >= 0) ::close(m_write);
            m_read = m_write = -1;
            ::unlink(path.c_str());
            m_path.clear();
        }
    }
    int fd() const { return m_read; }
    const std::string& path() const { return m_path; }
    void drain() const {
        char buf[256];
        if (m_read >= 0)
            while (::read(m_read, buf, sizeof buf) > 0) {
            }
    }

private:
    std::string m_path;
    int m_read = -1, m_write = -1;
};

class StudyRunner {
public:
    StudyRunner(const std::string& workspace, const std::string& name, const TuneOptions& o)
        : m_options(o), m_store(workspace), m_studies(workspace) {
        const auto s = m_studies.study(name);
        if (!s)
            throw ConfigError("no study '" + name + "' in " + m_store.path() +
                              " (lathectl studies list shows them; lathectl tune --study NAME starts one)");
        m_study = *s;
        m_settings = Settings::from(m_study.settings);
        if (m_options.parallel > 0) m_settings.parallel = m_options.parallel;
        if (!m_options.hosts.empty()) m_settings.hosts = m_options.hosts;
        m_space = spaceOf(m_study);
        m_dir = (fs::path(m_store.filesDir()) / "studies" / m_study.name).string();
        fs::create_directories(m_dir);
        m_basePath = (fs::path(m_dir) / "base.toml").string();
        {
            std::ofstream f(m_basePath, std::ios::trunc);
            f << m_study.baseConfig;
            if (!f) throw Error("cannot write " + m_basePath);
        }
        m_base = parseRunSpec(m_study.baseConfig, "study " + m_study.name + " base config", false);
        if (m_study.pruner == "asha") {
            tuning::Asha a;
            a.minBudget = m_settings.minBudget;
            a.maxBudget = m_settings.maxBudget;
            a.eta = m_settings.eta;
            m_rungs = a.rungs();
            // The last rung is the full budget: a trial that reaches it is complete, not judged.
            if (!m_rungs.empty() && m_rungs.back() >= m_settings.maxBudget - 1e-9) m_rungs.pop_back();
        }
    }

    ~StudyRunner() {
        for (const auto& [pid, fd] : m_pidfds) ::close(fd);
    }
    StudyRunner(const StudyRunner&) = delete;
    StudyRunner& operator=(const StudyRunner&) = delete;

    TuneOutcome run() {
        TuneOutcome outcome;
        // Under ASHA a trial that reaches a rung wakes the loop through a FIFO in the study's
        // directory (RungWake), so that its verdict does not wait for the next poll.
        RungWake wake;
        if (!m_rungs.empty()) wake.open((fs::path(m_dir) / "rung.fifo").string());
        m_wakePath = wake.path();
        const auto wait = [&] {
            // A trial's end wakes the loop through its pidfd. (Not SIGCHLD: a process's signal
            // goes to any of its threads that does not block it, and is lost there.)
            std::vector<pollfd> fds;
            bool everyEnd = true;
            for (const auto& c : m_children) {
                const auto it = m_pidfds.find(c.pid);
                if (it == m_pidfds.end())
                    everyEnd = false;
                else
                    fds.push_back({it->second, POLLIN, 0});
            }
            if (wake.fd() >= 0) fds.push_back({wake.fd(), POLLIN, 0});
            // A trial without a pidfd (a kernel before 5.3, or no descriptor to be had) is
            // looked for every 10 ms instead.
            const double s = everyEnd ? m_options.pollSeconds : std::min(m_options.pollSeconds, 0.01);
            // A trial ended, one reached a rung, the time passed, or a signal (Ctrl+C).
            if (::poll(fds.data(), fds.size(), static_cast<int>(std::ceil(s * 1000))) > 0) wake.drain();
        };
        m_studies.setStatus(m_study.id, "running");
        if (m_study.sampler == "ppo") preparePolicy();
        recoverInterrupted();
        const int slots = m_settings.hosts.empty() ? std::max(1, m_settings.parallel)
                                                   : static_cast<int>(m_settings.hosts.size());
        const auto started = std::chrono::steady_clock::now();
        bool closing = false;  // --timeout or --stop-at: no new trials, the running ones finish
        for (;;) {
            if (m_options.stop && m_options.stop->load()) {
                stopAll();
                outcome.stopped = true;
                outcome.ended = TuneOutcome::Ended::Interrupted;
                m_studies.setStatus(m_study.id, "stopped");
                say("study " + m_study.name + " stopped: lathectl tune --resume " + m_study.name +
                    " continues it");
                return outcome;
            }
            // Ends and rungs first, so that a slot a trial has just freed is filled now rather
            // than after the next wait.
            reap();
            if (!m_rungs.empty()) watchRungs();
            if (!closing) {
                const double elapsed =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
                if (m_reached) {
                    closing = true;
                    outcome.ended = TuneOutcome::Ended::Target;
                    say("study " + m_study.name + " reached its target (" + *m_reached + "): no new trials" +
                        (m_children.empty()
                             ? std::string()
                             : ", waiting for the " + std::to_string(m_children.size()) + " running"));
                } else if (m_options.timeoutSeconds > 0 && elapsed >= m_options.timeoutSeconds) {
                    closing = true;
                    outcome.ended = TuneOutcome::Ended::Timeout;
                    say("study " + m_study.name + ": --timeout " + fmt(m_options.timeoutSeconds) +
                        " s passed: no new trials" +
                        (m_children.empty()
                             ? std::string()
                             : ", waiting for the " + std::to_string(m_children.size()) + " running"));
                }
            }
            while (!closing && static_cast<int>(m_children.size()) < slots &&
                   (!m_toResume.empty() || m_next < m_settings.trials)) {
                launchNext();
                ++outcome.started;
            }
            if (m_children.empty()) break;
            wait();
        }
        // Ended early (--timeout, --stop-at) with trials still to run: stopped, and --resume
        // runs the rest.
        const bool all = m_toResume.empty() && m_next >= m_settings.trials;
        m_studies.setStatus(m_study.id, all ? "completed" : "stopped");
        if (!all)
            say("study " + m_study.name + " ran " + std::to_string(m_next) + " of its " +
                std::to_string(m_settings.trials) + " trials: lathectl tune --resume " + m_study.name +
                " runs the rest");
        return outcome;
    }

private:
    void say(const std::string& line) const {
        if (m_options.progress) m_options.progress(line);
    }

    std::string trialFile(int64_t number, const char* ext) const {
        return (fs::path(m_dir) / ("trial-" + std::to_string(number) + ext)).string();
    }

    // ---- PPO ------------------------------------------------------------------------------
    std::string policyPath() const { return (fs::path(m_dir) / "policy.pt").string(); }

    void preparePolicy() {
        auto state = parseJson(m_study.state, "the study's state");
        if (!fs::exists(policyPath())) {
            torchBackend().ppoCreatePolicy(policyPath(), m_settings.seed);
            state["policy"] = policyPath();
            state["updates"] = 0;
            state["episodes"] = 0;
            state["trained_trials"] = nlohmann::json::array();
            m_studies.setState(m_study.id, state.dump());
            m_study.state = state.dump();
        }
    }

    // The episode a PPO trial's run recorded: each decision's state, action, log-probability and
    // value with the reward recorded after it; a decision with no reward yet (the run ended or
    // was stopped first) is dropped.
    // A run that failed after a decision (diverged: lr too high) ends its episode with this
    // reward for that decision, so the agent learns to avoid what killed it.
    static constexpr float kFailedReward = -1.0f;

    tuning::PpoEpisode episodeOf(int64_t runId, bool failed) const {
        tuning::PpoEpisode ep;
        const auto actions = m_store.metrics(runId, "ppo/action");
        if (actions.empty()) return ep;
        const auto logps = m_store.metrics(runId, "ppo/logp");
        const auto values = m_store.metrics(runId, "ppo/value");
        const auto rewards = m_store.metrics(runId, "ppo/reward");
        std::vector<std::vector<MetricPoint>> states;
        for (int i = 0; i < tuning::kPpoStateSize; ++i)
            states.push_back(m_store.metrics(runId, "ppo/s" + std::to_string(i)));
        for (size_t k = 0; k < actions.size(); ++k) {
            const int64_t step = actions[k].step;
            const auto reward = std::find_if(rewards.begin(), rewards.end(),
                                             [&](const MetricPoint& p) { return p.step > step; });
            if (k >= logps.size() || k >= values.size()) break;
            const bool last = k + 1 == actions.size();
            if (reward == rewards.end() && !(failed && last)) break;
            if (reward != rewards.end() && k + 1 < actions.size() && reward->step > actions[k + 1].step)
                break;
            tuning::PpoStep st;
            for (const auto& s : states) {
                if (k >= s.size()) return ep;
                st.state.push_back(static_cast<float>(s[k].value));
            }
            st.action = static_cast<int>(actions[k].value);
            st.logProb = static_cast<float>(logps[k].value);
            st.value = static_cast<float>(values[k].value);
            st.reward = reward != rewards.end() ? static_cast<float>(reward->value) : kFailedReward;
            ep.steps.push_back(std::move(st));
        }
        return ep;
    }

    // One PPO update from a finished trial's episode (trials as episodes, in the order they end).
    void learnFrom(const TrialRecord& t) {
        if (m_study.sampler != "ppo" || t.runId == 0) return;
        auto ep = episodeOf(t.runId, t.state == TrialState::Failed);
        if (ep.steps.empty()) return;
        auto state = parseJson(m_study.state, "the study's state");
        const auto stats = torchBackend().ppoUpdatePolicy(policyPath(), {ep},
                                                          m_settings.seed + static_cast<uint64_t>(t.number));
        state["updates"] = state.value("updates", 0) + 1;
        state["episodes"] = state.value("episodes", 0) + 1;
        if (!state.contains("trained_trials")) state["trained_trials"] = nlohmann::json::array();
        state["trained_trials"].push_back(t.number);
        state["last_update"] = {{"samples", stats.samples},      {"policy_loss", stats.policyLoss},
                                {"value_loss", stats.valueLoss}, {"entropy", stats.entropy},
                                {"approx_kl", stats.approxKl},   {"mean_return", stats.meanReturn}};
        m_study.state = state.dump();
        m_studies.setState(m_study.id, m_study.state);
    }

    // ---- sampling and launching --------------------------------------------------------------
    tuning::Assignment sample(int64_t number) {
        std::mt19937_64 rng(m_settings.seed * 1000003ULL + static_cast<uint64_t>(number) * 7919ULL + 17);
        if (m_study.sampler == "random") return tuning::sampleRandom(m_space, rng);
        std::vector<tuning::Observation> history;
        for (const auto& t : m_studies.trials(m_study.id)) {
            tuning::Observation o;
            o.params = t.params;
            if (t.state == TrialState::Complete || t.state == TrialState::Pruned) o.value = t.value;
            if (t.state == TrialState::Pruned) o.prunedAt = t.prunedAt;
            history.push_back(std::move(o));
        }
        tuning::TpeOptions tpe;
        tpe.startupTrials = m_settings.startupTrials;
        return tuning::sampleTpe(m_space, history, directionOf(m_study), rng, tpe);
    }

    void launchNext() {
        int64_t trialId = 0, number = 0, resumeRun = 0;
        std::map<std::string, std::string> params;
        if (!m_toResume.empty()) {
            const auto t = m_toResume.front();
            m_toResume.erase(m_toResume.begin());
            trialId = t.id;
            number = t.number;
            params = t.params;
            resumeRun = t.runId;
        } else {
            number = m_next++;
            params = sample(number);
        }
        // The slot: a host placement not in use, else this machine.
        std::string host;
        int slot = -1;
        if (!m_settings.hosts.empty()) {
            std::set<int> busy;
            for (const auto& c : m_children) busy.insert(c.slot);
            for (size_t i = 0; i < m_settings.hosts.size(); ++i)
                if (!busy.count(static_cast<int>(i))) {
                    host = m_settings.hosts[i];
                    slot = static_cast<int>(i);
                    break;
                }
        }
        const std::string hostName = host.empty() ? "localhost" : host.substr(0, host.rfind(':'));
        if (trialId == 0) trialId = m_studies.addTrial(m_study.id, number, params, hostName);

        std::vector<std::string> args{"train"};
        if (resumeRun > 0) {
            args.insert(args.end(), {"--resume", std::to_string(resumeRun)});
        } else {
            args.push_back(m_basePath);
            args.insert(args.end(), {"--experiment", m_study.name, "--name",
                                     m_study.name + "-t" + std::to_string(number)});
            for (const auto& [k, v] : params) args.insert(args.end(), {"--" + flagOf(k), v});
            // Trials share the cores: each gets its share unless the base config says otherwise.
            if (m_base.threads == 0 && host.empty()) {
                const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
                const int share = std::max(1, static_cast<int>(cores) / std::max(1, m_settings.parallel));
                args.insert(args.end(), {"--threads", std::to_string(share)});
            }
            if (m_study.sampler == "ppo") {
                // The policy as it is now, kept with the trial: its run is reproducible from its
                // recorded config (the same policy file and seed make the same decisions).
                const std::string snap = trialFile(number, ".policy.pt");
                fs::copy_file(policyPath(), snap, fs::copy_options::overwrite_existing);
                args.insert(args.end(),
                            {"--ppo-policy", snap, "--ppo-interval", std::to_string(m_settings.ppoInterval)});
            }
        }
        args.insert(args.end(),
                    {"--db", m_store.path(), "--json", "-q", "--study-trial", std::to_string(trialId)});
        if (!m_rungs.empty()) {
            // The trial waits at each rung for the verdict (lathectl train's RungGate).
            std::string rungs;
            for (double r : m_rungs) rungs += (rungs.empty() ? "" : ",") + fmtExact(r);
            args.insert(args.end(), {"--study-rungs", rungs});
            if (!m_wakePath.empty()) args.insert(args.end(), {"--study-wake", m_wakePath});
        }
        if (!host.empty()) args.insert(args.end(), {"--hosts", host});
        Child c;
        c.trialId = trialId;
        c.number = number;
        c.host = host;
        c.slot = slot;
        c.errPath = trialFile(number, ".log");
        c.pid = launch(args, trialFile(number, ".json"), c.errPath);
        if (c.pid < 0) {
            m_studies.finishTrial(trialId, TrialState::Failed, std::nullopt,
                                  "the fork server did not say whether it started the trial");
            say("trial " + std::to_string(number) +
                " failed: the fork server did not say whether it started it");
            return;
        }
        m_children.push_back(c);
        // (syscall: Debian 12's <sys/pidfd.h> lacks extern "C" for C++.)
        if (const int fd = static_cast<int>(::syscall(SYS_pidfd_open, c.pid, 0)); fd >= 0)
            m_pidfds[c.pid] = fd;
        std::string shown;
        for (const auto& [k, v] : params) shown += (shown.empty() ? "" : " ") + k + "=" + v;
        say(std::string(resumeRun > 0 ? "trial " + std::to_string(number) + " continues (run " +
                                            std::to_string(resumeRun) + ")"
                                      : "trial " + std::to_string(number) + " started") +
            (host.empty() ? "" : " on " + hostName) + ": " + shown);
    }

    // A trial's process: a fork of the study's fork server (LibTorch already loaded: about 0.7 s
    // less per trial), else a fresh `lathectl train` as before (fork_server.h).
    pid_t launch(const std::vector<std::string>& args, const std::string& outPath,
                 const std::string& errPath) {
        if (!m_forksTried) {
            m_forksTried = true;
            std::string why;
            m_forks = ForkServer::start(m_options.lathectl, &why);
            if (m_forks) {
                say("trials start as forks of process " + std::to_string(m_forks->serverPid()) +
                    ", which loaded LibTorch once (LATHE_FORK_SERVER=0 starts each afresh)");
                // The base config's data file, parsed once there rather than by every trial.
                if (m_forks->prepare(m_basePath, &why))
                    say("the fork server read " + m_base.data + " ahead for the trials");
                else if (!m_forks->usable()) {
                    say("the fork server failed (" + why + "): trials start as fresh processes");
                    m_forks.reset();
                }
            } else if (!why.empty())
                say("trials start as fresh processes (the fork server is not available: " + why + ")");
        }
        if (m_forks) {
            std::vector<std::string> argv{m_options.lathectl};
            argv.insert(argv.end(), args.begin(), args.end());
            std::string why;
            bool maybeStarted = false;
            const pid_t pid = m_forks->spawn(argv, outPath, errPath, &why, &maybeStarted);
            if (pid > 0) return pid;
            m_forks.reset();
            say("the fork server failed (" + why + "): trials start as fresh processes from now on");
            if (maybeStarted) {
                // The trial may be running without us knowing its pid: stop any child of ours that
                // is not a known trial, and give this one up rather than run it twice.
                stopUnknownChildren();
                return -1;
            }
        }
        return spawn(m_options.lathectl, args, outPath, errPath);
    }

    void stopUnknownChildren() {
        std::set<pid_t> known;
        for (const auto& c : m_children) known.insert(c.pid);
        std::error_code ec;
        for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
            std::ifstream in(task.path() / "children");
            for (pid_t pid = 0; in >> pid;)
                if (!known.count(pid)) {
                    ::kill(pid, SIGKILL);
                    ::waitpid(pid, nullptr, 0);
                }
        }
    }

    static std::string flagOf(const std::string& key) {
        std::string f = key;
        std::replace(f.begin(), f.end(), '_', '-');
        return f;
    }

    // ---- finishing -------------------------------------------------------------------------
    void reap() {
        for (auto it = m_children.begin(); it != m_children.end();) {
            int status = 0;
            const pid_t r = ::waitpid(it->pid, &status, WNOHANG);
            if (r == 0) {
                ++it;
                continue;
            }
            finish(*it, r < 0 ? -1 : status);
            forgetPidfd(it->pid);
            it = m_children.erase(it);
        }
    }

    void finish(const Child& c, int status) {
        const auto t = m_studies.trial(c.trialId);
        const int64_t runId = t ? t->runId : 0;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        const std::string label = "trial " + std::to_string(c.number);
        // A pruned trial stops with its run (130); one that finished its last epoch as the verdict
        // came may exit 0, or die of the SIGINT after its handler was gone: pruned all the same.
        if (c.pruning && (code == 130 || code == 0 || (WIFSIGNALED(status) && WTERMSIG(status) == SIGINT))) {
            m_studies.finishTrial(c.trialId, TrialState::Pruned, c.prunedValue, c.pruneReason, c.prunedAt);
            if (runId > 0) {
                m_store.appendLog(runId, nowSeconds(), "warn",
                                  "pruned by study " + m_study.name + " (trial " + std::to_string(c.number) +
                                      "): " + c.pruneReason);
                m_store.flush();
            }
            say(label + " pruned at " + m_settings.budgetKey + " = " + fmt(c.prunedAt) + ": " +
                c.pruneReason);
            return;
        }
        // Stopped with the study (Ctrl+C reaches the whole process group): it stays running, for
        // --resume to continue.
        if (code == 130 && m_options.stop && m_options.stop->load()) return;
        if (code == 0 && runId > 0) {
            const auto last = m_store.lastMetrics(runId);
            const auto v = last.find(m_study.objective);
            if (v == last.end()) {
                m_studies.finishTrial(c.trialId, TrialState::Failed, std::nullopt,
                                      "run " + std::to_string(runId) + " recorded no " + m_study.objective);
                say(label + " failed: its run recorded no " + m_study.objective);
                return;
            }
            m_studies.finishTrial(c.trialId, TrialState::Complete, v->second, "");
            say(label + " complete: " + m_study.objective + " " + fmt(v->second) + " (run " +
                std::to_string(runId) + ")");
            if (m_options.stopAt && !m_reached &&
                (directionOf(m_study) == tuning::Direction::Maximize ? v->second >= *m_options.stopAt
                                                                     : v->second <= *m_options.stopAt))
                m_reached = "trial " + std::to_string(c.number) + "'s " + m_study.objective + " " +
                            fmt(v->second) +
                            (directionOf(m_study) == tuning::Direction::Maximize ? " >= " : " <= ") +
                            fmt(*m_options.stopAt);
            if (const auto done = m_studies.trial(c.trialId)) learnFrom(*done);
            return;
        }
        std::string why;
        if (WIFSIGNALED(status))
            why = "the trial's process crashed (" + signalName(WTERMSIG(status)) + ")";
        else if (code == 130)
            why = "the trial's process was stopped from outside the study";
        else if (runId > 0) {
            const auto run = m_store.run(runId);
            why = run && !run->error.empty() ? run->error : lastLine(c.errPath);
        } else {
            why = lastLine(c.errPath);
        }
        if (why.empty()) why = "exit status " + std::to_string(code);
        m_studies.finishTrial(c.trialId, TrialState::Failed, std::nullopt, why);
        say(label + " failed: " + why + " (log: " + c.errPath + ")");
        if (const auto done = m_studies.trial(c.trialId)) learnFrom(*done);
    }

    void forgetPidfd(pid_t pid) {
        if (const auto it = m_pidfds.find(pid); it != m_pidfds.end()) {
            ::close(it->second);
            m_pidfds.erase(it);
        }
    }

    void stopAll() {
        for (const auto& c : m_children) ::kill(c.pid, SIGINT);
        for (const auto& c : m_children) {
            int status = 0;
            ::waitpid(c.pid, &status, 0);
            // A trial we were pruning is pruned; the others stay running, to continue on resume.
            if (c.pruning) finish(c, status);
            forgetPidfd(c.pid);
        }
        m_children.clear();
    }

    // ---- ASHA -------------------------------------------------------------------------------
    void watchRungs() {
        const auto dir = directionOf(m_study);
        for (auto& c : m_children) {
            if (c.pruning) continue;
            const auto t = m_studies.trial(c.trialId);
            if (!t || t->runId == 0) continue;
            for (size_t r = t->rungs.size(); r < m_rungs.size(); ++r) {
                const auto v = valueAtEpoch(m_store, t->runId, m_study.objective, m_rungs[r]);
                if (!v) break;
                // Every value recorded at this rung so far, this one included.
                std::vector<double> atRung{*v};
                for (const auto& other : m_studies.trials(m_study.id))
                    if (other.id != t->id)
                        for (const auto& g : other.rungs)
                            if (g.rung == static_cast<int>(r)) atRung.push_back(g.value);
                const bool promoted = tuning::Asha::promote(*v, atRung, dir, m_settings.eta);
                m_studies.addRung(c.trialId, {static_cast<int>(r), m_rungs[r], *v, promoted});
                if (!promoted) {
                    const auto keep = static_cast<size_t>(std::floor(atRung.size() / m_settings.eta));
                    std::vector<double> sorted = atRung;
                    std::sort(sorted.begin(), sorted.end(),
                              [&](double a, double b) { return betterValue(a, b, m_study.direction); });
                    c.pruning = true;
                    c.prunedAt = m_rungs[r];
                    c.prunedValue = *v;
                    c.pruneReason = m_study.objective + " " + fmt(*v) + " at " + m_settings.budgetKey +
                                    " = " + fmt(m_rungs[r]) + " is not in the best " +
                                    std::to_string(std::max<size_t>(1, keep)) + " of the " +
                                    std::to_string(atRung.size()) + " trials that reached it (best " +
                                    fmt(sorted.front()) + ")";
                    ::kill(c.pid, SIGINT);
                    break;
                }
            }
        }
    }

    // ---- resume -----------------------------------------------------------------------------
    // Trials left running by a study that was stopped or killed: a finished run is recorded as
    // what it was, an interrupted one continues from its checkpoint, one that never got a run
    // starts again with its parameters. Numbering continues after the last trial.
    void recoverInterrupted() {
        const auto trials = m_studies.trials(m_study.id);
        for (const auto& t : trials) m_next = std::max(m_next, t.number + 1);
        for (const auto& t : trials) {
            if (t.state != TrialState::Running) continue;
            // A trial of a killed study gets SIGINT and winds down (a step and a checkpoint).
            for (int i = 0; i < 600 && alive(static_cast<pid_t>(t.pid)) && t.pid != ::getpid(); ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            const bool prunedRung =
                std::any_of(t.rungs.begin(), t.rungs.end(), [](const RungRecord& g) { return !g.promoted; });
            std::optional<RunRecord> run;
            if (t.runId > 0) run = m_store.run(t.runId);
            if (prunedRung) {
                const auto& g = *std::find_if(t.rungs.begin(), t.rungs.end(),
                                              [](const RungRecord& x) { return !x.promoted; });
                m_studies.finishTrial(t.id, TrialState::Pruned, g.value,
                                      m_study.objective + " " + fmt(g.value) + " at " + m_settings.budgetKey +
                                          " = " + fmt(g.budget) + " was not promoted",
                                      g.budget);
                continue;
            }
            if (run && run->status == RunStatus::Completed) {
                const auto last = m_store.lastMetrics(t.runId);
                const auto v = last.find(m_study.objective);
                if (v != last.end()) {
                    m_studies.finishTrial(t.id, TrialState::Complete, v->second, "");
                    say("trial " + std::to_string(t.number) + " had completed: " + m_study.objective + " " +
                        fmt(v->second));
                    if (const auto done = m_studies.trial(t.id)) learnFrom(*done);
                    continue;
                }
            }
            if (run && run->status == RunStatus::Failed) {
                m_studies.finishTrial(t.id, TrialState::Failed, std::nullopt, run->error);
                continue;
            }
            auto again = t;
            if (!(run && (run->status == RunStatus::Stopped || run->status == RunStatus::Interrupted)))
                again.runId = 0;
            // Stopped before its first checkpoint (during its first epoch): nothing to continue
            // from, so the trial starts again, as a new run with the same parameters.
            if (again.runId > 0) {
                const auto artifacts = m_store.artifacts(again.runId);
                if (std::none_of(artifacts.begin(), artifacts.end(),
                                 [](const ArtifactRecord& a) { return a.kind == "checkpoint"; })) {
                    m_store.appendLog(again.runId, nowSeconds(), "info",
                                      "study " + m_study.name + " (trial " + std::to_string(t.number) +
                                          "): stopped before its first checkpoint; the trial starts again "
                                          "as a new run");
                    m_store.flush();
                    again.runId = 0;
                }
            }
            m_toResume.push_back(again);
        }
    }

    TuneOptions m_options;
    Store m_store;
    Studies m_studies;
    StudyRecord m_study;
    Settings m_settings;
    tuning::SearchSpace m_space;
    RunSpec m_base;
    std::string m_dir, m_basePath;
    std::vector<double> m_rungs;
    std::optional<std::string> m_reached;  // the trial that met --stop-at
    std::vector<Child> m_children;
    std::vector<TrialRecord> m_toResume;
    int64_t m_next = 0;
    std::unique_ptr<ForkServer> m_forks;  // started with the first trial
    bool m_forksTried = false;
    std::string m_wakePath;         // the FIFO a trial at a rung writes to (empty: the study polls only)
    std::map<pid_t, int> m_pidfds;  // a running trial's pidfd: readable once it has ended
};

}  // namespace

void checkStudy(const StudyRecord& s, const RunSpec& base) {
    Studies::validateName(s.name);
    if (s.sampler != "random" && s.sampler != "tpe" && s.sampler != "ppo")
        throw ConfigError("unknown sampler '" + s.sampler + "' (random, tpe or ppo)");
    if (s.pruner != "none" && s.pruner != "asha")
        throw ConfigError("unknown pruner '" + s.pruner + "' (none or asha)");
    if (s.direction != "max" && s.direction != "min")
        throw ConfigError("--direction must be max or min (got '" + s.direction + "')");
    const auto& keys = objectiveMetrics();
    if (std::find(keys.begin(), keys.end(), s.objective) == keys.end()) {
        std::string all;
        for (const auto& k : keys) all += (all.empty() ? "" : ", ") + k;
        throw ConfigError("--objective " + s.objective +
                          ": no run records that metric once per epoch (one of " + all + ")");
    }
    if (s.space.empty())
        throw ConfigError(
            "the search space is empty: give at least one --space KEY=DIST, e.g. --space "
            "'lr=loguniform(1e-4,1e-1)'");
    const auto space = spaceOf(s);
    const auto settings = Settings::from(s.settings);
    if (settings.trials < 1 || settings.trials > 100000) throw ConfigError("--trials must be 1..100000");
    if (settings.parallel < 1 || settings.parallel > 256) throw ConfigError("--parallel must be 1..256");
    if (settings.startupTrials < 1) throw ConfigError("--startup-trials must be at least 1");
    if (s.pruner == "asha") {
        if (settings.budgetKey != "epochs")
            throw ConfigError("--budget-key " + settings.budgetKey +
                              ": ASHA's budget is counted in epochs (the only "
                              "budget key every run reports as it goes)");
        if (settings.eta < 2) throw ConfigError("--eta must be at least 2");
        if (settings.minBudget < 1 || settings.minBudget >= settings.maxBudget)
            throw ConfigError("--min-budget must be at least 1 and below the runs' " + settings.budgetKey +
                              " (" + fmt(settings.maxBudget) + ")");
    }
    for (const auto& p : space.params) {
        if (s.pruner == "asha" && p.key == settings.budgetKey)
            throw ConfigError("--space " + p.key + ": ASHA controls the budget key " + settings.budgetKey +
                              "; search it without --pruner asha, or leave it out of the space");
        if (s.sampler == "ppo" && (p.key == "ppo_policy" || p.key == "ppo_interval"))
            throw ConfigError("--space " + p.key + ": the PPO agent's own settings are not searched");
    }
    if (s.sampler == "ppo" && base.nproc > 1)
        throw ConfigError(
            "--algo ppo changes the batch size of a single process; the base config has nproc = " +
            std::to_string(base.nproc));
    // The base config with each parameter at each of its bounds (or choices) must be a valid run.
    for (const auto& p : space.params) {
        std::vector<std::string> values = p.choices;
        if (values.empty()) values = {fmt(p.lo), fmt(p.hi)};
        for (const auto& v : values) {
            RunSpec spec = base;
            try {
                setSpecValue(spec, p.key, v);
            } catch (const ConfigError& e) {
                throw ConfigError("--space " + p.describe() + ": " + e.what());
            }
            const auto problems = validate(spec);
            if (!problems.empty())
                throw ConfigError("--space " + p.key + "=" + p.describe() + ": with " + p.key + " = " + v +
                                  " the run is "
                                  "not valid: " +
                                  problems.front());
        }
    }
}

TuneOutcome runStudy(const std::string& workspacePath, const std::string& name, const TuneOptions& options) {
    if (options.lathectl.empty()) throw Error("runStudy: no lathectl program to run trials with");
    StudyRunner runner(workspacePath, name, options);
    return runner.run();
}

}  // namespace lathe::core
