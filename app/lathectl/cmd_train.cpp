// lathectl train: one run from a TOML file and/or flags, recorded in the workspace.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <thread>

#include "cli_common.h"
#include "hosts_common.h"
#include "lathe/core/error.h"
#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/core/studies.h"
#include "lathe/core/trainer.h"
#include "lathe/remote/launcher.h"

namespace lathe::cli {
namespace {

// Prints progress: a redrawn bar on a terminal, one line per epoch otherwise.
class Progress {
public:
    Progress(std::FILE* out, bool tty, int64_t epochs) : m_out(out), m_tty(tty), m_epochs(epochs) {}

    void operator()(const core::Event& e) {
        using T = core::Event::Type;
        if (e.type == T::Status && e.text == core::toString(core::RunStatus::Running)) {
            m_total = static_cast<int64_t>(e.value);
            m_step = e.step;
        } else if (e.type == T::Log) {
            line(e.text);
        } else if (e.type == T::Error) {
            clearBar();
            std::fprintf(stderr, "error: %s\n", e.text.c_str());
        } else if (e.type == T::Metric) {
            m_step = std::max(m_step, e.step);
            m_last[e.key] = e.value;
            if (e.key == "train/epoch") {
                m_epoch = static_cast<int64_t>(e.value);
                if (!m_tty) line(epochLine());
            }
            if (m_tty) drawBar();
        }
    }
    void finish() { clearBar(); }

private:
    std::string get(const char* key, const char* label) const {
        auto it = m_last.find(key);
        return it == m_last.end() ? std::string() : std::string("  ") + label + " " + formatValue(it->second);
    }
    std::string epochLine() const {
        return "epoch " + std::to_string(m_epoch) + "/" + std::to_string(m_epochs) +
               get("train/loss", "loss") + get("train/accuracy", "acc") + get("val/loss", "val_loss") +
               get("val/accuracy", "val_acc") + get("perf/samples_per_s", "samples/s");
    }
    void line(const std::string& text) {
        clearBar();
        std::fprintf(m_out, "%s\n", text.c_str());
        std::fflush(m_out);
        if (m_tty) drawBar();
    }
    void drawBar() {
        if (m_total <= 0) return;
        const double frac = std::min(1.0, static_cast<double>(m_step) / static_cast<double>(m_total));
        const int width = 30, filled = static_cast<int>(frac * width);
        std::string bar(filled, '#');
        bar.resize(width, '.');
        std::fprintf(m_out, "\r[%s] %3d%%  epoch %lld/%lld%s%s\033[K", bar.c_str(),
                     static_cast<int>(frac * 100), static_cast<long long>(std::min(m_epoch + 1, m_epochs)),
                     static_cast<long long>(m_epochs), get("train/loss", "loss").c_str(),
                     get("val/accuracy", "val_acc").c_str());
        std::fflush(m_out);
        m_barShown = true;
    }
    void clearBar() {
        if (!m_barShown) return;
        std::fprintf(m_out, "\r\033[K");
        m_barShown = false;
    }

    std::FILE* m_out;
    bool m_tty;
    int64_t m_epochs, m_total = 0, m_step = 0, m_epoch = 0;
    bool m_barShown = false;
    std::map<std::string, double> m_last;
};

struct TrainState {
    CommonOptions common;
    SpecFlags spec;
    int64_t resume = 0;
    bool quiet = false;
    bool verifyData = false;
    std::string hosts;  // NAME:SLOTS[,NAME:SLOTS...]
    std::string masterAddr;
    bool stage = false;
    int64_t studyTrial = 0;          // set by lathectl tune: the trial this run is
    std::vector<double> studyRungs;  // ASHA's rungs (epochs) at which the study judges this trial
    std::string studyWake;           // the study's FIFO: a byte written there wakes it at a rung
};

// A study trial under ASHA: at each rung the run waits for the study's verdict (the study reads
// the metrics just recorded) and stops when it is pruned — the decision takes effect at the rung,
// however fast the epochs are. The run wakes the study through its FIFO (--study-wake) rather
// than wait for the study's next poll, and looks for the verdict every millisecond at first: a
// rung costs a short trial milliseconds, not the tens of both sides' polls. A study that is gone
// (this process was re-parented) or silent for 5 minutes lets the run go on.
class RungGate {
public:
    RungGate(std::string workspace, int64_t trial, std::vector<double> rungs, std::string wake,
             std::atomic<bool>* stop)
        : m_ws(std::move(workspace)),
          m_trial(trial),
          m_rungs(std::move(rungs)),
          m_wake(std::move(wake)),
          m_stop(stop),
          m_parent(::getppid()) {}

    void operator()(core::Store& store, const core::Event& e) {
        if (e.type != core::Event::Type::Metric || e.key != "train/epoch") return;
        const auto it = std::find_if(m_rungs.begin(), m_rungs.end(),
                                     [&](double r) { return std::abs(r - e.value) < 1e-9; });
        if (it == m_rungs.end()) return;
        const auto rung = static_cast<size_t>(it - m_rungs.begin());
        store.flush();
        const bool woken = wakeStudy();
        core::Studies studies(m_ws);
        const auto start = std::chrono::steady_clock::now();
        const auto deadline = start + std::chrono::minutes(5);
        for (auto now = start; now < deadline && ::getppid() == m_parent && !m_stop->load();
             now = std::chrono::steady_clock::now()) {
            const auto t = studies.trial(m_trial);
            if (!t) return;
            for (const auto& g : t->rungs)
                if (g.rung == static_cast<int>(rung)) {
                    if (!g.promoted) m_stop->store(true);
                    return;
                }
            // A verdict the study was woken for comes within milliseconds; one that waits on
            // its poll (no FIFO, or a busy study) is looked for less often.
            std::this_thread::sleep_for(woken && now - start < std::chrono::milliseconds(200)
                                            ? std::chrono::milliseconds(1)
                                            : std::chrono::milliseconds(20));
        }
    }

private:
    // A byte to the study's FIFO, without blocking. True when the study will wake: the byte went
    // in, or the FIFO is full of earlier ones; false with no FIFO or no reader (the study is gone).
    bool wakeStudy() const {
        if (m_wake.empty()) return false;
        const int fd = ::open(m_wake.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) return false;
        const char byte = 'r';
        const auto n = ::write(fd, &byte, 1);
        const bool full = n < 0 && errno == EAGAIN;
        ::close(fd);
        return n == 1 || full;
    }

    std::string m_ws;
    int64_t m_trial;
    std::vector<double> m_rungs;
    std::string m_wake;
    std::atomic<bool>* m_stop;
    pid_t m_parent;
};

// --hosts NAME:SLOTS[,NAME:SLOTS…]: the inventory's hosts, in rank order.
std::vector<remote::RemoteHost> parsePlacement(const std::string& text, const core::Store& store) {
    std::vector<remote::RemoteHost> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        const auto comma = text.find(',', pos);
        const std::string item =
            text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? text.size() + 1 : comma + 1;
        const auto colon = item.rfind(':');
        const std::string name = item.substr(0, colon);
        if (name.empty())
            throw UsageError("--hosts: '" + item + "' names no host (give NAME:SLOTS, e.g. gpu-a:2,gpu-b:2)");
        const auto rec = store.host(name);
        if (!rec)
            throw UsageError("--hosts: no host '" + name + "' in " + store.path() +
                             " (add it with lathectl hosts add " + name + " --address ADDRESS)");
        remote::RemoteHost h;
        h.name = name;
        h.spec = specFor(*rec);
        h.lathectl = rec->lathectl;
        h.slots = rec->slots;
        if (colon != std::string::npos) {
            const std::string n = item.substr(colon + 1);
            int slots = 0;
            try {
                size_t used = 0;
                slots = std::stoi(n, &used);
                if (used != n.size()) slots = 0;
            } catch (const std::exception&) {
                slots = 0;
            }
            if (slots < 1)
                throw UsageError("--hosts: slots of '" + name + "' must be a positive number (got '" + n +
                                 "')");
            if (slots > rec->slots)
                throw UsageError("--hosts: " + std::to_string(slots) + " slots asked of '" + name +
                                 "', which has " + std::to_string(rec->slots) + " (lathectl hosts list)");
            h.slots = slots;
        }
        for (const auto& other : out)
            if (other.name == name) throw UsageError("--hosts: '" + name + "' is named twice");
        out.push_back(std::move(h));
    }
    return out;
}

int runTrain(const TrainState& st) {
    auto store = openStore(st.common);
    core::RunSpec spec;
    if (st.resume > 0) {
        const auto run = store->run(st.resume);
        if (!run) throw UsageError("--resume: no run " + std::to_string(st.resume) + " in " + store->path());
        if (!st.spec.config.empty())
            throw UsageError("--resume continues a recorded run; give no CONFIG file with it");
        spec = buildSpec(
            st.spec, core::parseRunSpec(run->config, "run " + std::to_string(st.resume) + " config", false));
    } else {
        spec = buildSpec(st.spec);
    }

    // Across hosts: every host is checked before the run is created; the ranks are the slots.
    remote::RemoteLaunchOptions remoteOptions;
    std::string placement;
    if (!st.hosts.empty()) {
        // A ProxyJump helper (`ssh -W`) that dies must fail its connection, not kill us by SIGPIPE.
        std::signal(SIGPIPE, SIG_IGN);
        remoteOptions.hosts = parsePlacement(st.hosts, *store);
        remoteOptions.masterAddr = st.masterAddr;
        remoteOptions.stage = st.stage;
        remoteOptions.expectedVersion = versionLine();
        int total = 0;
        std::vector<int> slots;
        for (const auto& h : remoteOptions.hosts) {
            total += h.slots;
            slots.push_back(h.slots);
            placement += (placement.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
        }
        if (spec.nproc > 1 && spec.nproc != total)
            throw UsageError("the run asks for nproc = " + std::to_string(spec.nproc) +
                             " but --hosts gives " + std::to_string(total) +
                             " slots; drop nproc or make them agree");
        spec.nproc = total;
        if (spec.strategy == "hierarchical" &&
            std::adjacent_find(slots.begin(), slots.end(), std::not_equal_to<>()) != slots.end())
            throw UsageError(
                "strategy = \"hierarchical\" groups ranks by host and needs the same slots on every host "
                "(got " +
                placement + ")");
        if (const auto problems = core::validate(spec); !problems.empty()) {
            std::string all;
            for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
            throw core::ConfigError(all);
        }
        std::string problems;
        for (const auto& r : remote::checkHosts(remoteOptions)) {
            if (!r.ok) problems += "\n  " + r.problem;
            if (r.staged)
                std::fprintf(stderr, "staged %s on %s at %s\n", r.lathectlVersion.c_str(), r.name.c_str(),
                             r.lathectl.c_str());
        }
        if (!problems.empty()) {
            std::fprintf(stderr, "lathectl: not launched (nothing was started):%s\n", problems.c_str());
            return kRunFailed;
        }
    } else if (!st.masterAddr.empty() || st.stage) {
        throw UsageError("--master-addr and --stage apply to runs across hosts: give --hosts too");
    }

    const bool humanOut = !st.common.json;
    std::FILE* progressOut = humanOut ? stdout : stderr;
    Progress progress(progressOut, isatty(fileno(progressOut)) != 0, spec.epochs);
    core::EventSink observer;
    if (!st.quiet) observer = [&](const core::Event& e) { progress(e); };
    auto& stopFlag = installStopHandler();
    if (st.studyTrial > 0 && !st.studyRungs.empty()) {
        auto gate =
            std::make_shared<RungGate>(store->path(), st.studyTrial, st.studyRungs, st.studyWake, &stopFlag);
        observer = [gate, inner = observer, s = store.get()](const core::Event& e) {
            if (inner) inner(e);
            (*gate)(*s, e);
        };
    }

    core::RecordOptions ro;
    ro.resumeRunId = st.resume;
    ro.verifyData = st.verifyData;
    ro.stop = &stopFlag;
    if (st.studyTrial > 0) {
        // The study learns the run's id as soon as it exists (ASHA watches its metrics).
        const std::string ws = store->path();
        ro.onRunCreated = [ws, trial = st.studyTrial](int64_t runId) {
            core::Studies(ws).attachRun(trial, runId, static_cast<int64_t>(::getpid()));
        };
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    ro.host = host;
    if (!remoteOptions.hosts.empty()) {
        ro.placement = placement;
        ro.launch = [&remoteOptions](const core::LaunchOptions& lo, const core::EventSink& sink) {
            return remote::launchRemote(lo, remoteOptions, sink);
        };
    }
    core::keepHeapForTraining();
    const auto rec = core::trainAndRecord(*store, spec, ro, observer);
    removeStopHandler();
    progress.finish();

    const auto run = store->run(rec.runId);
    const double elapsed = run && run->endedAt > 0 ? run->endedAt - run->startedAt : 0;
    if (st.common.json) {
        nlohmann::json j;
        j["run_id"] = rec.runId;
        j["status"] = core::toString(rec.result.status);
        if (!rec.result.error.empty()) j["error"] = rec.result.error;
        j["workspace"] = store->path();
        j["epochs"] = rec.result.epochsDone;
        j["steps"] = rec.result.steps;
        j["seconds"] = elapsed;
        for (const auto& [k, v] : rec.result.finalMetrics) j[k] = metricJson(v);
        std::cout << j.dump() << std::endl;
    } else {
        std::printf("run %lld %s after %s (%lld epochs, %lld steps)\n", static_cast<long long>(rec.runId),
                    core::toString(rec.result.status), formatDuration(elapsed).c_str(),
                    static_cast<long long>(rec.result.epochsDone), static_cast<long long>(rec.result.steps));
        if (!rec.result.error.empty()) std::printf("error: %s\n", rec.result.error.c_str());
        std::printf("workspace: %s\n", store->path().c_str());
        for (const auto& [k, v] : rec.result.finalMetrics)
            if (k.rfind("train/", 0) == 0 || k.rfind("val/", 0) == 0 || k.rfind("perf/", 0) == 0)
                std::printf("  %-20s %s\n", k.c_str(), formatValue(v).c_str());
        std::printf("curves: lathectl metrics %lld --db %s    details: lathectl runs show %lld\n",
                    static_cast<long long>(rec.runId), store->path().c_str(),
                    static_cast<long long>(rec.runId));
    }
    if (rec.result.status == core::RunStatus::Completed) return kOk;
    if (rec.result.status == core::RunStatus::Stopped) return kInterrupted;
    return kRunFailed;
}

}  // namespace

void registerTrain(CLI::App& app, int& exitCode) {
    auto st = std::make_shared<TrainState>();
    auto* cmd = app.add_subcommand("train", "train a model and record the run in the workspace");
    addSpecFlags(cmd, st->spec);
    addCommonOptions(cmd, st->common);
    cmd->add_option("--resume", st->resume,
                    "continue run ID from its last checkpoint (flags such as --epochs apply)");
    cmd->add_flag("--quiet,-q", st->quiet, "no progress output");
    cmd->add_flag(
        "--verify-data", st->verifyData,
        "data = dataset:...: check every file's SHA-256 before training, not only sizes and mtimes");
    cmd->add_option(
        "--hosts", st->hosts,
        "run across hosts of the workspace over SSH: NAME:SLOTS[,NAME:SLOTS...] (one rank per slot; "
        "lathectl hosts add NAME first)");
    cmd->add_option("--master-addr", st->masterAddr,
                    "with --hosts: the address of the first host that the others reach (default: the one "
                    "this machine reaches it at)");
    cmd->add_flag("--stage", st->stage,
                  "with --hosts: upload this lathectl to hosts of the same OS and architecture that lack it "
                  "or have another version");
    cmd->add_option("--study-trial", st->studyTrial, "(set by lathectl tune) the study trial this run is")
        ->group("");
    cmd->add_option("--study-rungs", st->studyRungs, "(set by lathectl tune) ASHA's rungs, in epochs")
        ->delimiter(',')
        ->group("");
    cmd->add_option("--study-wake", st->studyWake,
                    "(set by lathectl tune) the study's FIFO to wake it at a rung")
        ->group("");
    cmd->callback([st, &exitCode] { exitCode = runTrain(*st); });
}

}  // namespace lathe::cli
