#include "lathe/widgets/chart_panel.h"

#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QMenu>
#include <QMessageBox>
#include <QMouseEvent>
#include <QTimer>
#include <QToolButton>
#include <QToolTip>
#include <QVBoxLayout>
#include <cmath>
#include <limits>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {
constexpr int kDefaultFlushMs = 40;
}  // namespace

ChartPanel::ChartPanel(const QString& titleHtml, bool withSummary, const QString& exportToolTip,
                       const QString& plotName, const QSize& plotMinimumSize, QWidget* parent)
    : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(0);

    auto* header = new QHBoxLayout;
    header->setContentsMargins(6, 2, 2, 0);
    m_titleLabel = new QLabel(titleHtml, this);
    header->addWidget(m_titleLabel);
    if (withSummary) {
        m_summary = new QLabel(this);
        m_summary->setStyleSheet(QStringLiteral("color: #606060;"));
        header->addSpacing(12);
        header->addWidget(m_summary, 1);
    } else {
        header->addStretch(1);
    }
    auto* fit = new QToolButton(this);
    fit->setText(tr("Fit"));
    fit->setToolTip(tr("Fit the axes to the data and follow new points (or double-click the chart)"));
    fit->setAutoRaise(true);
    auto* exportButton = new QToolButton(this);
    exportButton->setText(tr("Export…"));
    exportButton->setToolTip(exportToolTip);
    exportButton->setAutoRaise(true);
    header->addWidget(fit);
    header->addWidget(exportButton);
    layout->addLayout(header);

    m_plot = new QCustomPlot(this);
    m_plot->setObjectName(plotName);
    m_plot->setMinimumSize(plotMinimumSize);
    m_plot->setMouseTracking(true);
    m_plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    m_plot->setContextMenuPolicy(Qt::CustomContextMenu);
    layout->addWidget(m_plot, 1);

    m_flushTimer = new QTimer(this);
    m_flushTimer->setSingleShot(true);
    m_flushTimer->setInterval(kDefaultFlushMs);
    connect(m_flushTimer, &QTimer::timeout, this, &ChartPanel::flushStaged);
    connect(m_plot, &QCustomPlot::afterReplot, this, [this] { ++m_replotCount; });
    connect(m_plot, &QCustomPlot::mouseMove, this, &ChartPanel::onMouseMove);
    connect(m_plot, &QCustomPlot::mouseWheel, this, [this](QWheelEvent*) { m_follow = false; });
    connect(m_plot, &QCustomPlot::mouseDoubleClick, this, [this](QMouseEvent*) { rescale(); });
    connect(m_plot, &QWidget::customContextMenuRequested, this, [this](const QPoint& pos) {
        QMenu menu(this);
        menu.addAction(tr("Fit to data"), this, &ChartPanel::rescale);
        menu.addSeparator();
        menu.addAction(tr("Export PNG/PDF…"), this, &ChartPanel::exportDialog);
        menu.exec(m_plot->mapToGlobal(pos));
    });
    connect(fit, &QToolButton::clicked, this, &ChartPanel::rescale);
    connect(exportButton, &QToolButton::clicked, this, &ChartPanel::exportDialog);
}

ChartPanel::~ChartPanel() = default;

void ChartPanel::setFlushInterval(int ms) { m_flushTimer->setInterval(ms); }

void ChartPanel::onMouseMove(QMouseEvent* event) {
    if (event->buttons() != Qt::NoButton) {
        // Dragging pans the view: stop snapping back to the data on the next flush.
        m_follow = false;
        return;
    }
    hoverAt(event->position());
}

void ChartPanel::showHover(const QPointF& pos, const QString& text, QCPItemTracer* tracer) {
    if (!text.isEmpty()) {
        QToolTip::showText(m_plot->mapToGlobal(pos.toPoint()), text, m_plot);
    } else if (tracer->visible()) {
        tracer->setVisible(false);
        QToolTip::hideText();
    }
    if (text != m_hoverText) {
        m_hoverText = text;
        m_plot->replot(QCustomPlot::rpQueuedReplot);
    }
}

bool ChartPanel::savePng(const QString& path, int width, int height, double scale) {
    flushStaged();  // what the user sees after the next tick belongs in the file too
    return m_plot->savePng(path, width, height, scale);
}

bool ChartPanel::savePdf(const QString& path, int width, int height) {
    flushStaged();
    return m_plot->savePdf(path, width, height);
}

void ChartPanel::exportWithDialog(const QString& caption, const QString& defaultName) {
    QString selected;
    QString path = QFileDialog::getSaveFileName(this, caption, defaultName,
                                                tr("PNG image (*.png);;PDF document (*.pdf)"), &selected);
    if (path.isEmpty()) return;
    if (QFileInfo(path).suffix().isEmpty())
        path += selected.contains(QLatin1String("pdf")) ? QStringLiteral(".pdf") : QStringLiteral(".png");
    const bool pdf = QFileInfo(path).suffix().compare(QLatin1String("pdf"), Qt::CaseInsensitive) == 0;
    // 2x raster so the PNG stays sharp in slides and reports.
    const bool ok = pdf ? savePdf(path) : savePng(path, 0, 0, 2.0);
    if (!ok) QMessageBox::warning(this, tr("Export failed"), tr("Could not write %1.").arg(path));
}

double ChartPanel::nearestKey(const std::vector<QCPGraph*>& graphs, QCPAxis* x, double pixelX,
                              double radiusPx) {
    const double key = x->pixelToCoord(pixelX);
    double best = std::numeric_limits<double>::quiet_NaN();
    double bestDist = radiusPx;
    for (QCPGraph* g : graphs) {
        if (g->data()->isEmpty()) continue;
        // The points on either side of the cursor.
        auto it = g->data()->findBegin(key, false);
        for (auto c : {it, it == g->data()->constBegin() ? g->data()->constEnd() : it - 1}) {
            if (c == g->data()->constEnd()) continue;
            const double d = std::abs(x->coordToPixel(c->key) - pixelX);
            if (d <= bestDist) {
                bestDist = d;
                best = c->key;
            }
        }
    }
    return best;
}

void ChartPanel::styleLegend() {
    m_plot->legend->setVisible(true);
    QFont legendFont = font();
    legendFont.setPointSizeF(std::max(7.0, legendFont.pointSizeF() - 1.0));
    m_plot->legend->setFont(legendFont);
    m_plot->legend->setBrush(QColor(255, 255, 255, 215));
    m_plot->legend->setBorderPen(QPen(QColor(0xbb, 0xbb, 0xbb)));
}

std::vector<QCPAxisRect*> ChartPanel::stackStepRects(const std::vector<double>& stretches) {
    std::vector<QCPAxisRect*> rects{m_plot->axisRect()};
    for (size_t i = 1; i < stretches.size(); ++i) {
        rects.push_back(new QCPAxisRect(m_plot));
        m_plot->plotLayout()->addElement(static_cast<int>(i), 0, rects.back());
    }
    for (size_t i = 0; i < stretches.size(); ++i)
        m_plot->plotLayout()->setRowStretchFactor(static_cast<int>(i), stretches[i]);
    m_plot->plotLayout()->setRowSpacing(4);
    auto* margins = new QCPMarginGroup(m_plot);
    std::vector<QCPAxis*> steps;
    for (QCPAxisRect* r : rects) {
        r->setMarginGroup(QCP::msLeft | QCP::msRight, margins);
        // Drag and wheel act on the step axis only: the value axes are fitted.
        r->setRangeDrag(Qt::Horizontal);
        r->setRangeZoom(Qt::Horizontal);
        steps.push_back(r->axis(QCPAxis::atBottom));
        steps.back()->setTickLabels(false);
    }
    steps.back()->setTickLabels(true);
    steps.back()->setLabel(tr("step"));
    // Linked step axes: a change on any is copied to the others (setRange with an equal range
    // emits nothing, so this does not loop).
    for (QCPAxis* from : steps)
        for (QCPAxis* to : steps)
            if (from != to)
                connect(from, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), to,
                        qOverload<const QCPRange&>(&QCPAxis::setRange));
    return rects;
}

QCPItemText* ChartPanel::makeHint(QCPAxisRect* rect, const QColor& color, bool larger) {
    auto* hint = new QCPItemText(m_plot);
    hint->setClipAxisRect(rect);
    hint->position->setAxisRect(rect);
    hint->position->setType(QCPItemPosition::ptAxisRectRatio);
    hint->position->setCoords(0.5, 0.5);
    hint->setColor(color);
    if (larger) {
        QFont f = font();
        f.setPointSizeF(f.pointSizeF() + 1.0);
        hint->setFont(f);
    }
    hint->setClipToAxisRect(false);
    return hint;
}

}  // namespace lathe::widgets
