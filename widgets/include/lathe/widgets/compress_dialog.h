#pragma once
// The Compress dialog of a model version: the method and its settings, a progress bar while it
// runs (on a thread of its own; Cancel stops it and nothing is registered), then the report of
// the new version against its parent (CompressReportView). The work itself is a Runner the
// application provides (it owns the workspace); the dialog only drives it.
#include <QDialog>

#include <atomic>
#include <functional>
#include <thread>

#include "lathe/core/compress.h"

class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QSpinBox;

namespace lathe::widgets {

class CompressReportView;

/// What the form asks for: a method and its options (only the method's own are used).
struct CompressRequest {
    std::string method = "quantize";  // quantize | prune | distill
    core::QuantizeOptions quantize;
    core::PruneOptions prune;
    core::DistillOptions distill;  // distill.teacher is left to the runner (the version the dialog is on)
};

class CompressDialog : public QDialog {
    Q_OBJECT
public:
    /// Runs on the dialog's worker thread; throws core::Error (shown) or core::StoppedError.
    using Runner = std::function<core::CompressResult(const CompressRequest&, const core::CompressControl&)>;

    CompressDialog(const QString& model, int64_t version, Runner runner, QWidget* parent = nullptr);
    /// Stops a compression in flight and waits for it.
    ~CompressDialog() override;

    /// The request the form describes now.
    CompressRequest request() const;
    bool isRunning() const { return m_running; }
    QString statusText() const;

    QComboBox* methodBox() const { return m_method; }
    QComboBox* observerBox() const { return m_observer; }
    QSpinBox* calibBatchesBox() const { return m_calib; }
    QLineEdit* dataEdit() const { return m_data; }
    QSpinBox* epochsBox() const { return m_epochs; }
    QDoubleSpinBox* sparsityBox() const { return m_sparsity; }
    QComboBox* importanceBox() const { return m_importance; }
    QLineEdit* studentEdit() const { return m_student; }
    QPushButton* startButton() const { return m_start; }
    QPushButton* cancelButton() const { return m_cancel; }
    QProgressBar* progressBar() const { return m_progress; }
    CompressReportView* reportView() const { return m_report; }

public Q_SLOTS:
    void start();
    void cancel();

Q_SIGNALS:
    /// A new version was registered.
    void compressed(const QString& model, qint64 version);
    /// The worker finished (registered, failed or stopped).
    void finishedRun(bool ok);

protected:
    void reject() override;  // Escape / the window's close: stops the run first

private:
    void updateForm();
    void onProgress(const QString& phase, double fraction);
    void onDone(bool ok, const QString& message, const core::CompressResult& result);
    void join();

    QString m_model;
    int64_t m_version = 0;
    Runner m_runner;
    QComboBox* m_method = nullptr;
    QComboBox* m_observer = nullptr;
    QSpinBox* m_calib = nullptr;
    QLineEdit* m_data = nullptr;
    QSpinBox* m_epochs = nullptr;
    QDoubleSpinBox* m_sparsity = nullptr;
    QComboBox* m_importance = nullptr;
    QLineEdit* m_student = nullptr;
    QDoubleSpinBox* m_temperature = nullptr;
    QDoubleSpinBox* m_alpha = nullptr;
    QComboBox* m_hints = nullptr;
    QProgressBar* m_progress = nullptr;
    QLabel* m_status = nullptr;
    QPushButton* m_start = nullptr;
    QPushButton* m_cancel = nullptr;
    QPushButton* m_close = nullptr;
    CompressReportView* m_report = nullptr;
    std::thread m_worker;
    std::atomic<bool> m_stop{false};
    bool m_running = false;
    bool m_closeWhenDone = false;  // Close / Escape while running: close once it has stopped
};

}  // namespace lathe::widgets
