#include "training_session.h"

#include <QMetaObject>

#include <exception>

#include "lathe/core/error.h"

namespace lathe::app {

TrainingSession::TrainingSession(core::Store& store, QObject* parent) : QObject(parent), m_store(store) {}

TrainingSession::~TrainingSession() { stopAndWait(); }

int64_t TrainingSession::runId() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_runId;
}

bool TrainingSession::start(const core::RunSpec& spec) {
    if (m_running || m_thread.joinable()) return false;
    m_running = true;
    m_startedEmitted = false;
    m_stop.store(false);
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_staged.clear();
        m_drainPending = false;
        m_runId = 0;
        m_status.clear();
        m_error.clear();
    }
    // trainAndRecord reports the run id only when it returns; until then the new run is
    // recognised in the store as the one that did not exist before (see the report).
    m_knownRunIds.clear();
    try {
        for (const auto& r : m_store.listRuns()) m_knownRunIds.insert(r.id);
    } catch (const std::exception&) {
        // A failing read shows up again, with its message, when the run starts.
    }
    m_specToml = core::toToml(spec);

    m_thread = std::thread([this, spec] {
        core::RecordOptions options;
        options.stop = &m_stop;
        std::string status, error;
        int64_t id = 0;
        try {
            core::RecordedRun rec = core::trainAndRecord(m_store, spec, options,
                                                         [this](const core::Event& e) { observe(e); });
            id = rec.runId;
            status = rec.result.status;
            error = rec.result.error;
        } catch (const core::Error& e) {
            status = "failed";
            error = e.what();
        } catch (const std::exception& e) {
            status = "failed";
            error = std::string("unexpected error: ") + e.what();
        } catch (...) {
            status = "failed";
            error = "unexpected error of unknown type";
        }
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            if (id != 0) m_runId = id;
            m_status = status.empty() ? "failed" : status;
            m_error = error;
        }
        QMetaObject::invokeMethod(this, &TrainingSession::onWorkerDone, Qt::QueuedConnection);
    });
    return true;
}

void TrainingSession::requestStop() { m_stop.store(true); }

void TrainingSession::stopAndWait() {
    m_stop.store(true);
    if (m_thread.joinable()) m_thread.join();
}

int64_t TrainingSession::resolveRunId() const {
    std::vector<core::RunRecord> runs;
    try {
        runs = m_store.listRuns();
    } catch (const std::exception&) {
        return 0;
    }
    int64_t fallback = 0;
    for (const auto& r : runs) {  // newest first
        if (m_knownRunIds.count(r.id)) continue;
        if (r.config == m_specToml) return r.id;
        if (fallback == 0) fallback = r.id;
    }
    return fallback;
}

void TrainingSession::observe(const core::Event& event) {
    int64_t id;
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        id = m_runId;
    }
    if (id == 0) id = resolveRunId();  // outside the lock: it reads the store

    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_runId == 0) m_runId = id;
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
        status = QString::fromStdString(m_status);
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
