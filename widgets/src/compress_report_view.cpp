#include "lathe/widgets/compress_report_view.h"

#include <QHeaderView>
#include <QLabel>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>

#include <algorithm>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

const QColor kParent(0x7f, 0x7f, 0x7f);
const QColor kChild(0x1f, 0x77, 0xb4);

QCustomPlot* makePlot(QWidget* parent, const QString& name) {
    auto* p = new QCustomPlot(parent);
    p->setObjectName(name);
    p->setMinimumSize(260, 160);
    // The legend in a row of its own under the axes, so that it never covers a bar.
    p->legend->setVisible(true);
    p->legend->setFont(QFont(p->font().family(), 8));
    p->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
    p->plotLayout()->addElement(1, 0, p->legend);
    p->plotLayout()->setRowStretchFactor(1, 0.001);
    p->xAxis->grid()->setVisible(false);
    p->xAxis->setTickLabelFont(QFont(p->font().family(), 8));
    return p;
}

QCPBars* makeBars(QCustomPlot* p, const QColor& c, const QString& name) {
    auto* b = new QCPBars(p->xAxis, p->yAxis);
    b->setName(name);
    b->setPen(QPen(c));
    b->setBrush(QColor(c.red(), c.green(), c.blue(), 170));
    b->setWidth(0.38);
    return b;
}

QString pct(double f) { return QString::number(f * 100, 'f', 2) + QLatin1Char('%'); }

}  // namespace

CompressReportView::CompressReportView(QWidget* parent) : QWidget(parent) {
    m_headline = new QLabel(this);
    m_headline->setObjectName(QStringLiteral("compressHeadline"));
    m_headline->setWordWrap(true);
    m_headline->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_summary = makePlot(this, QStringLiteral("compressSummaryPlot"));
    m_summary->setMinimumWidth(420);  // four two-line tick labels side by side
    m_classes = makePlot(this, QStringLiteral("compressClassPlot"));
    m_kept = makePlot(this, QStringLiteral("compressKeptPlot"));
    m_kept->setVisible(false);
    m_layers = new QTableWidget(this);
    m_layers->setObjectName(QStringLiteral("compressLayerTable"));
    m_layers->setColumnCount(4);
    m_layers->setHorizontalHeaderLabels({tr("Layer"), tr("In"), tr("Out (parent → kept)"), tr("Change")});
    m_layers->horizontalHeader()->setStretchLastSection(true);
    m_layers->verticalHeader()->setVisible(false);
    m_layers->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_layers->setSelectionBehavior(QAbstractItemView::SelectRows);

    auto* plots = new QSplitter(Qt::Horizontal, this);
    plots->addWidget(m_summary);
    plots->addWidget(m_classes);
    plots->addWidget(m_kept);
    plots->setChildrenCollapsible(false);
    auto* split = new QSplitter(Qt::Vertical, this);
    split->addWidget(plots);
    split->addWidget(m_layers);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 1);
    split->setChildrenCollapsible(false);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_headline);
    layout->addWidget(split, 1);
    clear();
}

QString CompressReportView::headline() const { return m_headline->text(); }

void CompressReportView::clear() {
    m_headline->setText(tr("No compression report"));
    m_kept->setVisible(false);
    for (auto* p : {m_summary, m_classes, m_kept}) {
        p->clearPlottables();
        p->replot();
    }
    m_layers->setRowCount(0);
}

void CompressReportView::setReport(const core::CompressReport& r, const QString& parentName,
                                   const QString& childName) {
    QString how = QString::fromStdString(r.method);
    if (r.settings.count("mode")) how += QLatin1Char(' ') + QString::fromStdString(r.settings.at("mode"));
    if (r.settings.count("observer"))
        how += tr(", %1 observer").arg(QString::fromStdString(r.settings.at("observer")));
    if (r.settings.count("target_sparsity"))
        how += tr(" %1 of the channels in %2 rounds")
                   .arg(QString::fromStdString(r.settings.at("target_sparsity")))
                   .arg(r.rounds.size());
    if (r.settings.count("student"))
        how += tr(" into %1").arg(QString::fromStdString(r.settings.at("student")));
    QString headline =
        tr("<b>%1</b> from <b>%2</b> (%3), measured on %4 (%5 samples): accuracy %6 → %7, "
           "size %8×, latency at batch 32 %9×")
            .arg(childName, parentName, how, QString::fromStdString(r.data))
            .arg(r.samples)
            .arg(pct(r.parentAccuracy), pct(r.accuracy))
            .arg(r.sizeBytes > 0 ? double(r.parentSizeBytes) / double(r.sizeBytes) : 0.0, 0, 'f', 2)
            .arg(r.latencyMsB32 > 0 ? r.parentLatencyMsB32 / r.latencyMsB32 : 0.0, 0, 'f', 2);
    if (r.parentParameters > 0 && r.parameters != r.parentParameters)
        headline += tr(", parameters %1 → %2").arg(r.parentParameters).arg(r.parameters);
    // Pruning rounds and the runs that trained it (the Runs page has their curves).
    QStringList rounds;
    for (const auto& round : r.rounds)
        rounds << tr("round %1 (run %2): %3 kept, %4")
                      .arg(round.round)
                      .arg(round.runId)
                      .arg(pct(round.kept))
                      .arg(pct(round.accuracy));
    if (!rounds.isEmpty()) {
        headline += QStringLiteral("<br>") + rounds.join(QStringLiteral("; "));
    } else if (!r.runs.empty()) {
        QStringList runs;
        for (auto id : r.runs) runs << QString::number(id);
        headline += tr("<br>trained in run %1").arg(runs.join(QStringLiteral(", ")));
    }
    m_headline->setText(headline);

    // Summary: each quantity relative to the parent (parent = 1), the real values on the ticks.
    m_summary->clearPlottables();
    auto* pb = makeBars(m_summary, kParent, parentName);
    auto* cb = makeBars(m_summary, kChild, childName);
    const double values[4][2] = {{r.parentAccuracy, r.accuracy},
                                 {double(r.parentSizeBytes), double(r.sizeBytes)},
                                 {r.parentLatencyMsB1, r.latencyMsB1},
                                 {r.parentLatencyMsB32, r.latencyMsB32}};
    auto num = [](double v, int decimals) { return QString::number(v, 'f', decimals); };
    const QString labels[4] = {
        tr("accuracy\n%1→%2%").arg(num(r.parentAccuracy * 100, 1), num(r.accuracy * 100, 1)),
        tr("size\n%1→%2 KiB")
            .arg(num(double(r.parentSizeBytes) / 1024, 0), num(double(r.sizeBytes) / 1024, 0)),
        tr("batch 1\n%1→%2 ms").arg(num(r.parentLatencyMsB1, 3), num(r.latencyMsB1, 3)),
        tr("batch 32\n%1→%2 ms").arg(num(r.parentLatencyMsB32, 2), num(r.latencyMsB32, 2))};
    auto ticker = QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText);
    double top = 1.0;
    for (int i = 0; i < 4; ++i) {
        const double parentValue = values[i][0];
        const double rel = parentValue > 0 ? values[i][1] / parentValue : 0;
        pb->addData(i + 1 - 0.2, parentValue > 0 ? 1.0 : 0.0);
        cb->addData(i + 1 + 0.2, rel);
        top = std::max(top, rel);
        ticker->addTick(i + 1, labels[i]);
    }
    m_summary->xAxis->setTicker(ticker);
    m_summary->xAxis->setRange(0.4, 4.6);
    m_summary->yAxis->setLabel(tr("relative to the parent (latency: lower is faster)"));
    m_summary->yAxis->setRange(0, top * 1.15);
    m_summary->replot();

    // Per class.
    m_classes->clearPlottables();
    auto* pc = makeBars(m_classes, kParent, parentName);
    auto* cc = makeBars(m_classes, kChild, childName);
    auto classTicker = QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText);
    const size_t n = std::min(r.perClassAccuracy.size(), r.parentPerClassAccuracy.size());
    for (size_t c = 0; c < n; ++c) {
        pc->addData(double(c) - 0.2, r.parentPerClassAccuracy[c] * 100);
        cc->addData(double(c) + 0.2, r.perClassAccuracy[c] * 100);
        classTicker->addTick(double(c), c < r.classNames.size() ? QString::fromStdString(r.classNames[c])
                                                                : QString::number(c));
    }
    m_classes->xAxis->setTicker(classTicker);
    m_classes->xAxis->setRange(-0.6, double(std::max<size_t>(n, 1)) - 0.4);
    m_classes->xAxis->setLabel(tr("class"));
    m_classes->yAxis->setLabel(tr("accuracy %"));
    double low = 100;
    for (size_t c = 0; c < n; ++c)
        low = std::min({low, r.perClassAccuracy[c] * 100, r.parentPerClassAccuracy[c] * 100});
    m_classes->yAxis->setRange(std::max(0.0, low - 10), 101);
    m_classes->replot();

    // Pruning: what each layer kept of the parent's neurons / channels.
    m_kept->clearPlottables();
    const bool pruned =
        std::any_of(r.layers.begin(), r.layers.end(), [](const core::CompressReport::Layer& l) {
            return l.parentOutFeatures > 0 && l.parentOutFeatures != l.outFeatures;
        });
    m_kept->setVisible(pruned);
    if (pruned) {
        auto* pk = makeBars(m_kept, kParent, parentName);
        auto* ck = makeBars(m_kept, kChild, tr("kept"));
        auto keptTicker = QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText);
        double most = 1;
        for (size_t i = 0; i < r.layers.size(); ++i) {
            const auto& l = r.layers[i];
            pk->addData(double(i) - 0.2, double(l.parentOutFeatures));
            ck->addData(double(i) + 0.2, double(l.outFeatures));
            most = std::max(most, double(l.parentOutFeatures));
            keptTicker->addTick(double(i), tr("%1\n%2/%3")
                                               .arg(QString::fromStdString(l.name))
                                               .arg(l.outFeatures)
                                               .arg(l.parentOutFeatures));
        }
        m_kept->xAxis->setTicker(keptTicker);
        m_kept->xAxis->setRange(-0.6, double(r.layers.size()) - 0.4);
        m_kept->yAxis->setLabel(tr("neurons / channels"));
        m_kept->yAxis->setRange(0, most * 1.15);
    }
    m_kept->replot();

    m_layers->setRowCount(static_cast<int>(r.layers.size()));
    for (int i = 0; i < static_cast<int>(r.layers.size()); ++i) {
        const auto& l = r.layers[static_cast<size_t>(i)];
        const QString out = l.parentOutFeatures == l.outFeatures
                                ? QString::number(l.outFeatures)
                                : tr("%1 → %2").arg(l.parentOutFeatures).arg(l.outFeatures);
        const QString cells[4] = {QString::fromStdString(l.name), QString::number(l.inFeatures), out,
                                  QString::fromStdString(l.change)};
        for (int c = 0; c < 4; ++c) m_layers->setItem(i, c, new QTableWidgetItem(cells[c]));
    }
    m_layers->resizeColumnsToContents();
}

}  // namespace lathe::widgets
