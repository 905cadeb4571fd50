#include "deploy_session.h"

#include <QCoreApplication>
#include <QMetaObject>

#include <exception>

#include "lathe/core/deploy.h"
#include "lathe/core/error.h"

namespace lathe::app {

DeploySession::DeploySession(std::shared_ptr<core::Registry> registry, QObject* parent)
    : QObject(parent), m_registry(std::move(registry)) {}

DeploySession::~DeploySession() { wait(); }

void DeploySession::wait() {
    if (m_thread.joinable()) m_thread.join();
}

std::string DeploySession::serverProgram() const {
    if (!m_serverProgram.empty()) return m_serverProgram;
    return (QCoreApplication::applicationDirPath() + QStringLiteral("/lathectl")).toStdString();
}

bool DeploySession::deploy(const QString& model, qint64 version, const QString& host) {
    return launch(QStringLiteral("deploy"), model, version, host);
}

bool DeploySession::rollback(const QString& model) { return launch(QStringLiteral("rollback"), model, 0); }

bool DeploySession::launch(const QString& action, const QString& model, qint64 version, const QString& host) {
    if (m_busy || m_thread.joinable() || !m_registry) return false;
    m_busy = true;
    core::DeployOptions options;
    options.serverProgram = serverProgram();
    options.readyTimeoutS = m_readyTimeoutS;
    options.actor = "user";
    options.hostFor = m_hosts;
    options.progress = [this](const std::string& line) {
        // Queued to the GUI thread; `this` outlives the worker (the destructor joins it).
        QMetaObject::invokeMethod(
            this, [this, text = QString::fromStdString(line)] { Q_EMIT progress(text); },
            Qt::QueuedConnection);
    };
    Q_EMIT started(action, model);
    m_thread = std::thread([this, registry = m_registry, action, model, version, host, options]() mutable {
        DeployOutcome out;
        out.action = action;
        out.model = model;
        const std::string name = model.toStdString();
        try {
            if (!host.isEmpty()) {
                if (!options.hostFor) throw core::ConfigError("this workbench cannot reach other hosts");
                options.on = options.hostFor("ssh:" + host.toStdString());
            }
            core::DeployResult r;
            if (action == QLatin1String("rollback")) {
                r = core::rollback(*registry, name, options);
            } else {
                core::ModelRef ref;
                ref.name = name;
                ref.version = version;
                r = core::deploy(*registry, ref, options);
            }
            out.version = r.deployment.version;
            out.previousVersion = r.previousVersion;
            out.url = QString::fromStdString(r.deployment.url);
            out.target = QString::fromStdString(r.deployment.target);
            out.started = r.started;
        } catch (const core::Error& e) {
            out.error = QString::fromUtf8(e.what());
        } catch (const std::exception& e) {
            out.error = QStringLiteral("unexpected error: %1").arg(QString::fromUtf8(e.what()));
        } catch (...) {
            out.error = QStringLiteral("unexpected error of unknown type");
        }
        if (!out.ok() && action == QLatin1String("deploy")) out.version = version;
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_outcome = out;
        }
        QMetaObject::invokeMethod(this, &DeploySession::onWorkerDone, Qt::QueuedConnection);
    });
    return true;
}

void DeploySession::onWorkerDone() {
    if (m_thread.joinable()) m_thread.join();
    DeployOutcome out;
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        out = m_outcome;
    }
    m_busy = false;
    Q_EMIT finished(out);
}

}  // namespace lathe::app
