#include "training_session.h"

#include <QMetaObject>
#include <QStringList>

#include <exception>
#include <memory>

#include "lathe/core/error.h"
#include "lathe/remote/launcher.h"
#include "lathe/widgets/host_probe.h"

namespace lathe::app {

namespace {

// A launch across hosts as `lathectl train --hosts` builds it (app/lathectl/cmd_train.cpp): the
// inventory's records in the target's order, nproc the total of the slots.
struct RemotePlan {
    remote::RemoteLaunchOptions options;
    std::string placement;
};

RemotePlan planRemote(const core::Store& store, core::RunSpec& spec, const widgets::RunTarget& target,
                      const std::string& program) {
    RemotePlan plan;
    for (const auto& want : target.hosts) {
        const auto rec = store.host(want.name);
        if (!rec)
            throw core::ConfigError("no host '" + want.name +
                                    "' in this workspace any more (see the Hosts page)");
        if (want.slots < 1) throw core::ConfigError("host " + want.name + ": slots must be at least 1");
        if (want.slots > rec->slots)
            throw core::ConfigError(std::to_string(want.slots) + " slots asked of host " + want.name +
                                    ", which has " + std::to_string(rec->slots));
        for (const auto& other : plan.options.hosts)
            if (other.name == want.name) throw core::ConfigError("host " + want.name + " is named twice");
        remote::RemoteHost h;
        h.name = rec->name;
        h.spec = widgets::hostSpecFor(*rec);
        h.slots = want.slots;
        h.lathectl = rec->lathectl;
        plan.options.hosts.push_back(std::move(h));
    }
    const int total = target.totalSlots();
    if (total < 2) throw core::ConfigError("a run across hosts needs at least 2 slots in all");
    plan.placement = target.placement();
    spec.nproc = total;
    if (spec.strategy == "hierarchical")
        for (const auto& h : plan.options.hosts)
            if (h.slots != plan.options.hosts.front().slots)
                throw core::ConfigError(
                    "strategy = \"hierarchical\" groups ranks by host and needs the same slots on every host "
                    "(got " +
                    plan.placement + ")");
    if (const auto problems = core::validate(spec); !problems.empty()) {
        std::string all;
        for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
        throw core::ConfigError(all);
    }
    plan.options.masterAddr = target.masterAddr;
    plan.options.stage = target.stage;
    plan.options.localProgram = program;
    // What `lathectl --version` must print on every host: this build's.
    plan.options.expectedVersion = widgets::lathectlVersion(program);
    return plan;
}

}  // namespace

TrainingSession::TrainingSession(core::Store& store, QObject* parent) : QObject(parent), m_store(store) {}

TrainingSession::~TrainingSession() { stopAndWait(); }

int64_t TrainingSession::runId() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_runId;
}

bool TrainingSession::start(const core::RunSpec& spec, const widgets::RunTarget& target) {
    if (m_running || m_thread.joinable()) return false;
    m_running = true;
    m_startedEmitted = false;
    m_stop.store(false);
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_staged.clear();
        m_drainPending = false;
        m_runId = 0;
        m_status = core::RunStatus::Failed;
        m_error.clear();
    }
    m_thread = std::thread([this, spec, target, workerProgram = m_workerProgram] {
        core::RunSpec runSpec = spec;
        core::RecordOptions options;
        options.stop = &m_stop;
        options.workerProgram = workerProgram;
        options.onRunCreated = [this](int64_t id) {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_runId = id;
        };
        core::RunStatus status = core::RunStatus::Failed;
        std::string error;
        int64_t id = 0;
        try {
            bool launch = true;
            if (!target.isLocal()) {
                // Every host is checked before the run exists: a failing one leaves no run behind.
                QStringList names;
                for (const auto& h : target.hosts) names << QString::fromStdString(h.name);
                post(tr("Checking hosts %1…").arg(names.join(QStringLiteral(", "))));
                RemotePlan plan = planRemote(m_store, runSpec, target, workerProgram);
                std::string problems;
                for (const auto& r : remote::checkHosts(plan.options))
                    if (!r.ok) problems += "\n  " + r.problem;
                if (!problems.empty())
                    throw core::ConfigError("not launched (nothing was started):" + problems);
                if (m_stop.load()) {
                    launch = false;
                    status = core::RunStatus::Stopped;
                    error = "stopped before the run was started";
                } else {
                    post(tr("Hosts ready; starting %1 ranks on %2…")
                             .arg(QString::number(runSpec.nproc), QString::fromStdString(plan.placement)));
                    options.placement = plan.placement;
                    auto remoteOptions =
                        std::make_shared<const remote::RemoteLaunchOptions>(std::move(plan.options));
                    options.launch = [remoteOptions](const core::LaunchOptions& lo,
                                                     const core::EventSink& sink) {
                        return remote::launchRemote(lo, *remoteOptions, sink);
                    };
                }
            }
            if (launch) {
                core::RecordedRun rec = core::trainAndRecord(m_store, runSpec, options,
                                                             [this](const core::Event& e) { observe(e); });
                id = rec.runId;
                status = rec.result.status;
                error = rec.result.error;
            }
        } catch (const core::Error& e) {
            status = core::RunStatus::Failed;
            error = e.what();
        } catch (const std::exception& e) {
            status = core::RunStatus::Failed;
            error = std::string("unexpected error: ") + e.what();
        } catch (...) {
            status = core::RunStatus::Failed;
            error = "unexpected error of unknown type";
        }
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            if (id != 0) m_runId = id;
            m_status = status;
            m_error = error;
        }
        QMetaObject::invokeMethod(this, &TrainingSession::onWorkerDone, Qt::QueuedConnection);
    });
    return true;
}

void TrainingSession::requestStop() { m_stop.store(true); }

void TrainingSession::post(const QString& text) {
    QMetaObject::invokeMethod(
        this, [this, text] { Q_EMIT progress(text); }, Qt::QueuedConnection);
}

void TrainingSession::stopAndWait() {
    m_stop.store(true);
    if (m_thread.joinable()) m_thread.join();
}

void TrainingSession::observe(const core::Event& event) {
    // Profile spans (hundreds per step) go to the store; the Profile tab reads them from there.
    if (event.type == core::Event::Type::Span) return;
    std::lock_guard<std::mutex> lock(m_mutex);
    m_staged.push_back(event);
    if (!m_drainPending) {
        m_drainPending = true;
        QMetaObject::invokeMethod(this, &TrainingSession::drain, Qt::QueuedConnection);
    }
}

void TrainingSession::drain() {
    std::vector<core::Event> events;
    int64_t id;
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_drainPending = false;
        id = m_runId;
        if (id == 0) return;  // keep them staged until the run is known
        events.swap(m_staged);
    }
    if (!m_startedEmitted) {
        m_startedEmitted = true;
        Q_EMIT started(id);
    }
    if (!events.empty()) Q_EMIT eventsArrived(id, events);
}

void TrainingSession::onWorkerDone() {
    if (m_thread.joinable()) m_thread.join();
    drain();  // the last events go out before finished()
    int64_t id;
    QString status, error;
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        id = m_runId;
        status = QString::fromLatin1(core::toString(m_status));
        error = QString::fromStdString(m_error);
    }
    m_running = false;
    if (id != 0 && !m_startedEmitted) {
        m_startedEmitted = true;
        Q_EMIT started(id);
    }
    Q_EMIT finished(id, status, error);
}

}  // namespace lathe::app
