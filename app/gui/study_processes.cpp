#include "study_processes.h"

#include <signal.h>

#include <QProcess>
#include <QTemporaryFile>

#include "lathe/core/executable.h"

namespace lathe::app {

StudyProcesses::StudyProcesses(QString lathectl, QObject* parent)
    : QObject(parent),
      m_program(lathectl.isEmpty() ? QString::fromStdString(core::siblingProgram("lathectl")) : lathectl) {}

StudyProcesses::~StudyProcesses() {
    // The window going away must hear nothing more.
    disconnect(this, nullptr, nullptr, nullptr);
    stopAll();
}

QString StudyProcesses::startNew(const QString& name, const QString& baseToml, const QStringList& args,
                                 const QString& workspace) {
    if (m_procs.count(name)) return tr("study %1 is running already").arg(name);
    auto config = std::make_unique<QTemporaryFile>(QStringLiteral("lathe-study-XXXXXX.toml"));
    if (!config->open() || config->write(baseToml.toUtf8()) < 0 || !config->flush())
        return tr("cannot write the study's base configuration: %1").arg(config->errorString());
    QStringList all{QStringLiteral("tune"), config->fileName()};
    all << args;
    return launch(name, all, workspace, std::move(config));
}

QString StudyProcesses::resume(const QString& name, const QString& workspace) {
    if (m_procs.count(name)) return tr("study %1 is running already").arg(name);
    return launch(name, {QStringLiteral("tune"), QStringLiteral("--resume"), name}, workspace, nullptr);
}

QString StudyProcesses::launch(const QString& name, const QStringList& args, const QString& workspace,
                               std::unique_ptr<QTemporaryFile> config) {
    auto* process = new QProcess(this);
    process->setProgram(m_program);
    QStringList all = args;
    all << QStringLiteral("--db") << workspace << QStringLiteral("--json") << QStringLiteral("-q");
    process->setArguments(all);
    process->setProcessChannelMode(QProcess::SeparateChannels);
    process->setStandardOutputFile(QProcess::nullDevice());  // the study's record is the workspace
    Proc& p = m_procs[name];
    p.process = process;
    p.config = std::move(config);
    p.workspace = workspace;
    connect(process, &QProcess::readyReadStandardError, this, [this, name] {
        auto it = m_procs.find(name);
        if (it == m_procs.end()) return;
        it->second.stderrTail += QString::fromUtf8(it->second.process->readAllStandardError());
        if (it->second.stderrTail.size() > 4000) it->second.stderrTail = it->second.stderrTail.right(4000);
    });
    connect(process, &QProcess::finished, this, [this, name](int code, QProcess::ExitStatus status) {
        auto it = m_procs.find(name);
        if (it == m_procs.end()) return;
        it->second.stderrTail += QString::fromUtf8(it->second.process->readAllStandardError());
        const QString error = it->second.stderrTail.trimmed();
        it->second.process->deleteLater();
        m_procs.erase(it);
        Q_EMIT finished(name, status == QProcess::CrashExit ? -1 : code, error);
        Q_EMIT changed();
    });
    process->start();
    if (!process->waitForStarted(10000)) {
        const QString why = process->errorString();
        m_procs.erase(name);
        process->deleteLater();
        return tr("cannot start %1: %2").arg(m_program, why);
    }
    Q_EMIT changed();
    return {};
}

bool StudyProcesses::stop(const QString& name) {
    const auto it = m_procs.find(name);
    if (it == m_procs.end()) return false;
    const qint64 pid = it->second.process->processId();
    return pid > 0 && ::kill(static_cast<pid_t>(pid), SIGINT) == 0;
}

QStringList StudyProcesses::running(const QString& workspace) const {
    QStringList out;
    for (const auto& [name, p] : m_procs)
        if (p.workspace == workspace) out << name;
    return out;
}

void StudyProcesses::stopAll(int msecs) {
    std::vector<QString> names;
    for (const auto& [name, p] : m_procs) names.push_back(name);
    for (const auto& name : names) stop(name);
    for (const auto& name : names) {
        const auto it = m_procs.find(name);
        if (it == m_procs.end()) continue;
        QProcess* process = it->second.process;
        if (!process->waitForFinished(msecs)) process->kill();
    }
}

}  // namespace lathe::app
