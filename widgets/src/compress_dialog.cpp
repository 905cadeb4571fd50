#include "lathe/widgets/compress_dialog.h"

#include <QComboBox>
#include <QCoreApplication>
#include <QDialogButtonBox>
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

    auto* form = new QFormLayout;
    form->addRow(tr("&Method"), m_method);
    form->addRow(tr("&Observer"), m_observer);
    form->addRow(tr("&Calibration"), m_calib);
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
    connect(m_method, QOverload<int>::of(&QComboBox::currentIndexChanged), this, &CompressDialog::updateForm);

    auto* layout = new QVBoxLayout(this);
    layout->addLayout(form);
    layout->addWidget(m_progress);
    layout->addWidget(m_status);
    layout->addWidget(m_report, 1);
    layout->addWidget(buttons);
    resize(760, 300);
    updateForm();
}

CompressDialog::~CompressDialog() {
    m_stop = true;
    join();
}

void CompressDialog::join() {
    if (m_worker.joinable()) m_worker.join();
}

core::QuantizeOptions CompressDialog::options() const {
    core::QuantizeOptions o;
    o.mode = m_method->currentData().toString().toStdString();
    o.observer = m_observer->currentData().toString().toStdString();
    o.calibBatches = m_calib->value();
    o.data = m_data->text().trimmed().toStdString();
    return o;
}

QString CompressDialog::statusText() const { return m_status->text(); }

void CompressDialog::updateForm() {
    const bool isStatic = m_method->currentData().toString() == QLatin1String("static");
    m_method->setEnabled(!m_running);
    m_observer->setEnabled(!m_running && isStatic);
    m_calib->setEnabled(!m_running && isStatic);
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
    const auto opts = options();
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
