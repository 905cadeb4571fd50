#pragma once
// The deployment dashboard of one model: live latency percentiles, QPS, error rate, queue depth
// and mean batch with deployment markers and alert spans (ServingChart), the batch-size
// distribution of the last minute, and tables of the deployment history and the alerts.
//
// Everything comes from the workspace registry, polled about once a second on a worker thread:
// each poll reads only the points after the last one it has (per key), plus the model's
// deployments and alerts, and hands the result back by a queued call; a generation counter drops
// the answer of a poll that another model's selection has superseded.
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/registry.h"

class QCPBars;
class QCustomPlot;
class QLabel;
class QTableView;
class QTimer;

namespace lathe::widgets {

class AlertTableModel;
class DeploymentTableModel;
class ServingChart;

class ServingDashboard : public QWidget {
    Q_OBJECT
public:
    /// The fixed keys each poll reads (batch_hist/<le> keys are discovered per model).
    static const std::vector<std::string>& polledKeys();
    /// "1", "2", "3–4", ">16" for the bucket bounds "1", "2", "4", "+Inf" (with 16 before it).
    static std::vector<QString> batchBucketLabels(const std::vector<std::string>& bounds);

    explicit ServingDashboard(QWidget* parent = nullptr);
    /// Waits for a poll in flight.
    ~ServingDashboard() override;

    /// Shows one model (empty name: nothing) and starts polling it. The registry is shared with
    /// the poller, so it stays alive while a read is in flight.
    void showModel(std::shared_ptr<const core::Registry> registry, const QString& model);
    void clear() { showModel(nullptr, {}); }
    QString model() const { return m_model; }

    /// Polls now (or right after the poll in flight), visible or not.
    void pollNow();
    /// Polling interval; polls are skipped while the dashboard is hidden.
    void setPollInterval(int ms);
    /// How far back the first read of a model goes (default one day).
    void setHistorySeconds(double seconds) { m_historyS = seconds; }

    // For tests and the window.
    bool isPolling() const { return m_inFlight; }
    int pollCount() const { return m_pollCount; }
    /// The last value read of a key; NaN when none.
    double lastValue(const std::string& key) const;
    /// Batch counts per bucket summed over the last minute of data, in bucket order.
    std::vector<std::pair<QString, double>> batchHistogram() const;
    QString errorText() const { return m_error; }
    ServingChart* chart() const { return m_chart; }
    QCustomPlot* batchPlot() const { return m_batchPlot; }
    QCPBars* batchBars() const { return m_batchBars; }
    DeploymentTableModel* deploymentModel() const { return m_deployModel; }
    AlertTableModel* alertModel() const { return m_alertModel; }
    QTableView* deploymentTable() const { return m_deployTable; }
    QTableView* alertTable() const { return m_alertTable; }

Q_SIGNALS:
    /// After a poll was applied; `newPoints` counts the points it added (all keys).
    void polled(int newPoints);

protected:
    void showEvent(QShowEvent* event) override;

private:
    struct PollResult;
    void onTimer();
    void startPoll();
    void applyPoll(uint64_t generation, const std::shared_ptr<PollResult>& result);
    void updateBatchChart();
    void updateSummary();

    ServingChart* m_chart = nullptr;
    QCustomPlot* m_batchPlot = nullptr;
    QCPBars* m_batchBars = nullptr;
    QLabel* m_batchTitle = nullptr;
    DeploymentTableModel* m_deployModel = nullptr;
    AlertTableModel* m_alertModel = nullptr;
    QTableView* m_deployTable = nullptr;
    QTableView* m_alertTable = nullptr;
    QTimer* m_timer = nullptr;

    QThreadPool m_pool;
    std::atomic<uint64_t> m_generation{0};
    std::shared_ptr<const core::Registry> m_registry;
    QString m_model;
    double m_historyS = 24 * 3600.0;
    double m_historyStart = 0;
    bool m_inFlight = false;
    bool m_pollAgain = false;
    int m_pollCount = 0;
    int m_pollsSinceDiscovery = 0;
    QString m_error;

    std::map<std::string, double> m_since;                    // key -> t of the last point read
    std::map<std::string, std::pair<double, double>> m_last;  // key -> (t, value) of the last point
    std::vector<std::string> m_batchKeys;                     // batch_hist/<le>, as discovered
    std::map<std::string, std::deque<core::ServingPoint>> m_batchWindow;  // the last minute per bucket
    std::vector<core::Deployment> m_deployments;
};

}  // namespace lathe::widgets
