#include "lathe/widgets/compress_dialog.h"

#include <QComboBox>
#include <QCoreApplication>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMetaObject>
#include <QPointer>
#include <QProgressBar>
#include <QPushButton>
#include <QSpinBox>
#include <QVBoxLayout>

#include "lathe/widgets/compress_report_view.h"

namespace lathe::widgets {

CompressDialog::CompressDialog(const QString& model, int64_t version, Runner runner, QWidget* parent)
    : QDialog(parent), m_model(model), m_version(version), m_runner(std::move(runner)) {
    setWindowTitle(tr("Compress %1 v%2").arg(model).arg(version));
    setObjectName(QStringLiteral("compressDialog"));

    m_method = new QComboBox(this);
    m_method->setObjectName(QStringLiteral("compressMethod"));
    m_method->addItem(tr("Quantize: dynamic int8 (Linear layers, inputs per row at run time)"),
                      QStringLiteral("dynamic"));
    m_method->addItem(tr("Quantize: static int8 (Linear and Conv2d, calibrated input scales)"),
                      QStringLiteral("static"));
    m_method->addItem(tr("Quantize: quantization-aware training, then static int8 (a recorded run)"),
                      QStringLiteral("qat"));
    m_method->addItem(tr("Prune: remove the least important neurons / channels in rounds, fine-tuned"),
                      QStringLiteral("prune"));
    m_method->addItem(tr("Distill: train a smaller zoo network on this model's soft targets"),
                      QStringLiteral("distill"));
    m_observer = new QComboBox(this);
    m_observer->setObjectName(QStringLiteral("compressObserver"));
    m_observer->addItem(tr("histogram (99.99th percentile of |x|)"), QStringLiteral("histogram"));
    m_observer->addItem(tr("min/max"), QStringLiteral("minmax"));
    m_observer->addItem(tr("moving-average min/max"), QStringLiteral("moving-average"));
    m_calib = new QSpinBox(this);
    m_calib->setObjectName(QStringLiteral("compressCalibBatches"));
    m_calib->setRange(1, 100000);
    m_calib->setValue(32);
    m_calib->setSuffix(tr(" batches of 32"));
    m_data = new QLineEdit(this);
    m_data->setObjectName(QStringLiteral("compressData"));
    m_data->setPlaceholderText(tr("the data set the parent was trained on"));
    m_data->setToolTip(tr("digits, csv:PATH, idx:DIR … (needed for a version registered from a file)"));

    m_epochs = new QSpinBox(this);
    m_epochs->setObjectName(QStringLiteral("compressEpochs"));
    m_epochs->setRange(1, 100000);
    m_epochs->setValue(3);
    m_epochs->setToolTip(tr("QAT: fine-tuning epochs; prune: per round; distill: the student's training"));
    m_sparsity = new QDoubleSpinBox(this);
    m_sparsity->setObjectName(QStringLiteral("compressSparsity"));
    m_sparsity->setRange(0.05, 0.95);
    m_sparsity->setSingleStep(0.05);
    m_sparsity->setValue(0.5);
    m_sparsity->setToolTip(tr("Share of each hidden layer's neurons / channels to remove"));
    m_importance = new QComboBox(this);
    m_importance->setObjectName(QStringLiteral("compressImportance"));
    m_importance->addItem(tr("L1 norm of the weights"), QStringLiteral("l1"));
    m_importance->addItem(tr("Taylor (first-order loss change, on training batches)"),
                          QStringLiteral("taylor"));
    m_student = new QLineEdit(this);
    m_student->setObjectName(QStringLiteral("compressStudent"));
    m_student->setPlaceholderText(tr("mlp:64,64 or cnn:8,16:32, or a run config file"));
    m_temperature = new QDoubleSpinBox(this);
    m_temperature->setObjectName(QStringLiteral("compressTemperature"));
    m_temperature->setRange(0.1, 100);
    m_temperature->setValue(4);
    m_alpha = new QDoubleSpinBox(this);
    m_alpha->setObjectName(QStringLiteral("compressAlpha"));
    m_alpha->setRange(0, 1);
    m_alpha->setSingleStep(0.1);
    m_alpha->setValue(0.7);
    m_hints = new QComboBox(this);
    m_hints->setObjectName(QStringLiteral("compressHints"));
    m_hints->addItem(tr("none"), QStringLiteral("none"));
    m_hints->addItem(tr("last hidden block"), QStringLiteral("last"));
    m_hints->addItem(tr("all blocks (paired from the end)"), QStringLiteral("all"));

    auto* form = new QFormLayout;
    form->addRow(tr("&Method"), m_method);
    form->addRow(tr("&Observer"), m_observer);
    form->addRow(tr("&Calibration"), m_calib);
    form->addRow(tr("&Epochs"), m_epochs);
    form->addRow(tr("Target &sparsity"), m_sparsity);
    form->addRow(tr("&Importance"), m_importance);
    form->addRow(tr("S&tudent"), m_student);
    form->addRow(tr("Te&mperature"), m_temperature);
    form->addRow(tr("A&lpha (soft targets)"), m_alpha);
    form->addRow(tr("&Hints"), m_hints);
    form->addRow(tr("Measure on &data"), m_data);

    m_progress = new QProgressBar(this);
    m_progress->setObjectName(QStringLiteral("compressProgress"));
    m_progress->setRange(0, 1000);
    m_progress->setValue(0);
    m_progress->setTextVisible(true);
    m_progress->setFormat(tr("ready"));
    m_status = new QLabel(this);
    m_status->setObjectName(QStringLiteral("compressStatus"));
    m_status->setWordWrap(true);
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);

    m_report = new CompressReportView(this);
    m_report->setObjectName(QStringLiteral("compressReport"));
    m_report->setVisible(false);

    auto* buttons = new QDialogButtonBox(this);
    m_start = buttons->addButton(tr("&Compress"), QDialogButtonBox::AcceptRole);
    m_start->setObjectName(QStringLiteral("compressStart"));
    m_cancel = buttons->addButton(tr("C&ancel"), QDialogButtonBox::ActionRole);
    m_cancel->setObjectName(QStringLiteral("compressCancel"));
    m_close = buttons->addButton(QDialogButtonBox::Close);
    // The buttons act themselves: the box's accepted/rejected would close the dialog.
    disconnect(buttons, nullptr, this, nullptr);
    connect(m_start, &QPushButton::clicked, this, &CompressDialog::start);
    connect(m_cancel, &QPushButton::clicked, this, &CompressDialog::cancel);
    connect(m_close, &QPushButton::clicked, this, &CompressDialog::reject);
    connect(m_method, QOverload<int>::of(&QComboBox::currentIndexChanged), this, [this] {
        // Each training method's usual length.
        m_epochs->setValue(m_method->currentData().toString() == QLatin1String("distill") ? 20 : 3);
        updateForm();
    });

    auto* layout = new QVBoxLayout(this);
    layout->addLayout(form);
    layout->addWidget(m_progress);
    layout->addWidget(m_status);
    layout->addWidget(m_report, 1);
    layout->addWidget(buttons);
    resize(1180, 700);
    updateForm();
}

CompressDialog::~CompressDialog() {
    m_stop = true;
    join();
}

void CompressDialog::join() {
    if (m_worker.joinable()) m_worker.join();
}

CompressRequest CompressDialog::request() const {
    CompressRequest r;
    const std::string method = m_method->currentData().toString().toStdString();
    const std::string data = m_data->text().trimmed().toStdString();
    const std::string epochs = std::to_string(m_epochs->value());
    if (method == "prune" || method == "distill") {
        r.method = method;
    } else {
        r.quantize.mode = method;
        if (method == "qat") r.quantize.run["epochs"] = epochs;
    }
    r.quantize.observer = m_observer->currentData().toString().toStdString();
    r.quantize.calibBatches = m_calib->value();
    r.quantize.data = data;
    r.prune.targetSparsity = m_sparsity->value();
    r.prune.importance = m_importance->currentData().toString().toStdString();
    r.prune.finetuneEpochs = m_epochs->value();
    r.prune.data = data;
    r.distill.student = m_student->text().trimmed().toStdString();
    r.distill.temperature = m_temperature->value();
    r.distill.alpha = m_alpha->value();
    r.distill.hints = m_hints->currentData().toString().toStdString();
    r.distill.run["epochs"] = epochs;
    r.distill.data = data;
    return r;
}

QString CompressDialog::statusText() const { return m_status->text(); }

void CompressDialog::updateForm() {
    const QString method = m_method->currentData().toString();
    const bool isStatic = method == QLatin1String("static");
    const bool prune = method == QLatin1String("prune"), distill = method == QLatin1String("distill");
    const bool trains = prune || distill || method == QLatin1String("qat");
    m_method->setEnabled(!m_running);
    m_observer->setEnabled(!m_running && isStatic);
    m_calib->setEnabled(!m_running && isStatic);
    m_epochs->setEnabled(!m_running && trains);
    m_sparsity->setEnabled(!m_running && prune);
    m_importance->setEnabled(!m_running && prune);
    for (QWidget* w : {static_cast<QWidget*>(m_student), static_cast<QWidget*>(m_temperature),
                       static_cast<QWidget*>(m_alpha), static_cast<QWidget*>(m_hints)})
        w->setEnabled(!m_running && distill);
    m_data->setEnabled(!m_running);
    m_start->setEnabled(!m_running);
    m_cancel->setEnabled(m_running);
}

void CompressDialog::start() {
    if (m_running) return;
    join();  // the previous run's thread, already finished
    m_running = true;
    m_stop = false;
    m_closeWhenDone = false;
    m_status->setStyleSheet(QString());
    m_status->setText(tr("Compressing %1 v%2 …").arg(m_model).arg(m_version));
    m_progress->setValue(0);
    updateForm();
    const auto opts = request();
    QPointer<CompressDialog> self(this);
    m_worker = std::thread([this, self, opts] {
        core::CompressControl control;
        control.stop = &m_stop;
        control.progress = [self](const core::CompressProgress& p) {
            const auto phase = QString::fromStdString(p.phase);
            const double f = p.fraction;
            QMetaObject::invokeMethod(
                QCoreApplication::instance(),
                [self, phase, f] {
                    if (self) self->onProgress(phase, f);
                },
                Qt::QueuedConnection);
        };
        bool ok = false;
        QString message;
        core::CompressResult result;
        try {
            result = m_runner(opts, control);
            ok = true;
        } catch (const core::StoppedError&) {
            message = tr("Stopped: nothing was registered.");
        } catch (const std::exception& ex) {
            message = QString::fromUtf8(ex.what());
        }
        QMetaObject::invokeMethod(
            QCoreApplication::instance(),
            [self, ok, message, result] {
                if (self) self->onDone(ok, message, result);
            },
            Qt::QueuedConnection);
    });
}

void CompressDialog::cancel() {
    if (!m_running) return;
    m_stop = true;
    m_status->setText(tr("Stopping …"));
}

void CompressDialog::reject() {
    if (m_running) {
        m_closeWhenDone = true;
        cancel();
        return;  // closes once stopped (onDone)
    }
    QDialog::reject();
}

void CompressDialog::onProgress(const QString& phase, double fraction) {
    if (!m_running) return;
    m_progress->setValue(static_cast<int>(fraction * 1000));
    m_progress->setFormat(tr("%1 %p%").arg(phase));
}

void CompressDialog::onDone(bool ok, const QString& message, const core::CompressResult& result) {
    m_running = false;
    join();
    updateForm();
    if (!ok) {
        m_progress->setFormat(tr("not registered"));
        m_status->setStyleSheet(QStringLiteral("color: #b00020"));
        m_status->setText(message);
        Q_EMIT finishedRun(false);
        if (m_closeWhenDone) QDialog::reject();
        return;
    }
    m_progress->setValue(1000);
    m_progress->setFormat(tr("done"));
    const auto& v = result.version;
    m_status->setText(tr("Registered %1 v%2.").arg(QString::fromStdString(v.name)).arg(v.version));
    m_report->setReport(result.report, tr("%1 v%2").arg(m_model).arg(m_version),
                        tr("%1 v%2").arg(QString::fromStdString(v.name)).arg(v.version));
    m_report->setVisible(true);
    if (height() < 640) resize(std::max(width(), 900), 680);
    Q_EMIT compressed(QString::fromStdString(v.name), v.version);
    Q_EMIT finishedRun(true);
    if (m_closeWhenDone) QDialog::reject();  // asked to close while it was finishing
}

}  // namespace lathe::widgets
