#pragma once
// The A/B dashboard of one model's rollout (its running one, else its last), on the Models page:
// both variants' P50/P90/P99 latency, QPS and error rate side by side on one time axis (baseline
// solid, candidate dashed), the candidate's weight as a step line, each decision as a marker
// with its reason, the current verdict with its numbers, and every decision in a table.
// Start…, Pause, Resume and Abort act on it, each confirmed in words that say what will change.
//
// Everything comes from the workspace (core::Registry: the rollout record, its decisions, the
// scraper's variant/* series), read about once a second on a worker thread, only the points
// after the last one read per key; the actions run on a worker thread too (a start loads the
// candidate into the server, seconds) and report back through actionFinished().
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/deploy.h"
#include "lathe/core/registry.h"

class QCPAxisRect;
class QCPGraph;
class QCustomPlot;
class QLabel;
class QPushButton;
class QTableWidget;
class QTimer;

namespace lathe::widgets {

class RolloutView : public QWidget {
    Q_OBJECT
public:
    /// Asked before an action; true goes ahead. The default shows a question box.
    using ConfirmHook = std::function<bool(const QString& title, const QString& question)>;
    /// The series of each variant, in the plot's order.
    enum Series { P50 = 0, P90, P99, Qps, ErrorRate, kSeriesCount };
    /// The workspace keys they are read from (stored per version by the scraper).
    static const std::vector<std::string>& seriesKeys();

    explicit RolloutView(QWidget* parent = nullptr);
    /// Waits for a read or an action in flight.
    ~RolloutView() override;

    /// Shows `model`'s rollout (empty: nothing) and polls it.
    void showModel(std::shared_ptr<const core::Registry> registry, const QString& model);
    QString model() const { return m_model; }
    void pollNow();
    void setPollInterval(int ms);
    void setConfirmHook(ConfirmHook hook) { m_confirm = std::move(hook); }
    /// The lathectl that runs the detached controller (the GUI is not lathectl).
    void setControllerProgram(const QString& path) { m_controller = path; }
    /// Reaches hosts of the workspace, for a deployment that runs on one.
    void setServerHosts(core::ServerHostFor hosts) { m_hosts = std::move(hosts); }

    // ---- state, for the window and tests ----
    const std::optional<core::Rollout>& rollout() const { return m_rollout; }
    const std::vector<core::RolloutDecision>& decisions() const { return m_decisions; }
    int pollCount() const { return m_pollCount; }
    bool isBusy() const { return m_busy; }
    QString headerText() const;
    QString verdictText() const;
    QCustomPlot* plot() const { return m_plot; }
    /// A variant's graph of one series (candidate: the dashed one).
    QCPGraph* graph(bool candidate, Series s) const;
    QCPGraph* weightGraph() const { return m_weight; }
    int markerCount() const { return m_markers; }
    QTableWidget* decisionTable() const { return m_table; }
    QPushButton* startButton() const { return m_start; }
    QPushButton* pauseButton() const { return m_pause; }
    QPushButton* resumeButton() const { return m_resume; }
    QPushButton* abortButton() const { return m_abort; }

    /// The confirmation texts (what will change, in words).
    QString startQuestion(const core::Rollout& plan) const;
    QString pauseQuestion() const;
    QString resumeQuestion() const;
    QString abortQuestion() const;

public Q_SLOTS:
    /// Start…: a dialog for the plan, then the confirmation, then the start in the background.
    void requestStart();
    /// Confirms and starts `plan` (model, candidate and the plan's settings) in the background;
    /// false when refused (busy, no live version, not confirmed).
    bool startRollout(const core::Rollout& plan);
    void requestPause();
    void requestResume();
    void requestAbort();

Q_SIGNALS:
    /// After a read was applied.
    void polled();
    /// An action ended; `error` empty when it succeeded.
    void actionFinished(const QString& action, const QString& error);

private:
    struct ReadResult;
    void startPoll();
    void applyPoll(uint64_t generation, const std::shared_ptr<ReadResult>& r);
    void resetData();
    void redrawMarkers();
    void updateButtons();
    void updateTexts();
    bool confirm(const QString& title, const QString& question);
    void runAction(const QString& action, std::function<void(core::Registry&)> work);

    QLabel* m_header = nullptr;
    QLabel* m_verdict = nullptr;
    QPushButton* m_start = nullptr;
    QPushButton* m_pause = nullptr;
    QPushButton* m_resume = nullptr;
    QPushButton* m_abort = nullptr;
    QCustomPlot* m_plot = nullptr;
    std::vector<QCPAxisRect*> m_rects;
    QCPGraph* m_graphs[2][kSeriesCount] = {};
    QCPGraph* m_weight = nullptr;
    QTableWidget* m_table = nullptr;
    QTimer* m_timer = nullptr;
    ConfirmHook m_confirm;
    QString m_controller;
    core::ServerHostFor m_hosts;

    QThreadPool m_pool;     // reads
    QThreadPool m_actions;  // actions
    std::atomic<uint64_t> m_generation{0};
    std::shared_ptr<const core::Registry> m_registry;
    QString m_model;
    bool m_inFlight = false;
    bool m_busy = false;
    bool m_controllerRunning = false;
    int m_pollCount = 0;
    int m_markers = 0;

    std::optional<core::Rollout> m_rollout;
    std::optional<core::Deployment> m_live;
    std::vector<int64_t> m_versions;
    std::vector<core::RolloutDecision> m_decisions;
    std::map<std::string, double> m_since;  // key -> t of the last point read
};

}  // namespace lathe::widgets
