#pragma once
// Runs core::trainAndRecord on its own thread, one run at a time. The training thread never
// touches widgets: it appends events to a mutex-protected staging vector and posts at most
// one drain request at a time; the GUI thread drains in bulk and re-emits the events.
//
// A run across hosts (a RunTarget with hosts) is checked on that thread first, as
// `lathectl train --hosts` does: every host reachable with a known key, authentication, the same
// lathectl version (or --stage), enough cores. If any fails, no run is created and finished()
// reports each failing host; otherwise the ranks are started with remote::launchRemote.
#include <QObject>
#include <QString>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/record.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "lathe/widgets/run_target.h"

namespace lathe::app {

class TrainingSession : public QObject {
    Q_OBJECT
public:
    explicit TrainingSession(core::Store& store, QObject* parent = nullptr);
    /// Requests a stop and joins, so closing the window never leaves a thread behind.
    ~TrainingSession() override;

    /// Starts a run in the background: on this machine, or on the target's hosts (then the
    /// spec's nproc becomes the total of their slots). Returns false when a run is already in
    /// progress.
    bool start(const core::RunSpec& spec, const widgets::RunTarget& target = {});
    /// Asks the trainer to stop after the current step; finished() follows.
    void requestStop();
    /// Stops and blocks until the training thread has ended (used on close).
    void stopAndWait();

    /// The `lathectl` that runs the workers of a run with nproc > 1; empty (the default): the
    /// one next to the running executable. For runs across hosts it is the one staged with
    /// --stage and whose version remote ones must match. Applies to runs started afterwards.
    void setWorkerProgram(const std::string& path) { m_workerProgram = path; }
    const std::string& workerProgram() const { return m_workerProgram; }

    bool isRunning() const { return m_running; }
    bool stopRequested() const { return m_stop.load(); }
    /// The id of the current (or last) run; 0 until the store has created it.
    int64_t runId() const;

Q_SIGNALS:
    void started(qint64 runId);
    /// Emitted on the GUI thread with every event since the previous emission, in order.
    void eventsArrived(qint64 runId, const std::vector<lathe::core::Event>& events);
    /// status: "completed" | "stopped" | "failed"; runId is 0 when the spec was rejected
    /// before a run was created.
    void finished(qint64 runId, const QString& status, const QString& error);
    /// What the session is doing before the run exists ("Checking hosts gpu-a, gpu-b…").
    void progress(const QString& text);

private:
    void observe(const core::Event& event);  // training thread
    void drain();                            // GUI thread
    void onWorkerDone();                     // GUI thread
    void post(const QString& text);          // any thread: progress() on the GUI thread

    core::Store& m_store;
    std::thread m_thread;
    std::atomic<bool> m_stop{false};
    bool m_running = false;  // GUI thread only
    bool m_startedEmitted = false;
    std::string m_workerProgram;  // GUI thread; copied into the run's options at start

    mutable std::mutex m_mutex;  // guards everything below
    std::vector<core::Event> m_staged;
    bool m_drainPending = false;
    int64_t m_runId = 0;  // set by trainAndRecord's onRunCreated
    core::RunStatus m_status = core::RunStatus::Failed;
    std::string m_error;
};

}  // namespace lathe::app
