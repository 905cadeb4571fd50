// lathectl train: one run from a TOML file and/or flags, recorded in the workspace.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>

#include "cli_common.h"
#include "lathe/core/error.h"
#include "lathe/core/record.h"
#include "lathe/core/trainer.h"

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
};

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

    const bool humanOut = !st.common.json;
    std::FILE* progressOut = humanOut ? stdout : stderr;
    Progress progress(progressOut, isatty(fileno(progressOut)) != 0, spec.epochs);
    core::EventSink observer;
    if (!st.quiet) observer = [&](const core::Event& e) { progress(e); };

    core::RecordOptions ro;
    ro.resumeRunId = st.resume;
    ro.stop = &installStopHandler();
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    ro.host = host;
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
    cmd->callback([st, &exitCode] { exitCode = runTrain(*st); });
}

}  // namespace lathe::cli
