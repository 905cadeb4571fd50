#pragma once
// Runs core::deploy / core::rollback on its own thread, one at a time: they start or hot-swap a
// `lathectl serve` process and wait (up to a minute) for it to answer, which the GUI thread must
// never do. Progress lines and the outcome come back as queued calls and are re-emitted as
// signals on the GUI thread; failures carry core's message, for the window to show.
#include <QMetaType>
#include <QObject>
#include <QString>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "lathe/core/deploy.h"
#include "lathe/core/registry.h"

namespace lathe::app {

struct DeployOutcome {
    QString action;  // "deploy" | "rollback"
    QString model;
    qint64 version = 0;          // now live (0 when it failed before one was known)
    qint64 previousVersion = 0;  // live before (0: none)
    QString url;
    QString target;        // "local", "ssh:NAME"
    bool started = false;  // a new server process was started (else hot swap)
    QString error;         // empty: succeeded
    bool ok() const { return error.isEmpty(); }
};

class DeploySession : public QObject {
    Q_OBJECT
public:
    explicit DeploySession(std::shared_ptr<core::Registry> registry, QObject* parent = nullptr);
    /// Waits for a deployment in flight: it ends with the server either ready or left as it was.
    ~DeploySession() override;

    /// The `lathectl` that serves; empty (the default): the one next to the running executable.
    void setServerProgram(const std::string& path) { m_serverProgram = path; }
    std::string serverProgram() const;
    /// Seconds to wait for a server to become ready (core's default: 60).
    void setReadyTimeout(double seconds) { m_readyTimeoutS = seconds; }

    /// Reaches the hosts of the workspace ("ssh:NAME" targets): where a new server may be started,
    /// and where live deployments elsewhere are hot-swapped, rolled back and stopped.
    void setServerHosts(core::ServerHostFor hosts) { m_hosts = std::move(hosts); }
    const core::ServerHostFor& serverHosts() const { return m_hosts; }
    /// Starts a deployment of `model` v`version` in the background; false when one is running.
    /// `host`: a host of the workspace for a new server (empty: this machine).
    bool deploy(const QString& model, qint64 version, const QString& host = {});
    /// Rolls `model` back to the version that served before the live one; false when busy.
    bool rollback(const QString& model);
    bool isBusy() const { return m_busy; }
    /// Blocks until the deployment in flight (if any) has ended (used on close).
    void wait();

Q_SIGNALS:
    void started(const QString& action, const QString& model);
    /// Human-readable steps ("starting lathectl serve on port 8500", "waiting for ready").
    void progress(const QString& text);
    void finished(const lathe::app::DeployOutcome& outcome);

private:
    bool launch(const QString& action, const QString& model, qint64 version, const QString& host = {});
    void onWorkerDone();

    std::shared_ptr<core::Registry> m_registry;
    std::string m_serverProgram;
    core::ServerHostFor m_hosts;
    double m_readyTimeoutS = 60;
    std::thread m_thread;
    bool m_busy = false;  // GUI thread only

    std::mutex m_mutex;  // guards m_outcome
    DeployOutcome m_outcome;
};

}  // namespace lathe::app

Q_DECLARE_METATYPE(lathe::app::DeployOutcome)
