#pragma once
// The log of one run (the "Log" tab, a RunView over the first selected run): every log line, error
// and checkpoint the run recorded, time-stamped, warnings orange and errors red, following the
// live run as it writes them. For a run across hosts it also shows where each rank runs and how
// it ended, read from the launcher's own lines:
//   starting 4 ranks on gpu-a:2,gpu-b:2
//   host gpu-b (127.0.0.3): Linux x86_64, 2 cores, lathectl 0.1.0 at PATH; ranks 2..3
//   rank 3 (on gpu-b) exited with status 1: …; the other ranks were stopped
// The store's lines and the live ones are merged by (time, text), so a run selected while it
// trains shows each line once.
#include <QString>
#include <QWidget>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "lathe/widgets/run_view.h"

class QLabel;
class QPlainTextEdit;
class QTableWidget;

namespace lathe::widgets {

class LogView : public QWidget, public RunView {
    Q_OBJECT
public:
    /// One host of a run across hosts: "host NAME (ADDRESS): MACHINE; ranks FIRST..LAST".
    struct HostLine {
        QString host, address, machine;
        int firstRank = 0, lastRank = -1;
    };
    static std::optional<HostLine> parseHostLine(const QString& text);
    /// "rank 3 (on gpu-b) exited with status 1: …" → {3, "gpu-b", "exited with status 1"}.
    struct RankExit {
        int rank = -1;
        QString host, description;
    };
    static std::optional<RankExit> parseRankExit(const QString& text);
    /// "starting 4 ranks on gpu-a:2,gpu-b:2" → "gpu-a:2,gpu-b:2"; empty for any other line.
    static QString parsePlacement(const QString& text);

    explicit LogView(QWidget* parent = nullptr);
    ~LogView() override;

    QWidget* widget() override { return this; }
    QString tabTitle() const override;
    QString tabToolTip() const override;

    /// Shows one run's log from the store (runId 0: nothing), with its live lines received
    /// earlier merged in.
    void showRun(const core::Store& store, int64_t runId);
    void showRuns(const core::Store& store, const std::vector<int64_t>& runIds) override;
    void clear() override;
    void onEvents(int64_t runId, const std::vector<core::Event>& events) override;
    void forgetLive(int64_t runId) override;
    void onRunFinished(const core::Store& store, int64_t runId) override;

    int64_t runId() const { return m_runId; }
    int lineCount() const { return m_lineCount; }
    QString logText() const;
    /// "gpu-a:2,gpu-b:2" for a run across hosts; empty otherwise.
    QString placement() const { return m_placement; }
    /// The ranks of a run across hosts (0 for a run on this machine), and per rank its host
    /// and state ("running", "completed", "failed: exited with status 1", …).
    int rankCount() const;
    QString rankHost(int rank) const;
    QString rankState(int rank) const;
    QTableWidget* ranksTable() const { return m_ranks; }
    QPlainTextEdit* textView() const { return m_text; }

private:
    struct Line {
        double wallTime = 0;
        std::string level, text;
    };
    static std::optional<Line> lineOf(const core::Event& e);
    void resetShown();
    void append(const Line& line);
    void analyse(const Line& line);
    void updateRanks();

    QLabel* m_header = nullptr;
    QTableWidget* m_ranks = nullptr;
    QPlainTextEdit* m_text = nullptr;

    int64_t m_runId = 0;
    QString m_runStatus;  // of the shown run: "running", "completed", …
    int m_lineCount = 0;
    std::set<std::pair<double, std::string>> m_seen;  // (time, text) of the lines shown
    QString m_placement;
    std::vector<HostLine> m_hosts;
    std::map<int, QString> m_rankStates;  // ranks whose end a line described

    std::map<int64_t, std::vector<Line>> m_live;  // live lines of every run seen live
    std::map<int64_t, QString> m_liveStatus;
};

}  // namespace lathe::widgets
