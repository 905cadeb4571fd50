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
        m_status = core::RunStatus::Failed;
        m_error.clear();
    }
    m_thread = std::thread([this, spec, workerProgram = m_workerProgram] {
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
            core::RecordedRun rec =
                core::trainAndRecord(m_store, spec, options, [this](const core::Event& e) { observe(e); });
            id = rec.runId;
            status = rec.result.status;
            error = rec.result.error;
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
