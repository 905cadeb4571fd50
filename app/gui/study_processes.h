#pragma once
// The studies this window runs: one `lathectl tune` process each (QProcess), started from the New
// Study dialog or to resume a study. A study is a tree of processes (tune and its trials), so it
// runs outside the GUI's process as it does from a terminal, and the window only starts, watches
// and stops it. Stop sends tune SIGINT, as Ctrl+C: the running trials stop with their runs and
// `--resume` (Resume on the Studies page) continues the study. Closing the window stops them the
// same way.
#include <QObject>
#include <QString>
#include <QStringList>

#include <map>
#include <memory>

class QProcess;
class QTemporaryFile;

namespace lathe::app {

class StudyProcesses : public QObject {
    Q_OBJECT
public:
    /// `lathectl`: the program to run (default: the lathectl beside this executable).
    explicit StudyProcesses(QString lathectl = {}, QObject* parent = nullptr);
    /// Stops every study still running (SIGINT) and waits for each to record it.
    ~StudyProcesses() override;

    /// Starts a new study: `lathectl tune CONFIG ARGS --db WORKSPACE --json -q`, CONFIG being the
    /// base run's TOML (kept in a temporary file until tune has read it). Returns what went
    /// wrong, or an empty string once the process is running.
    QString startNew(const QString& name, const QString& baseToml, const QStringList& args,
                     const QString& workspace);
    /// `lathectl tune --resume NAME --db WORKSPACE --json -q`.
    QString resume(const QString& name, const QString& workspace);
    /// SIGINT to the study's tune process; false when this window does not run it.
    bool stop(const QString& name);
    /// The studies of WORKSPACE running from here.
    QStringList running(const QString& workspace) const;
    bool isRunning(const QString& name) const { return m_procs.count(name) > 0; }
    /// Stops them all and waits (at most `msecs` each).
    void stopAll(int msecs = 60000);

Q_SIGNALS:
    /// A study started or ended.
    void changed();
    /// Study NAME's process ended: exit status 0 (done), 130 (stopped: resumable) or another
    /// (failed; `error` is the end of what it wrote to stderr).
    void finished(const QString& name, int exitCode, const QString& error);

private:
    struct Proc {
        QProcess* process = nullptr;
        std::unique_ptr<QTemporaryFile> config;
        QString workspace;
        QString stderrTail;
    };
    QString launch(const QString& name, const QStringList& args, const QString& workspace,
                   std::unique_ptr<QTemporaryFile> config);

    QString m_program;
    std::map<QString, Proc> m_procs;
};

}  // namespace lathe::app
